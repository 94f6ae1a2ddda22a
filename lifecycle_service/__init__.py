"""lifecycle_service: the sole authority for task lifecycle state (docs/specification.md §1.2, §3)."""
