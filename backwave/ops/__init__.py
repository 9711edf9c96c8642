"""What operators and code do to jobs and queues, written once for every surface.

The admin's pages, the management commands and the public facade (``backwave.cancel()``) all
act and read through this package: the operator actions (``actions``: retry, cancel, purge,
pause, resume, limit, schedules on and off), the admin history they leave (``history``, only
where ``django.contrib.admin`` is installed), bounded statistics (``stats``), the jobs search
(``search``), redaction of what derives from a job's arguments (``redaction``), plain
formatters (``tracebacks``, ``formatting``) and the cluster's metrics view (``metrics``).

It is Django-aware, and it never imports ``backwave.admin``, ``backwave.shell`` or the
management commands: a project without the admin uses all of it.
"""
