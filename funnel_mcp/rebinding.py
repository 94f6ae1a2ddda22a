"""Which Host and Origin headers `funnel mcp --http` answers, as the SDK's own
transport security settings (checked on every request of the MCP endpoint: 421
for a Host, 403 for an Origin not listed). The SDK turns them on by itself only
for a server bound to 127.0.0.1, localhost or ::1; here they are on for every
address. No I/O here."""

from __future__ import annotations

from collections.abc import Sequence

from mcp.server.transport_security import TransportSecuritySettings

from funnel.auth.hosts import own_names


def transport_security(
    host: str, port: int, allowed_hosts: Sequence[str] = (), allowed_origins: Sequence[str] = ()
) -> TransportSecuritySettings:
    """The listener's own names with its port, then `allowed_hosts` as given
    (`name:port`, or `name:*` for any port). Origins: a page served under any
    allowed host (http or https), then `allowed_origins`. A request without
    Origin (not a browser's cross-site request) needs only its Host allowed."""
    hosts = list(dict.fromkeys([*(f"{name}:{port}" for name in own_names(host)), *allowed_hosts]))
    origins = [f"{scheme}://{name}" for name in hosts for scheme in ("http", "https")]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=list(dict.fromkeys([*origins, *allowed_origins])),
    )
