"""A pump's health, spelled once for every layer that reports or reads it: the pump sets it,
the health endpoint and ``backwave_health`` add pumps up by it, the Pump table stores it.

healthy; degraded (a transient store fault: it retries on its own); halted (fail-stop: it
stopped, its lease lapses and other pumps take its jobs).
"""

HEALTHY, DEGRADED, HALTED = "healthy", "degraded", "halted"
