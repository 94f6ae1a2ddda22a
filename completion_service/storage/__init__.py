"""Storage of the completion service: the port (port.py) and its adapters (sqlite.py, memory.py)."""
