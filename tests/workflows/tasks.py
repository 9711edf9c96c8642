"""Tasks of the workflow tests: they record what they saw of their ancestors, through their context."""

from django.tasks import task

from backwave.models import Job


@task(takes_context=True)
def source(context, name, value):
    """A root: records its value as output and returns it."""
    context.output("value", value)
    context.output("name", name)
    context.tag(f"source-{name}")
    return value


@task(takes_context=True)
def combine(context, name):
    """Sums what its ancestors recorded; fails if any ancestor has not succeeded (the invariant)."""
    ancestors = context.ancestors
    assert all(a.state == "succeeded" for a in ancestors), [(a.job_id, a.state) for a in ancestors]
    total = sum(a.output["value"] for a in ancestors)
    context.output("value", total)
    context.output("seen", sorted(a.output["name"] for a in ancestors))
    context.output("name", name)
    return total


@task(takes_context=True, max_attempts=1)
def records_then_raises(context):
    context.output("progress", {"rows": 41})
    context.tag("partial", "needs-review")
    context.untag("initial")
    raise RuntimeError("gave up after 41 rows")


@task(max_attempts=1)
def fails():
    raise ValueError("this ancestor fails")


@task
def noop(n=0):
    return n


@task(takes_context=True)
def counts_running_ancestors(context):
    """The fan-in: how many of its ancestors are not succeeded when it runs (must be 0)."""
    return Job.objects.filter(dependent_links__job_id=context.job_id).exclude(state="succeeded").count()


@task(takes_context=True)
async def async_reader(context):
    """An async task reads its ancestors through aancestors() and records output."""
    ancestors = await context.aancestors()
    context.output("seen", [a.output.get("name") for a in ancestors])
    return len(ancestors)


@task(takes_context=True, max_attempts=1)
def snoozes_then_records(context):
    """Attempt 1 records an output and snoozes (no failure); attempt 2 records and returns."""
    import backwave

    context.output("value", context.attempt)
    context.output("name", "snoozer")
    if context.attempt == 1:
        raise backwave.Snooze(0)
    return context.attempt


@task(max_attempts=5)
def discards():
    import backwave

    raise backwave.Discard("nothing left to do")
