"""The operator's view: jobs, queues, pumps and schedules in the Django admin.

One module per page (``jobs``, ``queues``, ``pumps``, ``schedules``, ``transitions``, ``taskstats``; the
dashboard on the app's index page is ``dashboard``, drawn with ``charts``) and what they share in
``common``. The pages only draw: the bounded counts and estimates, the operator's writes, the
history, search and redaction are ``backwave.ops``'s, which the commands and the public API use
too, and nothing outside this package and its template tags imports it (so a project without
``django.contrib.admin`` never loads it). Importing this package registers the pages (Django's
admin autodiscovery does).

Every page is read-only to the admin's ordinary change form: rows belong to the engine, so the
only writes are the actions, each guarded by its own permission (``@admin.action(permissions=)``
plus a ``has_<name>_permission`` method and a custom model permission), and each one conditional
statement (``backwave.ops.actions``). A staff user with view permissions only sees everything and can do
nothing.

Page cost is bounded however large the job table grows: no page counts the whole table (see
``stats``), and tests pin the number of queries of each page. The admin reads and writes through
the store's SQL and the models; it imports nothing from ``backwave.shell``. With several
databases in use, every page and action reads and writes the one chosen with the switch at the
top of each page (``databases``).
"""

from . import jobs, pumps, queues, schedules, taskstats, transitions  # noqa: F401  (registers the pages)
