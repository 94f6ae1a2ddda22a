"""`funnel ui` answers only its own names (DNS rebinding), also when it serves a
read-only dashboard on every address, and refuses requests a page of another
origin sends to its event streams and action endpoints. Real services and real
`funnel ui` processes, plain HTTP requests (no browser needed to forge headers)."""

from __future__ import annotations

import contextlib
import http.client
import re
from urllib.parse import urlencode

from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from tests.ui.support import Dashboard

WS = "demo"


@contextlib.contextmanager
def dashboard(services, host: str, *extra: str, action: bool = False):
    token = services.token("ui-operator", ["*:operator"]) if action else None
    started = Dashboard(services, [WS], token, host=host, extra=list(extra))
    started.start()
    try:
        yield started
    finally:
        started.stop()


def request(
    address: str, port: int, method: str, path: str, headers: dict[str, str], body: str | None = None
) -> tuple[int, str]:
    """One request; an event stream's status is read and the stream left."""
    with contextlib.closing(http.client.HTTPConnection(address, port, timeout=30)) as connection:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        if response.getheader("content-type", "").startswith("text/event-stream"):
            return response.status, ""
        return response.status, response.read().decode()


def test_a_read_only_dashboard_on_every_address_answers_only_the_names_given(services, driver):
    driver.register(WS, "hosts-1")
    with dashboard(services, "0.0.0.0", "--allow-remote", "--allowed-host", "dash.example") as ui:
        page = f"/w/{WS}/t/hosts-1"
        assert request("127.0.0.1", ui.port, "GET", page, {"Host": f"rebind.evil.example:{ui.port}"})[0] == 400
        assert request("127.0.0.1", ui.port, "GET", page, {"Host": f"dash.example:{ui.port}"})[0] == 200
        assert request("127.0.0.1", ui.port, "GET", page, {"Host": f"127.0.0.1:{ui.port}"})[0] == 200
        assert request("127.0.0.1", ui.port, "GET", page, {"Host": "dash.example.evil.example"})[0] == 400


def test_a_foreign_host_or_origin_on_127_0_0_2_reads_nothing_and_acts_on_nothing(services, driver):
    driver.register(WS, "hosts-2")
    with dashboard(services, "127.0.0.2", action=True) as ui:
        own = f"127.0.0.2:{ui.port}"
        page, stream = f"/w/{WS}/t/hosts-2", f"/w/{WS}/t/hosts-2/stream"
        status, html = request("127.0.0.2", ui.port, "GET", page, {"Host": own})
        assert status == 200
        form = dict(re.findall(r'name=(\w+) value="([^"]*)"', html.split('action="/w/demo/t/hosts-2/cancel"')[1]))
        body = urlencode(form)
        posted = {"Content-Type": "application/x-www-form-urlencoded"}

        rebound = {"Host": f"rebind.evil.example:{ui.port}"}
        foreign = {"Host": own, "Origin": f"http://rebind.evil.example:{ui.port}"}
        assert request("127.0.0.2", ui.port, "GET", page, rebound)[0] == 400
        assert request("127.0.0.2", ui.port, "GET", stream, rebound)[0] == 400
        assert request("127.0.0.2", ui.port, "GET", stream, foreign)[0] == 403
        assert request("127.0.0.2", ui.port, "POST", f"{page}/cancel", rebound | posted, body)[0] == 400
        assert request("127.0.0.2", ui.port, "POST", f"{page}/cancel", foreign | posted, body)[0] == 403
        task = driver.lifecycle.GetTask(
            lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id="hosts-2"), metadata=driver.metadata, timeout=10
        ).task
        assert task.cancellation == lifecycle_enums.CANCELLATION_STATE_NONE

        # Its own origin is answered: the refusals were about the names.
        same = {"Host": own, "Origin": f"http://{own}"}
        assert request("127.0.0.2", ui.port, "GET", stream, same)[0] == 200
        assert request("127.0.0.2", ui.port, "POST", f"{page}/cancel", same | posted, body)[0] == 303
    task = driver.lifecycle.GetTask(
        lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id="hosts-2"), metadata=driver.metadata, timeout=10
    ).task
    assert task.cancellation == lifecycle_enums.CANCELLATION_STATE_REQUESTED
