"""Counters an operator alarms on."""

from __future__ import annotations


class Metrics:
    def __init__(self) -> None:
        self.completion_corruptions = 0
        self.settlements = 0
        self.terminalization_errors = 0
        self.settle_retries = 0
