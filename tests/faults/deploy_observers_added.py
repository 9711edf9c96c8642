"""The observer the newer release of the rolling-deploy test adds (see deploy_observers.py)."""

from backwave.observers import observe

from .deploy_observers import TASK, record


@observe("succeeded", tasks=[TASK])
def added(transition):
    record("added", transition)
