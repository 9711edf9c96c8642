"""Calls a type checker must refuse (tests/userproject/test_typing.py expects each line's error)."""

import backwave
from backwave import Snooze, Unique

backwave.cancel(1, by=3)
Unique(by="user_id")
Snooze("an hour")
backwave.task(max_attempts="5")
