"""Prints the crash matrix totals at the end of a run (also under xdist: the
figures travel in each test report's user_properties)."""

from __future__ import annotations

import json
import os

_rows: list[dict] = []


def pytest_runtest_logreport(report):
    if report.when != "call":
        return
    for name, value in getattr(report, "user_properties", ()):
        if name == "crash_matrix":
            _rows.append(json.loads(value))


def pytest_terminal_summary(terminalreporter):
    if not _rows:
        return
    write = terminalreporter.write_line
    terminalreporter.section("crash matrix")
    keys = ["runs", "faults", "crashes", "drops", "lost", "duplicated", "unknown_calls", "seconds"]
    write(f"{'point':45} " + " ".join(f"{k:>10}" for k in keys))
    total = {k: 0 for k in keys}
    for row in sorted(_rows, key=lambda r: r["point"]):
        write(f"{row['point']:45} " + " ".join(f"{row[k]:>10}" for k in keys))
        for k in keys:
            total[k] += row[k]
    total["seconds"] = round(total["seconds"], 1)
    write(f"{'total':45} " + " ".join(f"{total[k]:>10}" for k in keys))
    path = os.environ.get("FUNNEL_CRASH_REPORT")
    if path:
        with open(path, "w", encoding="utf-8") as file:
            json.dump({"points": _rows, "total": total}, file, indent=2)
