"""The demo: a form that enqueues N jobs in one transaction, and a page that watches them run."""

from django.db import transaction
from django.db.models import Count, Max, Min
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from backwave.models import FINISHED_STATES, Job, JobState

from . import tasks
from .forms import EnqueueForm
from .runs import ids_from_token, run_token

# kind -> (task, the (args, kwargs) of the i-th job of a run)
JOB_KINDS = {
    "fast": (tasks.fast_job, lambda i: ((i,), {})),
    "slow": (tasks.slow_job, lambda i: ((1,), {})),
    "failing": (tasks.failing_job, lambda i: ((f"demo failure #{i}",), {})),
    "emails": (tasks.email_job, lambda i: ((), {})),
    "reports": (tasks.report_job, lambda i: ((), {})),
}
ROWS_SHOWN = 200


def enqueue_all(task, calls):
    """Enqueue one job per (args, kwargs) in ``calls``; returns the job ids.

    One INSERT through the backend's bulk API when it has one, else one enqueue per job. Either
    way the caller's transaction holds every row: all of them commit, or none.
    """
    enqueue_many = getattr(task.get_backend(), "enqueue_many", None)
    if enqueue_many is not None:
        results = enqueue_many([(task, args, kwargs) for args, kwargs in calls])
    else:
        results = [task.enqueue(*args, **kwargs) for args, kwargs in calls]
    return [int(result.id) for result in results]


@require_http_methods(["GET", "POST"])
def home(request):
    if request.method == "POST":
        form = EnqueueForm(request.POST)
        if not form.is_valid():
            return render(request, "demo/home.html", {"form": form}, status=400)
        task, job_arguments = JOB_KINDS[form.cleaned_data["kind"]]
        calls = [job_arguments(i) for i in range(1, form.cleaned_data["count"] + 1)]
        with transaction.atomic():
            ids = enqueue_all(task, calls)
        return redirect("demo:run", token=run_token(ids))
    return render(request, "demo/home.html", {"form": EnqueueForm()})


@require_GET
def run(request, token):
    try:
        ids = ids_from_token(token)
    except ValueError:
        raise Http404("No such run.")
    batch = Job.objects.filter(id__in=ids)
    counts = dict(batch.values_list("state").annotate(n=Count("id")).order_by())
    times = batch.aggregate(first_enqueued=Min("enqueued_at"), last_finished=Max("finished_at"))
    unfinished = sum(n for state, n in counts.items() if state not in FINISHED_STATES)
    elapsed = None
    if not unfinished and times["first_enqueued"] and times["last_finished"]:
        elapsed = (times["last_finished"] - times["first_enqueued"]).total_seconds()
    admin_root = reverse("admin:index")
    jobs = [
        {"job": job, "admin_url": f"{admin_root}backwave/job/{job.pk}/change/", "name": job.task_path.rsplit(".", 1)[-1]}
        for job in batch.order_by("id")[:ROWS_SHOWN]
    ]
    return render(
        request,
        "demo/run.html",
        {
            "total": len(ids),
            "found": sum(counts.values()),
            "states": [(value, label, counts.get(value, 0)) for value, label in JobState.choices],
            "finished": not unfinished,
            "elapsed": elapsed,
            "jobs": jobs,
        },
    )
