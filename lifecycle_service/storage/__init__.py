"""Storage port of the lifecycle service and its SQLite adapter."""
