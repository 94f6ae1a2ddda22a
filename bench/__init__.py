"""The funnel benchmark harness (see README.md)."""
