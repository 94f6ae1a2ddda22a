"""The Host names an HTTP listener of this project (`funnel mcp --http`, `funnel
ui`) answers by default. A page of another site can make its own name resolve to
the listener's address (DNS rebinding); the browser then sends that name as Host,
and treats the listener as part of that site. So a listener answers only names
the operator chose: the address it binds, the loopback names when that is a
loopback address or every address, and those given with `--allowed-host`."""

from __future__ import annotations

import ipaddress

# As a Host header writes them (an IPv6 address in brackets).
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def own_names(host: str) -> list[str]:
    """The names by which clients reach a listener bound to `host`. An unspecified
    address (0.0.0.0, ::) is no name of its own: remote names must be given."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return list(dict.fromkeys([host.lower(), *(LOOPBACK_NAMES if host.lower() == "localhost" else ())]))
    names = [] if address.is_unspecified else [f"[{address}]" if address.version == 6 else str(address)]
    if address.is_loopback or address.is_unspecified:
        names += LOOPBACK_NAMES
    return list(dict.fromkeys(names))
