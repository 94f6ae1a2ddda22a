"""Streamable HTTP as an OAuth 2.1 resource server, as the MCP specification's
authorization section describes it, with the SDK's own parts: its bearer
middleware verifies every request's token before the MCP endpoint sees it
(none, or one that does not verify: HTTP 401 with `WWW-Authenticate: Bearer …
resource_metadata="…"`), and the protected-resource metadata (RFC 9728) names
the authorization servers that issue tokens.

Tokens are verified exactly as the services verify them (funnel.auth.tokens:
the same JWKS file, issuer and audience, reloaded when the file changes), and
then forwarded with each call: `funnel mcp` is a door of the same protected
resource as the services (audience `funnel`), not a resource of its own, so a
caller acts as itself and the services keep deciding what it may do."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import urlparse

from mcp.server.auth.handlers.metadata import ProtectedResourceMetadataHandler
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.routes import build_resource_metadata_url, cors_middleware
from mcp.server.auth.settings import AuthSettings
from mcp.shared.auth import ProtectedResourceMetadata
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.routing import BaseRoute, Route

from funnel.auth import tokens
from funnel.auth.principal import Principal
from funnel.runtime.logs import fields
from funnel.runtime.security import KeySetFile
from funnel.runtime.validation import id_problem

log = logging.getLogger("funnel.mcp")

# Where RFC 9728 clients look without a `resource_metadata` hint (the SDK serves
# the document under the resource's path, §3.1; MCP clients also try the root).
METADATA_ROOT = "/.well-known/oauth-protected-resource"


@dataclass(frozen=True)
class ResourceServer:
    # The URL clients reach the MCP endpoint at: the metadata's `resource`.
    resource_url: str
    # Issuer URLs of the OAuth authorization servers that issue tokens for the
    # services; none: no metadata document is served (the 401s still are).
    authorization_servers: tuple[str, ...]
    # The services' verification: their JWKS file, required `iss` and `aud`.
    jwks_file: str
    issuer: str = tokens.DEFAULT_ISSUER
    audience: str = tokens.DEFAULT_AUDIENCE


class BearerVerifier:
    """The SDK's `TokenVerifier` over funnel's: what the services would accept,
    with the caller's subject; `principal` gives the tools its grants."""

    def __init__(self, server: ResourceServer) -> None:
        self.server = server
        # The completion service's identity has no business here: no service subject.
        self.verifier = tokens.TokenVerifier(
            tokens.load_key_set(server.jwks_file),
            server.issuer,
            server.audience,
            lambda workspace: id_problem(workspace) is None,
        )
        self.key_set = KeySetFile(server.jwks_file, self.verifier)

    def principal(self, token: str) -> Principal:
        """Raises tokens.Unauthenticated; a verified token is cached by its text."""
        return self.verifier.verify(token)

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            principal = self.principal(token)
        except tokens.Unauthenticated as refused:
            log.warning(
                "bearer token refused: %s",
                refused.message,
                extra=fields(event="http", reason=refused.problem.value, detail=refused.message),
            )
            return None
        return AccessToken(
            token=token,
            client_id=principal.subject,
            scopes=[],
            subject=principal.subject,
            claims={"iss": self.server.issuer},
        )


def auth_settings(server: ResourceServer) -> AuthSettings:
    """The SDK's settings of a resource server with a token verifier. Without an
    authorization server no metadata is published, so the SDK's required
    `issuer_url` is never shown: it is then the resource's own URL."""
    published = bool(server.authorization_servers)
    return AuthSettings(
        issuer_url=AnyHttpUrl(server.authorization_servers[0] if published else server.resource_url),
        resource_server_url=AnyHttpUrl(server.resource_url) if published else None,
        # The verifier checks the audience itself (the services' `aud`).
        validate_token_resource=False,
    )


def publish_metadata(app: Starlette, server: ResourceServer) -> None:
    """Serves the metadata naming every configured authorization server (the
    SDK's own route names only `issuer_url`), under the resource's path, where
    `WWW-Authenticate` points, and at the root."""
    routes: list[BaseRoute] = [
        route for route in app.router.routes if not getattr(route, "path", "").startswith(METADATA_ROOT)
    ]
    if server.authorization_servers:
        # Validated from text, so that an issuer's empty path stays empty (RFC
        # 8414 compares issuers as strings: no slash is added).
        metadata = ProtectedResourceMetadata.model_validate(
            {
                "resource": server.resource_url,
                "authorization_servers": list(server.authorization_servers),
                "resource_name": "funnel",
            }
        )
        endpoint = cors_middleware(ProtectedResourceMetadataHandler(metadata).handle, ["GET", "OPTIONS"])
        under_resource = urlparse(str(build_resource_metadata_url(AnyHttpUrl(server.resource_url)))).path
        routes += [
            Route(path, endpoint=endpoint, methods=["GET", "OPTIONS"])
            for path in dict.fromkeys((under_resource, METADATA_ROOT))
        ]
    app.router.routes = routes
