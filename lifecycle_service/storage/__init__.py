"""Storage of the lifecycle service: the port (`port`), the SQLite adapter (`sqlite`),
the PostgreSQL adapter for replicas (`postgres`) and an in-memory fake (`memory`)."""
