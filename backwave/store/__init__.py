"""The Storage Contract and its PostgreSQL implementation."""

from .contract import NewJob, OutcomeRecord, Store, StoreError, TransientStoreError

__all__ = ["NewJob", "OutcomeRecord", "Store", "StoreError", "TransientStoreError"]
