"""The fixtures of the security tests: `secured` (both services in-process) and
`pair` (both as real processes over TLS); tests/security/support.py has the rest."""

from __future__ import annotations

import pytest

from completion_service.server import CompletionConfig
from funnel.runtime.clock import ManualClock
from lifecycle_service.server import LifecycleConfig
from tests import credentials
from tests.completion.e2e_support import CLOCK_START_MICROS, Funnel
from tests.reliability.harness import Pair
from tests.security.support import SecuredFunnel


@pytest.fixture
async def secured(tmp_path):
    """Both services with authentication on and the default test security."""
    started: list[SecuredFunnel] = []

    async def start(*, lifecycle: dict | None = None, completion: dict | None = None, policy: dict | None = None):
        lifecycle_fields = dict(
            listen="127.0.0.1:0",
            database=str(tmp_path / f"lifecycle-{len(started)}.sqlite3"),
            security=credentials.server_security(),
            health_interval=5.0,
        )
        completion_fields = dict(
            listen="127.0.0.1:0",
            database=str(tmp_path / f"completion-{len(started)}.sqlite3"),
            security=credentials.server_security(),
            outbound=credentials.outbound_security(),
            lifecycle_timeout=2.0,
            settle_interval=0.05,
            health_interval=5.0,
        )
        lifecycle_fields.update(lifecycle or {})
        completion_fields.update(completion or {})
        funnel = Funnel(
            ManualClock(CLOCK_START_MICROS),
            tmp_path,
            LifecycleConfig(**lifecycle_fields),
            CompletionConfig(**completion_fields),
            policy or {},
        )
        try:
            await funnel.start()
        except BaseException:
            await funnel.close()  # what did start (the lifecycle server) stops
            raise
        secured = SecuredFunnel(funnel)
        started.append(secured)
        return secured

    yield start
    for secured in reversed(started):
        await secured.close()


@pytest.fixture
async def pair(tmp_path):
    """Starts real service processes (tests/reliability/harness.py), stopped at the end."""
    started: list[Pair] = []

    async def start(**kwargs) -> Pair:
        pair = await Pair(tmp_path / f"pair-{len(started)}", **kwargs).start()
        started.append(pair)
        return pair

    yield start
    for pair in started:
        await pair.stop()
