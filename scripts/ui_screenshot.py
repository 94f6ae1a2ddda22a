"""Takes docs/ui.png: the dashboard's page of the demo task, in Debian's chromium.

Usage: .venv/bin/python scripts/ui_screenshot.py [--out docs/ui.png]

Starts both services in a temporary directory (as `funnel up` does), walks the
demo story (a blocked attempt, evidence, an allowed one, settled), starts
`funnel ui` with a host's action credential and photographs the task's page."""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import subprocess
import sys
import tempfile
from importlib import resources

from playwright.sync_api import sync_playwright

from funnel.client import connection as conn
from funnel_cli.demo import WORKSPACE, DemoCallers, run_demo
from funnel_cli.supervisor import start_pair, wait_serving

ROOT = pathlib.Path(__file__).resolve().parent.parent
FUNNEL = pathlib.Path(sys.executable).parent / "funnel"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(ROOT / "docs" / "ui.png"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        data = pathlib.Path(scratch) / "funnel-data"
        policy = str(resources.files("funnel_cli") / "demo_policy.toml")
        lifecycle, completion = start_pair(data, "127.0.0.1:0", "127.0.0.1:0", policy)
        ui = None
        try:
            host = conn.Connection(None, (data / "tls" / "ca.pem").read_bytes(),
                                   (data / "tls" / "client.pem").read_bytes(),
                                   (data / "tls" / "client.key").read_bytes())
            asyncio.run(wait_serving(host, lifecycle.address))
            callers = DemoCallers(host.with_token(conn.local_token(data, "demo-host", [f"{WORKSPACE}:host"])),
                                  host.with_token(conn.local_token(data, "demo-agent", [f"{WORKSPACE}:agent"])),
                                  "demo-agent")
            story = asyncio.run(run_demo(callers, lifecycle.address, completion.address, lambda line: None))
            ui = subprocess.Popen(
                [str(FUNNEL), "ui", "--listen", "127.0.0.1:0", "--data-dir", str(data), "--workspace", WORKSPACE,
                 "--lifecycle", lifecycle.address, "--completion", completion.address,
                 "--action-token", conn.local_token(data, "operator", [f"{WORKSPACE}:operator"])],
                stdout=subprocess.PIPE, text=True)
            assert ui.stdout is not None
            url = ui.stdout.readline().split()[4]
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True)
                page = browser.new_page(viewport={"width": 1500, "height": 1050})
                page.goto(f"{url}/w/{WORKSPACE}/t/{story['task_id']}")
                page.wait_for_selector("#live.on")
                page.locator("#attempts details").first.evaluate("d => d.open = true")
                page.screenshot(path=args.out)
                browser.close()
            print(f"wrote {args.out}")
        finally:
            if ui is not None:
                ui.terminate()
                ui.communicate(timeout=15)
            completion.stop()
            lifecycle.stop()


if __name__ == "__main__":
    main()
