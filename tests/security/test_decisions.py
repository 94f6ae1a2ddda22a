"""The boundary remembers the authorization table's answers per principal
(funnel/runtime/boundary.py, _Decisions): what it remembers is what the table
says, for that principal object only, and the memory stays bounded."""

from __future__ import annotations

from funnel.auth.principal import Principal, Role
from funnel.auth.table import LIFECYCLE, Denied, Granted, authorize
from funnel.runtime.boundary import _Decisions

GET = f"/{LIFECYCLE}/GetTask"
REGISTER = f"/{LIFECYCLE}/RegisterTask"


def test_a_remembered_answer_is_the_tables_for_that_principal_only():
    decisions = _Decisions()
    viewer = Principal("v", {"acme": frozenset({Role.VIEWER})})
    assert decisions.known(viewer, REGISTER, "acme") is None
    denied = decisions.decide(viewer, REGISTER, "acme")
    assert isinstance(denied, Denied) and denied == authorize(viewer, REGISTER, "acme")
    assert decisions.known(viewer, REGISTER, "acme") is denied
    assert decisions.known(viewer, GET, "acme") is None  # another RPC
    assert decisions.known(viewer, REGISTER, "other") is None  # another workspace
    # An equal principal that is another object (another token) is asked anew.
    twin = Principal("v", {"acme": frozenset({Role.VIEWER})})
    assert decisions.known(twin, REGISTER, "acme") is None
    host = Principal("h", {"acme": frozenset({Role.HOST})})
    assert isinstance(decisions.decide(host, REGISTER, "acme"), Granted)


def test_the_memory_is_bounded():
    decisions = _Decisions()
    principals = [Principal(f"p{n}", {"*": frozenset({Role.VIEWER})}) for n in range(_Decisions.LIMIT + 10)]
    for principal in principals:
        decisions.decide(principal, GET, "acme")
    assert len(decisions._known) <= _Decisions.LIMIT
    assert decisions.known(principals[-1], GET, "acme") is not None
