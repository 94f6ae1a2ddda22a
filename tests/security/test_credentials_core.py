"""The pure and library-backed pieces of the trust boundary, without servers:
token verification (signature, expiry, audience, issuer, key ids, algorithms),
permission parsing, the authorization decision, the rate limiter, the id rule."""

from __future__ import annotations

import json

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from funnel.auth.principal import Principal, Role, parse_permissions
from funnel.auth.table import Denied, Granted, authorize
from funnel.auth.tokens import (
    KeySetError,
    Problem,
    SigningKey,
    TokenVerifier,
    Unauthenticated,
    bearer_token,
    load_key_set,
)
from funnel.runtime.ratelimit import RateLimiter
from funnel.runtime.validation import id_problem

SERVICE = "spiffe://funnel.local/funnel/completion-service"
NOW = 1_800_000_000.0


def verifier_for(*keys: SigningKey, service_by_token: bool = True, clock=lambda: NOW) -> TokenVerifier:
    key_set = jwt.PyJWKSet.from_dict({"keys": [k for key in keys for k in key.jwks()["keys"]]})
    return TokenVerifier(key_set, "funnel", "funnel", lambda w: id_problem(w) is None, SERVICE, service_by_token, clock)


@pytest.fixture(params=["EdDSA", "ES256"])
def key(request) -> SigningKey:
    if request.param == "EdDSA":
        return SigningKey.generate()
    return SigningKey(ec.generate_private_key(ec.SECP256R1()), "ec-key")


def problem_of(verifier: TokenVerifier, token: str, **kw) -> Problem:
    with pytest.raises(Unauthenticated) as caught:
        verifier.verify(token, **kw)
    return caught.value.problem


def test_a_valid_token_yields_its_subject_and_grants(key):
    verifier = verifier_for(key)
    principal = verifier.verify(key.issue("alice", ["acme:host", "*:viewer", "beta:agent"], 60, now=NOW))
    assert principal.subject == "alice"
    assert principal.roles_in("acme") == {Role.HOST, Role.VIEWER}
    assert principal.roles_in("beta") == {Role.AGENT, Role.VIEWER}
    assert principal.roles_in("gamma") == {Role.VIEWER}


@pytest.mark.parametrize(
    "issue, problem",
    [
        (lambda k: k.issue("a", [], 60, now=NOW - 3600), Problem.EXPIRED),
        (lambda k: k.issue("a", [], 60, now=NOW - 60 - 29), None),  # within the 30 s leeway
        (lambda k: k.issue("a", [], 60, now=NOW + 120), Problem.INVALID),  # nbf in the future
        (lambda k: k.issue("a", [], 60, now=NOW, audience="other"), Problem.INVALID),
        (lambda k: k.issue("a", [], 60, now=NOW, issuer="someone-else"), Problem.INVALID),
        (lambda k: SigningKey.generate().issue("a", [], 60, now=NOW), Problem.INVALID),  # unknown key id
        (
            lambda k: SigningKey(SigningKey.generate().private_key, k.key_id).issue("a", [], 60, now=NOW),
            Problem.INVALID,
        ),
        (lambda k: k.issue("", [], 60, now=NOW), Problem.INVALID),  # empty subject
        (lambda k: "not.a.token", Problem.INVALID),
    ],
)
def test_bad_tokens_are_refused_with_their_problem(key, issue, problem):
    verifier = verifier_for(key)
    if problem is None:
        assert verifier.verify(issue(key)).subject == "a"
    else:
        assert problem_of(verifier, issue(key)) is problem


def test_a_token_signed_with_another_algorithm_is_refused(key):
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    claims = {"iss": "funnel", "aud": "funnel", "sub": "a", "exp": NOW + 60, "permissions": []}
    forged = jwt.encode(claims, rsa_key, algorithm="RS256", headers={"kid": key.key_id})
    assert problem_of(verifier_for(key), forged) is Problem.INVALID
    unsigned = jwt.encode(claims, None, algorithm="none", headers={"kid": key.key_id})
    assert problem_of(verifier_for(key), unsigned) is Problem.INVALID


def test_a_cached_token_still_expires(key):
    now = [NOW]
    verifier = verifier_for(key, clock=lambda: now[0])
    token = key.issue("a", [], 60, now=NOW)
    assert verifier.verify(token).subject == "a"
    now[0] = NOW + 60 + 31
    assert problem_of(verifier, token) is Problem.EXPIRED


def test_replacing_the_key_set_revokes_cached_tokens(key):
    verifier = verifier_for(key)
    token = key.issue("a", [], 60, now=NOW)
    verifier.verify(token)
    verifier.replace_keys(jwt.PyJWKSet.from_dict(SigningKey.generate().jwks()))
    assert problem_of(verifier, token) is Problem.INVALID


# -- the times of a token ----------------------------------------------------------
#
# `exp`, `nbf` and `iat` are finite numbers from 1970 to the end of 9999; JSON
# texts PyJWT's parser accepts beyond that (NaN, Infinity, 1e999 = inf) are
# written here as raw payload text, since no JSON encoder emits all of them.


def signed(key: SigningKey, times: str, subject: str = '"a"') -> str:
    """A token whose payload is this JSON text (times: raw `"exp": …` members)."""
    payload = f'{{"iss":"funnel","aud":"funnel","sub":{subject},"permissions":[],{times}}}'
    return jwt.api_jws.PyJWS().encode(
        payload.encode(), key.private_key, algorithm=key.algorithm, headers={"kid": key.key_id}
    )


EXP = int(NOW) + 60
LAST_SECOND = 253_402_300_799  # 9999-12-31T23:59:59Z


@pytest.mark.parametrize(
    "times, problem",
    [
        (f'"exp":{EXP}', None),
        (f'"exp":{EXP}.5,"nbf":{int(NOW)}.25,"iat":{int(NOW)}', None),
        (f'"exp":{LAST_SECOND}', None),
        ('"exp":0', Problem.EXPIRED),  # in range, long past
        # Not finite: PyJWT reads these as float nan / inf.
        ('"exp":NaN', Problem.INVALID),
        ('"exp":1e999', Problem.INVALID),
        ('"exp":Infinity', Problem.INVALID),
        ('"exp":-1e999', Problem.INVALID),
        ('"exp":-Infinity', Problem.INVALID),
        # Finite, but not a time of years 1970..9999.
        ('"exp":1e300', Problem.INVALID),
        (f'"exp":{LAST_SECOND + 1}', Problem.INVALID),
        (f'"exp":{10**400}', Problem.INVALID),
        ('"exp":-1', Problem.INVALID),
        # Not numbers.
        ('"exp":true', Problem.INVALID),
        ('"exp":false', Problem.INVALID),
        (f'"exp":"{EXP}"', Problem.INVALID),
        ('"exp":null', Problem.INVALID),
        (f'"exp":[{EXP}]', Problem.INVALID),
        ('"exp":{}', Problem.INVALID),
        # nbf and iat: checked the same way when present.
        (f'"exp":{EXP},"nbf":NaN', Problem.INVALID),
        (f'"exp":{EXP},"nbf":-1e999', Problem.INVALID),
        (f'"exp":{EXP},"nbf":1e999', Problem.INVALID),
        (f'"exp":{EXP},"nbf":-5', Problem.INVALID),
        (f'"exp":{EXP},"nbf":true', Problem.INVALID),
        (f'"exp":{EXP},"nbf":"0"', Problem.INVALID),
        (f'"exp":{EXP},"iat":NaN', Problem.INVALID),
        (f'"exp":{EXP},"iat":1e999', Problem.INVALID),
        (f'"exp":{EXP},"iat":1e300', Problem.INVALID),
        (f'"exp":{EXP},"iat":-1', Problem.INVALID),
        (f'"exp":{EXP},"iat":false', Problem.INVALID),
        (f'"exp":{EXP},"iat":"now"', Problem.INVALID),
        (f'"exp":{EXP},"iat":null', Problem.INVALID),
    ],
)
def test_token_times_are_finite_numbers_of_years_1970_to_9999(key, times, problem):
    verifier = verifier_for(key)
    token = signed(key, times)
    # Asked again and again: the verification cache gives the same answer each time.
    for _ in range(4):
        if problem is None:
            assert verifier.verify(token).subject == "a"
        else:
            assert problem_of(verifier, token) is problem


def test_the_cache_answers_as_a_fresh_verification_would(key):
    """A cached token is refused whenever verifying it afresh would refuse it:
    before its `nbf` (a clock that moved back), after its `exp`."""
    now = [NOW]
    cached = verifier_for(key, clock=lambda: now[0])
    token = key.issue("a", [], 3600, now=NOW)
    assert cached.verify(token).subject == "a"
    for moment in (NOW - 600, NOW + 10, NOW + 3600 + 31, NOW + 10):
        now[0] = moment
        fresh = verifier_for(key, clock=lambda: now[0])
        try:
            want: Problem | str = fresh.verify(token).subject
        except Unauthenticated as refused:
            want = refused.problem
        try:
            got: Problem | str = cached.verify(token).subject
        except Unauthenticated as refused:
            got = refused.problem
        assert got == want, moment


# -- the subject of a token ---------------------------------------------------------

SAFE_SUBJECTS = [
    "a",
    "host-1",
    "host@acme",
    "operator@*",
    "demo-agent",
    "user+tag@example.com",
    "auth0|5f7c8ec7c33c6c004bb",
    "spiffe://funnel.local/funnel/completion-service",
    "repo:octo-org/octo-repo:ref:refs/heads/main",
    "system:serviceaccount:ns:name",
    "urn:uuid:6e8bc430-9c3a-11d9-9669-0800200c9a66",
    "a%2Fb",
    "x=1;y=(2),[3]!$&'",
    "~_.",
    "x" * 255,
]
UNSAFE_SUBJECTS = [
    "",
    "a\nb",
    "a\rb",
    "line\n2026-01-01 INFO forged",
    "a\x00",
    "\x00",
    "a\tb",
    "a b",
    "a\x7f",
    "a\x85b",
    "a\u202eb",
    "a\u2066b",
    "a\u200bb",
    "a\u2028b",
    "\ufeffa",
    "a\u00a0b",
    "t\u00e2che",
    "\u30bf\u30b9\u30af",
    "\U0001f600",
    'a"b',
    "a\\b",
    "<script>",
    "a`b",
    "a^b",
    "a{b}",
    "x" * 256,
]


@pytest.mark.parametrize("subject", SAFE_SUBJECTS)
def test_a_subject_of_the_safe_set_is_taken_as_it_is(key, subject):
    assert verifier_for(key).verify(key.issue(subject, [], 60, now=NOW)).subject == subject


@pytest.mark.parametrize("subject", UNSAFE_SUBJECTS)
def test_a_subject_outside_the_safe_set_is_refused(key, subject):
    verifier = verifier_for(key)
    token = key.issue(subject, [], 60, now=NOW)
    for _ in range(2):  # the cache never holds it
        with pytest.raises(Unauthenticated) as caught:
            verifier.verify(token)
        assert caught.value.problem is Problem.INVALID
        # The refusal names the character by its code point, never repeats it.
        assert caught.value.message.isprintable() and caught.value.message.isascii()


@pytest.mark.parametrize("subject", ["7", "null", '["a"]', '{"a":1}', "true"])
def test_a_subject_that_is_not_a_string_is_refused(key, subject):
    assert problem_of(verifier_for(key), signed(key, f'"exp":{EXP}', subject=subject)) is Problem.INVALID


def test_the_completion_service_role_comes_from_identity_not_from_permissions(key):
    by_token = verifier_for(key, service_by_token=True)
    by_certificate = verifier_for(key, service_by_token=False)
    service_token = key.issue(SERVICE, [], 60, now=NOW)
    assert by_token.verify(service_token).roles_in("any") == {Role.COMPLETION_SERVICE}
    # Where client certificates are verified, the token alone proves nothing...
    assert by_certificate.verify(service_token).roles_in("any") == set()
    # ...and with the certificate it does; a token of another subject is refused.
    assert by_certificate.verify(service_token, certified=SERVICE).roles_in("any") == {Role.COMPLETION_SERVICE}
    assert (
        problem_of(by_certificate, key.issue("alice", ["*:operator"], 60, now=NOW), certified=SERVICE)
        is Problem.INVALID
    )
    # No permission entry grants the role.
    assert by_token.verify(key.issue("mallory", ["*:completion-service"], 60, now=NOW)).roles_in("x") == set()


def test_permissions_that_are_not_workspace_role_pairs_grant_nothing():
    grants = parse_permissions(
        ["acme:host", "acme", "a/b:host", ":host", "acme:root", 7, None, "x:y:viewer", "*:agent"],
        lambda w: id_problem(w) is None,
    )
    assert grants == {"acme": {Role.HOST}, "x:y": {Role.VIEWER}, "*": {Role.AGENT}}


@pytest.mark.parametrize(
    "header, problem",
    [
        ([], Problem.MISSING),
        ([("authorization", "Basic dXNlcjpwYXNz")], Problem.INVALID),
        ([("authorization", "Bearer ")], Problem.INVALID),
        ([("authorization", "bearer abc")], None),
    ],
)
def test_the_bearer_header(header, problem):
    if problem is None:
        assert bearer_token(header) == "abc"
        return
    with pytest.raises(Unauthenticated) as caught:
        bearer_token(header)
    assert caught.value.problem is problem


def test_a_key_set_with_other_algorithms_is_refused(tmp_path):
    rsa_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa.generate_private_key(65537, 2048).public_key()))
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [{**rsa_jwk, "kid": "r", "alg": "RS256"}]}))
    with pytest.raises(KeySetError, match="other algorithms"):
        load_key_set(path)
    path.write_text("{not json")
    with pytest.raises(KeySetError):
        load_key_set(path)


# -- the authorization decision ------------------------------------------------------


def principal(**grants: set[Role]) -> Principal:
    return Principal("p", {workspace.replace("ALL", "*"): frozenset(roles) for workspace, roles in grants.items()})


LIFECYCLE = "/funnel.lifecycle.v1.TaskLifecycleService"
COMPLETION = "/funnel.completion.v1.CompletionService"


@pytest.mark.parametrize(
    "who, method, workspace, want",
    [
        (principal(acme={Role.HOST}), f"{LIFECYCLE}/RegisterTask", "acme", Granted(Role.HOST, False)),
        (principal(acme={Role.HOST}), f"{LIFECYCLE}/RegisterTask", "beta", Denied("WORKSPACE_NOT_GRANTED", "")),
        (principal(ALL={Role.OPERATOR}), f"{LIFECYCLE}/SettleCompletion", "acme", Denied("ROLE_NOT_PERMITTED", "")),
        (principal(acme={Role.AGENT}), f"{COMPLETION}/AttemptCompletion", "acme", Granted(Role.AGENT, True)),
        (principal(acme={Role.AGENT, Role.HOST}), f"{COMPLETION}/AttemptCompletion", "acme", Granted(Role.HOST, False)),
        (
            principal(acme={Role.VIEWER}, ALL={Role.AGENT}),
            f"{COMPLETION}/ListRuns",
            "acme",
            Granted(Role.VIEWER, False),
        ),
        (
            principal(ALL={Role.OPERATOR}),
            "/funnel.completion.v1.CompletionService/Unlisted",
            "acme",
            Denied("ROLE_NOT_PERMITTED", ""),
        ),
    ],
)
def test_the_authorization_decision(who, method, workspace, want):
    got = authorize(who, method, workspace)
    if isinstance(want, Granted):
        assert got == want
    else:
        assert isinstance(got, Denied) and got.reason == want.reason


# -- rates and ids -----------------------------------------------------------------------


def test_the_token_bucket_allows_a_burst_then_the_rate():
    now = [0.0]
    limiter = RateLimiter(rate=10, burst=3, clock=lambda: now[0])
    assert [limiter.take("a") for _ in range(3)] == [None, None, None]
    assert limiter.take("a") == pytest.approx(0.1)
    assert limiter.take("b") is None  # per caller
    now[0] = 0.1
    assert limiter.take("a") is None
    assert limiter.take("a") == pytest.approx(0.1)


@pytest.mark.parametrize(
    "value, ok",
    [
        ("acme", True),
        ("run_0f3a", True),
        ("reopen:s1:2", True),
        ("a.b", True),
        ("user@host", True),
        ("a+b=c~d", True),
        ("t\u00e2che", True),
        ("\u30bf\u30b9\u30af", True),
        ("a/b", False),
        ("..", False),
        ("a..b", False),
        ("a\\b", False),
        ("a b", False),
        ("a\x00", False),
        ("a\u200bb", False),
        ("\U0001f600", False),
        ("e\u0301", False),
        ("x" * 129, False),
        ("%2F", False),
    ],
)
def test_the_id_rule(value, ok):
    assert (id_problem(value) is None) is ok
