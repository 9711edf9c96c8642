"""Tasks whose admission keys derive from a sensitive argument (tests/console/test_redaction_surfaces.py)."""

from django.tasks import task

from backwave.tasking.task import Unique


@task(unique=Unique(by=("order_id", "api_token")), limit_by="api_token")
def call_vendor(order_id, api_token):
    return order_id
