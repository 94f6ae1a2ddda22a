"""The completion service's domain metrics (Prometheus; the series both services
share are in funnel.runtime.metrics). Counters count what this process did;
the gauges are figures of the database, refreshed by `refresh` (a background
loop), so they agree across replicas."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from completion_service.core.model import Decision, SettlementStatus
from completion_service.storage.port import CompletionFigures

CIRCUIT_BREAKER = "completion.circuit_breaker"


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._attempts = Counter(
            "funnel_completion_attempts",
            "Judged completion attempts, by verdict and the gate that decided a block (empty when allowed).",
            ("verdict", "gate"),
            registry=r,
        )
        self._breaker_trips = Counter(
            "funnel_completion_circuit_breaker_trips",
            "Attempts the circuit breaker blocked (the same blocked result at the same checkpoint too often).",
            registry=r,
        )
        self._settlements = Counter(
            "funnel_completion_settlements",
            "Completions whose settlement the lifecycle service answered, by status (SETTLED, REJECTED).",
            ("status",),
            registry=r,
        )
        self._settle_retries = Counter(
            "funnel_completion_settlement_retries",
            "Settlements that got no answer from the lifecycle service and were postponed.",
            registry=r,
        )
        self._corruptions = Counter(
            "funnel_completion_corruptions",
            "Attempts that found a stored completion with their identity and another payload (an alarm).",
            registry=r,
        )
        self._repairs = Counter(
            "funnel_completion_transcript_repairs",
            "Interrupted final turns closed with synthetic events.",
            registry=r,
        )
        self._stalled = Counter(
            "funnel_completion_stalled_runs", "Runs the stall sweeper closed as STALLED.", registry=r
        )
        self._pending = Gauge(
            "funnel_completion_outbox_pending", "Committed completions whose settlement is pending.", registry=r
        )
        self._oldest = Gauge(
            "funnel_completion_outbox_oldest_age_seconds",
            "Age of the oldest pending settlement (0 when none is pending).",
            registry=r,
        )
        self._views = Counter(
            "funnel_completion_lifecycle_views",
            "Lifecycle views attempts were judged on, by source: the projection kept current by the lifecycle "
            "event stream; a read (GetTask), the projection could not serve it; stale, the projection's view was "
            "of an older generation than the run's and was read again; last_seen, the lifecycle service could not "
            "be read and the projection of the workspace's ended stream served it.",
            ("source",),
            registry=r,
        )
        self._projected = Gauge(
            "funnel_completion_lifecycle_streams_live",
            "Workspaces whose lifecycle event stream is live, so that their attempts may be judged on the projection.",
            registry=r,
        )
        self.import_buffer = Gauge(
            "funnel_completion_import_buffer_bytes",
            "Bytes of the import buffer the transcript imports in flight hold (docs/security.md, Limits).",
            registry=r,
        )
        self._open_runs = Gauge("funnel_completion_open_runs", "Runs not closed yet.", registry=r)
        self._leases = Gauge("funnel_completion_active_leases", "Open runs whose lease has not expired.", registry=r)

    def attempted(self, decision: Decision) -> None:
        gate = decision.details.decisive_gate if decision.details is not None else ""
        self._attempts.labels(decision.verdict.name, gate).inc()
        if gate == CIRCUIT_BREAKER:
            self._breaker_trips.inc()

    def lifecycle_view(self, source: str) -> None:
        self._views.labels(source).inc()

    def lifecycle_streams_live(self, count: int) -> None:
        self._projected.set(count)

    def settled(self, status: SettlementStatus) -> None:
        self._settlements.labels(status.name).inc()

    def settle_retried(self) -> None:
        self._settle_retries.inc()

    def corrupted(self) -> None:
        self._corruptions.inc()

    def repaired(self) -> None:
        self._repairs.inc()

    def stalled(self, runs: int) -> None:
        self._stalled.inc(runs)

    def refresh(self, figures: CompletionFigures, now: int) -> None:
        self._pending.set(figures.pending_settlements)
        oldest = figures.oldest_pending_committed_at
        self._oldest.set(0 if oldest is None else max(0, now - oldest) / 1_000_000)
        self._open_runs.set(figures.open_runs)
        self._leases.set(figures.live_leases)
