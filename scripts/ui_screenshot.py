"""Takes the README's pictures of the dashboard in Debian's chromium: the demo
task's page (docs/ui.png), the task list (docs/ui-list.png) and the page of what
needs attention (docs/ui-attention.png).

Usage: .venv/bin/python scripts/ui_screenshot.py [--out-dir docs]

Starts both services in a temporary directory (as `funnel up` does), walks the
demo story (a blocked attempt, evidence, an allowed one, settled) and a few more
tasks through the services' own calls, so that each page shows what it shows a
user: a run whose lease lapsed, one open past the bound, a completion the
lifecycle service refused, a cancellation requested. The policy is `funnel up`'s
with the open-children check left to the lifecycle service, whose refusal
(ACTIVE_ATTACHED_CHILD) is what the rejected list shows. Then starts `funnel ui`
with an operator's action credential for workspace demo and photographs it."""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import subprocess
import sys
import tempfile

from playwright.sync_api import sync_playwright

from funnel.client import connection as conn
from funnel.client.client import new_request_id
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel_cli.demo import WORKSPACE, DemoCallers, run_demo
from funnel_cli.supervisor import start_pair, wait_serving

ROOT = pathlib.Path(__file__).resolve().parent.parent
FUNNEL = pathlib.Path(sys.executable).parent / "funnel"
# funnel_cli/demo_policy.toml, with the open-children check left to the lifecycle service.
POLICY = (
    '[defaults]\nrequired_evidence = []\n\n[workspaces.demo]\nrequired_evidence = ["tests"]\n'
    'disabled_gates = ["lifecycle.no_active_children"]\n'
)
# Runs open longer than this count as open long: short, so the picture needs no hour's wait.
LONG_RUN_MINUTES = 0.05


async def more_tasks(callers: DemoCallers, lifecycle: str, completion: str) -> None:
    """The tasks beside the demo's that fill the list and the attention page."""
    async with (
        callers.host.client(lifecycle, completion) as host,
        callers.agent.client(lifecycle, completion) as agent,
    ):
        for task_id in ("update-docs", "fix-login-timeout", "flaky-ci-retry", "drop-legacy-api", "split-payments"):
            await host.register_task(
                WORKSPACE, task_id, cause=lifecycle_types.Cause(source="ui_screenshot", reason="example")
            )
        await agent.claim_task(WORKSPACE, "fix-login-timeout", callers.agent_id, lease_ttl=600)
        await agent.claim_task(WORKSPACE, "flaky-ci-retry", callers.agent_id, lease_ttl=1)
        fenced = await agent.claim_task(WORKSPACE, "drop-legacy-api", callers.agent_id, lease_ttl=600)
        await host.call(
            host.lifecycle.RequestCancellation,
            lifecycle_messages.RequestCancellationRequest(
                workspace_id=WORKSPACE,
                task_id="drop-legacy-api",
                generation=fenced.run.generation,
                request_id=new_request_id(),
                cause=lifecycle_types.Cause(source="ui_screenshot", reason="the API stays"),
            ),
        )
        parent = await agent.claim_task(WORKSPACE, "split-payments", callers.agent_id, lease_ttl=600)
        await host.register_task(
            WORKSPACE,
            "split-payments-tests",
            parent=lifecycle_types.ParentLink(
                task_id="split-payments", generation=1, mode=lifecycle_enums.PARENT_LINK_MODE_ATTACHED
            ),
        )
        await host.record_evidence(
            WORKSPACE,
            "split-payments",
            1,
            "tests",
            completion_enums.EVIDENCE_VERDICT_PASSED,
            details="pytest: 118 passed",
            run_id=parent.run.run_id,
        )
        refused = await agent.attempt_completion(
            WORKSPACE,
            "split-payments",
            parent.run.run_id,
            parent.lease.epoch,
            result="payments split into two services",
        )
        assert refused.completion.settlement == completion_enums.SETTLEMENT_STATUS_REJECTED, refused


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", default=str(ROOT / "docs"))
    args = parser.parse_args()
    out = pathlib.Path(args.out_dir)
    with tempfile.TemporaryDirectory() as scratch:
        data = pathlib.Path(scratch) / "funnel-data"
        policy = pathlib.Path(scratch) / "policy.toml"
        policy.write_text(POLICY)
        lifecycle, completion = start_pair(data, "127.0.0.1:0", "127.0.0.1:0", str(policy))
        ui = None
        try:
            host = conn.Connection(
                None,
                (data / "tls" / "ca.pem").read_bytes(),
                (data / "tls" / "client.pem").read_bytes(),
                (data / "tls" / "client.key").read_bytes(),
            )
            asyncio.run(wait_serving(host, lifecycle.address))
            callers = DemoCallers(
                host.with_token(conn.local_token(data, "demo-host", [f"{WORKSPACE}:host"])),
                host.with_token(conn.local_token(data, "demo-agent", [f"{WORKSPACE}:agent"])),
                "demo-agent",
            )
            story = asyncio.run(run_demo(callers, lifecycle.address, completion.address, lambda line: None))
            asyncio.run(more_tasks(callers, lifecycle.address, completion.address))
            ui = subprocess.Popen(
                [
                    str(FUNNEL),
                    "ui",
                    "--listen",
                    "127.0.0.1:0",
                    "--data-dir",
                    str(data),
                    "--workspace",
                    WORKSPACE,
                    "--lifecycle",
                    lifecycle.address,
                    "--completion",
                    completion.address,
                    "--long-run-minutes",
                    str(LONG_RUN_MINUTES),
                    "--action-token",
                    conn.local_token(data, "operator", [f"{WORKSPACE}:operator"]),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert ui.stdout is not None
            url = ui.stdout.readline().split()[4]
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True)
                page = browser.new_page(viewport={"width": 1500, "height": 1050})
                page.goto(f"{url}/w/{WORKSPACE}/t/{story['task_id']}")
                page.wait_for_selector("#live.on")
                page.locator("#attempts details").first.evaluate("d => d.open = true")
                page.screenshot(path=out / "ui.png")
                page.set_viewport_size({"width": 1500, "height": 520})
                page.goto(f"{url}/w/{WORKSPACE}?sort=changed")
                page.wait_for_selector("#live.on")
                page.screenshot(path=out / "ui-list.png", full_page=True)
                page.goto(f"{url}/w/{WORKSPACE}/attention")
                # Both by time alone: the short lease lapses, the long run crosses the bound.
                for section, task_id in (("expired", "flaky-ci-retry"), ("long", "fix-login-timeout")):
                    page.wait_for_selector(f"#attention-{section} tr[data-task={task_id}]", timeout=30_000)
                page.screenshot(path=out / "ui-attention.png", full_page=True)
                browser.close()
            print(f"wrote {', '.join(str(out / name) for name in ('ui.png', 'ui-list.png', 'ui-attention.png'))}")
        finally:
            if ui is not None:
                ui.terminate()
                ui.communicate(timeout=15)
            completion.stop()
            lifecycle.stop()


if __name__ == "__main__":
    main()
