"""BackWave's ``django.tasks`` integration, the Django side of a job's life.

``backend`` (enqueue on Django's connection, get_result), ``task`` (BackWaveTask, its option
validators, ``enqueue_many``), ``payload`` (the JSON codec), ``results`` (TaskResult from rows)
and ``registry`` (wire name -> Task, what a worker may run). It may import ``backwave.store``,
``backwave.core`` and the settings (``backwave.conf``), never ``backwave.shell``.

Not named ``tasks``: a worker imports every installed app's ``tasks`` module to discover the
project's tasks, and would import this package as if it held some.
"""
