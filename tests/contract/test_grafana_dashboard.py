"""deploy/grafana/funnel.json queries only series the services export: every
metric name in its PromQL is one the services' registries define (the same
objects their servers build: funnel.runtime.metrics.ServiceMetrics plus each
service's domain metrics), so a renamed metric cannot leave a blank panel."""

from __future__ import annotations

import json
import re
from pathlib import Path

from completion_service.authority.metrics import Metrics as CompletionMetrics
from funnel.runtime.metrics import ServiceMetrics
from lifecycle_service.metrics import LifecycleMetrics

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "funnel.json"
# The names a family of each type exposes (prometheus_client's text format).
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
# PromQL words that are neither functions (followed by "(") nor metric names.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


def exported() -> set[str]:
    lifecycle, completion = ServiceMetrics(), ServiceMetrics()
    LifecycleMetrics(lifecycle.registry)
    CompletionMetrics(completion.registry)
    return {
        family.name + suffix
        for registry in (lifecycle.registry, completion.registry)
        for family in registry.collect()
        for suffix in SUFFIXES.get(family.type, ("",))
    }


def expressions(node: object) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for value in node.values() for e in expressions(value)]
    if isinstance(node, list):
        return [e for item in node for e in expressions(item)]
    return []


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not
    functions, keywords, label names (in `{…}` or `by (…)`), or durations."""
    text = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", text)  # grouping labels
    names = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or match.group() in KEYWORDS:
            continue
        names.add(match.group())
    return names


def test_the_name_parser_sees_through_functions_groupings_and_matchers():
    expr = (
        'histogram_quantile(0.99, sum by (le, job) (rate(funnel_db_commit_seconds_bucket{job=~"a|b"}[5m]))) '
        "/ on (job) group_left max(up)"
    )
    assert metric_names(expr) == {"funnel_db_commit_seconds_bucket", "up"}


def test_every_dashboard_query_uses_only_exported_metric_names():
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = expressions(dashboard["panels"])
    assert len(queries) >= 20
    used = set().union(*(metric_names(q) for q in queries))
    assert not used - exported(), f"not exported: {sorted(used - exported())}"
    # It shows what the issue asks of it: RPC rate, errors and latency, the outbox, attempts, commits.
    for name in (
        "grpc_server_handled_total",
        "grpc_server_handling_seconds_bucket",
        "funnel_completion_outbox_pending",
        "funnel_completion_outbox_oldest_age_seconds",
        "funnel_completion_attempts_total",
        "funnel_db_commit_seconds_bucket",
    ):
        assert name in used, name
    # The job variable's query names an exported series as well.
    [job] = [v for v in dashboard["templating"]["list"] if v["name"] == "job"]
    assert metric_names(job["query"].removeprefix("label_values(").split(",")[0]) <= exported()
