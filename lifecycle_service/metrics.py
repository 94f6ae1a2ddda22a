"""The lifecycle service's domain metrics (Prometheus; the series both services
share are in funnel.runtime.metrics). Counters count what this process did;
the gauges are figures of the database, refreshed by a background loop, so they
agree across replicas."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from lifecycle_service.core.model import LifecycleEvent
from lifecycle_service.storage.port import LifecycleFigures


class LifecycleMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._transitions = Counter(
            "funnel_lifecycle_transitions",
            "Committed transitions, by intent kind and the generation state they led to.",
            ("kind", "state"),
            registry=self.registry,
        )
        self._propagations = Counter(
            "funnel_lifecycle_propagations",
            "Propagations delivered to attached children, by result (applied, or dropped: the child refused).",
            ("result",),
            registry=self.registry,
        )
        self._pending = Gauge(
            "funnel_lifecycle_propagations_pending",
            "Propagations committed parents still owe their attached children.",
            registry=self.registry,
        )

    def transition(self, event: LifecycleEvent) -> None:
        self._transitions.labels(event.intent.name, event.to_state.name).inc()

    def propagated(self, applied: bool) -> None:
        self._propagations.labels("applied" if applied else "dropped").inc()

    def refresh(self, figures: LifecycleFigures) -> None:
        self._pending.set(figures.pending_propagations)
