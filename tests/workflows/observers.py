"""An observer of cancellations for the workflow tests (handed to the pump with observers=): it
writes down what it saw in SEEN."""

from backwave.observers import observe

SEEN: list[tuple[int, int, str, int]] = []  # (job id, attempt, kind, delivery)


@observe("cancelled")
def on_cancel(transition):
    SEEN.append((transition.job_id, transition.attempt, transition.kind, transition.delivery))
