"""completion_service: the sole semantic completion authority (brief §4)."""
