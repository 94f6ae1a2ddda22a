"""Input checks shared by both services. Pure: values in, violations out.

Violations are named by the generic input reasons that every catalogue defines
(`FIELD_REQUIRED`, `FIELD_MALFORMED`, `FIELD_TOO_LONG`, `ENUM_UNSPECIFIED`,
`VALUE_OUT_OF_RANGE`), so each service maps them onto its own catalogue.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from funnel.runtime.errors import FieldViolation, Rejection, ServiceError

MAX_ID_LENGTH = 128
# Integers in the contract stay within IEEE-754's exact range so that every JSON
# implementation (and the RFC 8785 completion identity) reads them unchanged.
MAX_SAFE_INTEGER = 2**53 - 1


@dataclass(frozen=True)
class Violation:
    kind: str
    field: str
    description: str
    limits: tuple[tuple[str, str], ...] = ()


# Besides letters, marks and digits of any script: ASCII punctuation that is
# safe in paths, URLs, headers and logs. No `/`, `\\`, quotes, spaces, control
# or format characters, and no `..`.
ID_PUNCTUATION = frozenset("-_.:@+=~")
_ASCII_ID = re.compile(r"[A-Za-z0-9\-_.:@+=~]*")


def id_problem(value: str) -> str | None:
    """Why `value` is not a valid id, or None. Ids are 1..128 code points in NFC,
    each a letter (L*), mark (M*), digit (N*) or one of `-_.:@+=~`, with no `..`."""
    if len(value) > MAX_ID_LENGTH:
        return f"longer than {MAX_ID_LENGTH} characters"
    # In ASCII the letters, marks and digits are A-Z, a-z and 0-9, and every string is
    # NFC: one regular expression decides the usual id without asking Unicode per character.
    ascii_id = value.isascii() and _ASCII_ID.fullmatch(value) is not None
    if not ascii_id:
        for ch in value:
            if ch not in ID_PUNCTUATION and unicodedata.category(ch)[0] not in "LMN":
                return f"contains U+{ord(ch):04X}; ids hold letters, marks, digits and -_.:@+=~ only"
    if ".." in value:
        return "contains '..'"
    if not ascii_id and not unicodedata.is_normalized("NFC", value):
        return "is not in Unicode NFC form"
    return None


class Checker:
    """Collects every violation of one request, in field order."""

    def __init__(self) -> None:
        self.violations: list[Violation] = []

    def add(self, kind: str, field: str, description: str, **limits: object) -> None:
        self.violations.append(Violation(kind, field, description, tuple((k, str(v)) for k, v in limits.items())))

    def identifier(self, field: str, value: str, *, required: bool = True) -> None:
        if not value:
            if required:
                self.add("FIELD_REQUIRED", field, f"{field} is required")
            return
        if len(value) > MAX_ID_LENGTH:
            self.add(
                "FIELD_TOO_LONG", field, f"{field} is longer than {MAX_ID_LENGTH} characters", max_length=MAX_ID_LENGTH
            )
            return
        problem = id_problem(value)
        if problem:
            self.add("FIELD_MALFORMED", field, f"{field} {problem}")

    def text(self, field: str, value: str, max_length: int, *, required: bool = False) -> None:
        if not value:
            if required:
                self.add("FIELD_REQUIRED", field, f"{field} is required")
            return
        if len(value) > max_length:
            self.add("FIELD_TOO_LONG", field, f"{field} is longer than {max_length} characters", max_length=max_length)

    def integer(self, field: str, value: int, minimum: int, maximum: int = MAX_SAFE_INTEGER) -> None:
        if not minimum <= value <= maximum:
            self.add(
                "VALUE_OUT_OF_RANGE",
                field,
                f"{field} must be between {minimum} and {maximum}",
                minimum=minimum,
                maximum=maximum,
            )

    def enum(self, field: str, value: int, allowed: Iterable[int], *, required: bool = True) -> None:
        if value == 0 and not required:
            return
        if value not in set(allowed):
            self.add("ENUM_UNSPECIFIED", field, f"{field} must be one of the documented values")

    def require(self, field: str, present: bool) -> None:
        if not present:
            self.add("FIELD_REQUIRED", field, f"{field} is required")

    def malformed(self, field: str, description: str) -> None:
        self.add("FIELD_MALFORMED", field, description)

    def raise_for(self, catalogue: type[Enum]) -> None:
        """Raises one error for every violation so far (ErrorInfo names the first;
        BadRequest lists all), using the service's catalogue."""
        if not self.violations:
            return
        first = self.violations[0]
        more = len(self.violations) - 1
        raise ServiceError(
            Rejection(
                catalogue[first.kind],
                first.description + (f" (and {more} more)" if more else ""),
                {"field": first.field, **dict(first.limits)},
                tuple(FieldViolation(v.field, v.description) for v in self.violations),
            )
        )


def malformed_page_token(catalogue: type[Enum]) -> ServiceError:
    return ServiceError(
        Rejection(
            catalogue["FIELD_MALFORMED"],
            "page_token was not issued for this listing",
            {"field": "page_token"},
            (FieldViolation("page_token", "page_token was not issued for this listing"),),
        )
    )
