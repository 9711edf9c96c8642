"""The demo: a form that enqueues N jobs in one transaction, and a page that watches them run."""

import json
from datetime import timedelta
from pathlib import Path

from django.db import transaction
from django.db.models import Count, Max, Min
from django.http import FileResponse, Http404
from django.utils import timezone
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from backwave.models import FINISHED_STATES, Attempt, Job, JobState, Pump, PumpStatus, Queue

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
FAVICON = Path(__file__).resolve().parent / "static" / "demo" / "favicon.ico"


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
    shown = list(batch.order_by("id")[:ROWS_SHOWN])
    errors = last_errors([job.pk for job in shown if job.attempts])
    jobs = [
        {
            "job": job,
            "admin_url": f"{admin_root}backwave/job/{job.pk}/change/",
            "name": job.task_path.rsplit(".", 1)[-1],
            "result": json.dumps(job.return_value) if job.state == JobState.SUCCEEDED else None,
            "error": errors.get(job.pk, "") if job.state != JobState.SUCCEEDED else "",
        }
        for job in shown
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
            "waiting": why_jobs_wait(batch) if unfinished else [],
        },
    )


def why_jobs_wait(batch):
    """Why the run's unfinished jobs are not moving, in the operator's words: a page that only
    keeps refreshing looks the same whether the worker is busy, paused out or not running."""
    reasons = []
    paused = set(Queue.objects.filter(paused=True).values_list("name", flat=True))
    waiting_by_queue = dict(batch.filter(state=JobState.READY).values_list("queue").annotate(n=Count("id")).order_by())
    for queue in sorted(paused & waiting_by_queue.keys()):
        reasons.append({"kind": "paused", "queue": queue, "count": waiting_by_queue[queue]})
    if not any(live_pumps()):
        reasons.append({"kind": "no-worker"})
    return reasons


def live_pumps():
    """Pumps that are not halted and whose heartbeat is within their lease: someone is claiming."""
    now = timezone.now()
    for pump in Pump.objects.exclude(status=PumpStatus.HALTED).only("lease_duration", "last_heartbeat_at"):
        if pump.last_heartbeat_at + timedelta(seconds=pump.lease_duration) >= now:
            yield pump


def last_errors(job_ids):
    """job id -> its latest attempt's error, as the exception's last line says it."""
    latest = (
        Attempt.objects.filter(job_id__in=job_ids)
        .exclude(error_class="")
        .order_by("job_id", "-number")
        .distinct("job_id")
        .only("job_id", "error_class", "traceback")
    )
    return {attempt.job_id: error_line(attempt) for attempt in latest}


def error_line(attempt):
    lines = [line for line in attempt.traceback.splitlines() if line.strip()]
    return lines[-1] if lines else attempt.error_class


@require_GET
def favicon(request):
    # Browsers ask for /favicon.ico on every page (the admin's too) whatever the page links.
    response = FileResponse(FAVICON.open("rb"), content_type="image/x-icon")
    response["Cache-Control"] = "public, max-age=86400"
    return response
