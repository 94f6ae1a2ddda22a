"""A Python client for hosts of the funnel services.

    from funnel.client import FunnelClient, FunnelError

    async with FunnelClient.from_data_dir("funnel-data", subject="my-host", permissions=["acme:host"]) as client:
        registered = await client.register_task("acme", "fix-login")

Modules: client (FunnelClient, the story's calls), credentials (TLS material and
token sources), retry (what is retried, how long it waits), errors (FunnelError); connection
(the flags, environment and data directory a command reaches the services with)."""

from funnel.client.client import BreakHook, FunnelClient, new_request_id
from funnel.client.credentials import Tls, TokenSource, local_tokens, token_file
from funnel.client.errors import FunnelError
from funnel.client.retry import RetryPolicy

__all__ = [
    "BreakHook",
    "FunnelClient",
    "FunnelError",
    "RetryPolicy",
    "Tls",
    "TokenSource",
    "local_tokens",
    "new_request_id",
    "token_file",
]
