"""Fixtures of the dashboard tests: both services as real processes, and a host
driving tasks through the story, shared by the tests of a module."""

from __future__ import annotations

import pytest

from tests.ui.support import Driver, Services


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    services = Services(tmp_path_factory.mktemp("ui") / "data")
    services.start()
    yield services
    services.stop()


@pytest.fixture(scope="module")
def driver(services):
    driver = Driver(services, services.token("test-host", ["*:host"]))
    yield driver
    driver.close()
