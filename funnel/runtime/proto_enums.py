"""Core enum values as the contract's enum types.

The cores' Enum members carry the contract's numbers as their values. The
generated stubs (`*_pb2.pyi`) type a contract enum's values as instances of an
int subclass, while at run time they are plain ints; `proto_enum` states the
conversion once, so that converters need no casts of their own.
"""

from __future__ import annotations

from typing import TypeVar, cast

E = TypeVar("E", bound=int)


def proto_enum(enum_type: type[E], number: int) -> E:
    """`number` as a value of the generated enum `enum_type` (unchanged at run time)."""
    return cast(E, number)
