"""Deterministic simulation of both authorities in one process (issue 22); the
design is in docs/reliability.md, "Deterministic simulation"."""
