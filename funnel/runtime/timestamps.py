"""Microseconds since the epoch <-> google.protobuf.Timestamp."""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

# google.protobuf.Timestamp's documented range: 0001-01-01 .. 9999-12-31.
MIN_SECONDS = -62135596800
MAX_SECONDS = 253402300799


def to_timestamp(micros: int | None) -> Timestamp | None:
    if micros is None:
        return None
    seconds, rest = divmod(micros, 1_000_000)
    return Timestamp(seconds=seconds, nanos=rest * 1000)


def to_micros(timestamp: Timestamp) -> int:
    return timestamp.seconds * 1_000_000 + timestamp.nanos // 1000


def timestamp_problem(timestamp: Timestamp) -> str | None:
    if not MIN_SECONDS <= timestamp.seconds <= MAX_SECONDS:
        return "seconds outside 0001-01-01..9999-12-31"
    if not 0 <= timestamp.nanos <= 999_999_999:
        return "nanos outside 0..999999999"
    return None
