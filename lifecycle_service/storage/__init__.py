"""Storage of the lifecycle service: the port (`port`), the SQLite adapter (`sqlite`)
and an in-memory fake (`memory`)."""
