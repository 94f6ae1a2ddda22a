"""Storage port of the completion service and its SQLite adapter."""
