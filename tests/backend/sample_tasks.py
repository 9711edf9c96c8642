"""Module-level tasks for the backend tests (the backend only accepts module-level functions)."""

from django.tasks import task


@task
def add(a, b):
    return a + b


@task(queue_name="emails", priority=10)
def send_email(to, subject="", body=""):
    return f"sent to {to}"


@task(max_attempts=5, backoff_base=2.0, backoff_max=60.0, tags=["billing", "nightly"])
def charge(invoice_id):
    return {"invoice": invoice_id}


@task(takes_context=True)
def with_context(context, value):
    return context.attempt


def not_a_task(a):
    return a


async def async_function(a):
    return a


def undecorated(a, b):
    """Decorated inside tests, to check validation at decoration time."""
    return a + b


def needs_context_but_has_none(value):
    return value


# Admission: unique jobs and per-key limits (tests/backend/test_unique_jobs.py).
from backwave.tasking.task import Unique  # noqa: E402


@task(unique=Unique(by=("order_id",)))
def sync_order(order_id, note=""):
    return order_id


@task(unique=Unique.debounce(by=("document_id",)))
def reindex(document_id, text=""):
    return document_id


@task(unique=Unique(period=3600, states=("ready", "running", "succeeded")))
def hourly_digest(user_id):
    return user_id


@task(limit_by="customer_id")
def call_api(customer_id, n=0):
    return n


# Tasks that take a context: the context is BackWave's, never an argument of the call, so a key
# is made of the call's arguments alone (tests/backend/test_unique_jobs.py).
@task(takes_context=True, unique=Unique(by=("order_id",)))
def sync_order_with_context(context, order_id):
    return order_id


@task(takes_context=True, unique=Unique(by=("order_id",)))
def sync_order_with_context_default(context, order_id=0):
    return order_id


@task(takes_context=True, unique=Unique())
def sync_everything_with_context(context, order_id, note=""):
    return order_id


@task(takes_context=True, limit_by="customer_id")
def call_api_with_context(context, customer_id="anyone"):
    return customer_id


@task(takes_context=True)
def with_context_and_kwargs(context, **kwargs):
    return kwargs
