"""The Storage Contract and its PostgreSQL implementation."""

from .contract import NewJob, OutcomeRecord, Store, StoreError, TransientStoreError
from .postgres import PostgresStore

__all__ = ["NewJob", "OutcomeRecord", "PostgresStore", "Store", "StoreError", "TransientStoreError"]
