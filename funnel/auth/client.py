"""The client side of bearer tokens: interceptors that send
`authorization: Bearer <token>` with every call of a channel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc


def bearer_interceptors(token: Callable[[], str]) -> list[Any]:
    """One interceptor per kind of call (gRPC files each interceptor under the
    first kind it implements), each sending the current `token()` unless the
    call already carries an authorization header."""

    def with_token(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        present = list(details.metadata or ())
        if any(key == "authorization" for key, _ in present):
            return details
        # ClientCallDetails is a namedtuple at run time; types-grpcio leaves out its _replace.
        return details._replace(  # type: ignore[attr-defined]
            metadata=present + [("authorization", f"Bearer {token()}")]
        )

    class UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation, details, request):
            return await continuation(with_token(details), request)

    class UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(self, continuation, details, request):
            return await continuation(with_token(details), request)

    class StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
        async def intercept_stream_unary(self, continuation, details, request_iterator):
            return await continuation(with_token(details), request_iterator)

    class StreamStream(grpc.aio.StreamStreamClientInterceptor):
        async def intercept_stream_stream(self, continuation, details, request_iterator):
            return await continuation(with_token(details), request_iterator)

    return [UnaryUnary(), UnaryStream(), StreamUnary(), StreamStream()]
