"""lifecycle_service: the sole authority for task lifecycle state (brief §3)."""
