"""The tasks bench/admission.py enqueues (registered through bench/admission_settings.py)."""

from django.tasks import task

from backwave.tasking.task import Unique


@task(queue_name="bench", unique=Unique(by=("n",)))
def unique_noop(n):
    return n


@task(queue_name="bench-keyed", limit_by="customer")
def keyed_noop(customer, n):
    return n
