"""The README's first Python example, runnable against `funnel up`:

    export FUNNEL_TOKEN=$(funnel token issue --workspace acme --role host)
    python examples/register_task.py

Registers task `fix-login` in workspace `acme` and reads it back, through
funnel.client. Its request id is fixed, so running it again is answered with the
first registration (not TASK_ALREADY_EXISTS). FUNNEL_DATA_DIR (`funnel up`'s
--data-dir), FUNNEL_LIFECYCLE and FUNNEL_COMPLETION point elsewhere than
`funnel up`'s defaults."""

import asyncio
import os
import sys

from funnel.client import FunnelClient, FunnelError
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums


async def main() -> None:
    async with FunnelClient.from_data_dir(
        os.environ.get("FUNNEL_DATA_DIR", "funnel-data"),  # its CA and client certificate
        token=os.environ["FUNNEL_TOKEN"],  # addresses: FUNNEL_LIFECYCLE, FUNNEL_COMPLETION, else funnel up's
    ) as client:
        registered = await client.register_task("acme", "fix-login", request_id="register-fix-login")
        task = await client.get_task("acme", "fix-login")
        print(
            f"registered {registered.task.task_id} (revision {registered.task.revision}): generation "
            f"{task.task.generation}, {lifecycle_enums.GenerationState.Name(task.task.state)}"
        )


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except FunnelError as error:
        sys.exit(f"register_task: {error}")
