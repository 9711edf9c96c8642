"""What an operator reads of a job's attempts, shared by the job page and ``manage.py backwave_jobs show``."""

from __future__ import annotations

import json

from ..models import Attempt
from . import tracebacks
from .redaction import redact


def seconds_shown(seconds):
    """0.00042 -> '0.42 ms', 1.5 -> '1.500 s'."""
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.2f} ms" if seconds < 1 else f"{seconds:.3f} s"


def attempt_row(attempt: Attempt) -> dict:
    """What the attempts table shows of one attempt: when it really ran, its error message, its
    traceback with the machinery's frames folded, its return value with secrets hidden."""
    lapsed = attempt.state == "lapsed"
    ran_until = attempt.lease_renewed_at if lapsed and attempt.lease_renewed_at else attempt.finished_at
    duration = None
    if attempt.started_at and ran_until:
        duration = max((ran_until - attempt.started_at).total_seconds(), 0.0)
    rendered = tracebacks.render(attempt.traceback) if attempt.traceback else None
    return {
        "attempt": attempt,
        "lapsed": lapsed,
        "ran_until": ran_until,
        "duration": duration,
        "duration_shown": ("≥ " if lapsed else "") + seconds_shown(duration) if duration is not None else "-",
        "error_message": tracebacks.error_message(attempt.error_class, attempt.traceback) if attempt.error_class else "",
        "traceback_html": rendered.html if rendered else "",
        "hidden_frames": rendered.hidden_frames if rendered else 0,
        "return_value": json.dumps(redact(attempt.return_value), ensure_ascii=False) if attempt.state == "succeeded" else None,
    }
