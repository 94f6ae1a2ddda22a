"""The client side of bearer tokens: interceptors that send
`authorization: Bearer <token>` with every call of a channel."""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from typing import TypeVar, cast

import grpc

# The interceptor methods are generic over the messages of whatever call they intercept.
Request = TypeVar("Request")
Response = TypeVar("Response")


def bearer_interceptors(token: Callable[[], str]) -> list[grpc.aio.ClientInterceptor]:
    """One interceptor per kind of call (gRPC files each interceptor under the
    first kind it implements), each sending the current `token()` unless the
    call already carries an authorization header."""

    def with_token(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        present = list(details.metadata or ())
        if any(key == "authorization" for key, _ in present):
            return details
        # ClientCallDetails is a namedtuple at run time; types-grpcio leaves out its _replace,
        # which returns a copy of the same class (Any to mypy, hence the cast).
        return cast(
            grpc.aio.ClientCallDetails,
            details._replace(  # type: ignore[attr-defined]
                metadata=present + [("authorization", f"Bearer {token()}")]
            ),
        )

    class UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(
            self,
            continuation: Callable[
                [grpc.aio.ClientCallDetails, Request], Awaitable[grpc.aio.UnaryUnaryCall[Request, Response]]
            ],
            details: grpc.aio.ClientCallDetails,
            request: Request,
        ) -> grpc.aio.UnaryUnaryCall[Request, Response]:
            return await continuation(with_token(details), request)

    class UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(
            self,
            continuation: Callable[
                [grpc.aio.ClientCallDetails, Request], Awaitable[grpc.aio.UnaryStreamCall[Request, Response]]
            ],
            details: grpc.aio.ClientCallDetails,
            request: Request,
        ) -> grpc.aio.UnaryStreamCall[Request, Response]:
            return await continuation(with_token(details), request)

    class StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
        async def intercept_stream_unary(
            self,
            continuation: Callable[
                [grpc.aio.ClientCallDetails, AsyncIterable[Request] | Iterable[Request]],
                Awaitable[grpc.aio.StreamUnaryCall[Request, Response]],
            ],
            details: grpc.aio.ClientCallDetails,
            request_iterator: AsyncIterable[Request] | Iterable[Request],
        ) -> grpc.aio.StreamUnaryCall[Request, Response]:
            return await continuation(with_token(details), request_iterator)

    class StreamStream(grpc.aio.StreamStreamClientInterceptor):
        async def intercept_stream_stream(
            self,
            continuation: Callable[
                [grpc.aio.ClientCallDetails, AsyncIterable[Request] | Iterable[Request]],
                Awaitable[grpc.aio.StreamStreamCall[Request, Response]],
            ],
            details: grpc.aio.ClientCallDetails,
            request_iterator: AsyncIterable[Request] | Iterable[Request],
        ) -> grpc.aio.StreamStreamCall[Request, Response]:
            return await continuation(with_token(details), request_iterator)

    return [UnaryUnary(), UnaryStream(), StreamUnary(), StreamStream()]
