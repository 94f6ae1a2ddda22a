"""completion_service: the sole semantic completion authority (docs/specification.md §1.3)."""
