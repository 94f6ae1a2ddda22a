"""stream_until_answered: a client stream is sent again only when grpc-aio lost
the server's answer (grpc/grpc#36066), never for an answer the server gave."""

import grpc
import pytest

from funnel.client.retry import answer_lost_by_the_client, stream_until_answered

Code = grpc.StatusCode
LOST = grpc.aio.AioRpcError(Code.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), "Internal error from Core")
SERVER_INTERNAL = grpc.aio.AioRpcError(Code.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), "disk I/O error")
REFUSED = grpc.aio.AioRpcError(Code.FAILED_PRECONDITION, grpc.aio.Metadata(), grpc.aio.Metadata(), "not empty")


class Calls:
    """A call that fails with each of `failures` in turn, then answers."""

    def __init__(self, *failures: grpc.aio.AioRpcError) -> None:
        self.failures = list(failures)
        self.made = 0

    async def __call__(self) -> str:
        self.made += 1
        if self.failures:
            raise self.failures.pop(0)
        return "answered"


def test_only_the_client_librarys_own_internal_error_is_a_lost_answer():
    assert answer_lost_by_the_client(LOST)
    assert not answer_lost_by_the_client(SERVER_INTERNAL)
    assert not answer_lost_by_the_client(REFUSED)


async def test_a_lost_answer_sends_the_stream_again_until_the_server_is_heard():
    calls = Calls(LOST, LOST, LOST)
    assert await stream_until_answered(calls) == "answered"
    assert calls.made == 4


@pytest.mark.parametrize("answer", [REFUSED, SERVER_INTERNAL])
async def test_an_answer_the_server_gave_is_raised_at_once(answer):
    calls = Calls(answer)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stream_until_answered(calls)
    assert caught.value is answer and calls.made == 1


async def test_ten_lost_answers_in_a_row_are_raised_not_sent_forever():
    calls = Calls(*[LOST] * 11)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stream_until_answered(calls)
    assert caught.value is LOST and calls.made == 10
