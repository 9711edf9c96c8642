"""BackWave: background jobs for Django in the application's own PostgreSQL."""

__version__ = "0.1.0"
