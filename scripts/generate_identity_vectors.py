"""Regenerates protos/funnel/completion/v1/identity_vectors.json, the test vectors
that let any language recompute the completion identity (docs/specification.md §5.5).

Usage: python scripts/generate_identity_vectors.py [--check]

Every vector is computed with completion_service.core.identity; tests/completion/
test_identity.py recomputes each one with that module and, independently, with the
`rfc8785` package and hashlib. `--check` exits 1 if the file differs from this output.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from completion_service.core.gates import DECISION_SCHEMA  # noqa: E402
from completion_service.core.identity import (  # noqa: E402
    IDENTITY_SCHEMA,
    IdentityInput,
    completion_identity,
    identity_payload,
)

VECTORS_PATH = ROOT / "protos" / "funnel" / "completion" / "v1" / "identity_vectors.json"
MAX_SAFE_INTEGER = 2**53 - 1

DESCRIPTION = [
    "Test vectors for the completion identity of funnel.completion.v1 (message CompletionIdentity).",
    "Algorithm: build the JSON object `input` with exactly the keys schema, workspace_id, task_id, generation, "
    "state_version, checkpoint, outcome and decision_schema (generation and state_version are JSON numbers, "
    "integers in 0..2^53-1; every other value is a string).",
    "Serialize it with RFC 8785 (JSON Canonicalization Scheme): no whitespace, object members sorted by the "
    "UTF-16 code units of their names, strings escaped only where required (quote, backslash, and U+0000..U+001F "
    "as \\b \\f \\n \\r \\t or lowercase \\u00xx; everything else, including '/', U+007F, U+2028 and non-ASCII, "
    "is written as is), no Unicode normalization.",
    "Encode that text as UTF-8 (`canonical_json_utf8_hex` shows the exact bytes), take SHA-256, and write the "
    "digest as lowercase hex prefixed with 'sha256:'. The result is `identity`.",
    "`canonical_json` is the canonical text as a JSON string value of this file; compare bytes, not parsed "
    "objects. Vectors with control characters in `checkpoint` demonstrate the encoding only: the service "
    "refuses ids containing control characters.",
]


def _input(
    *,
    workspace_id: str = "acme",
    task_id: str = "task-1",
    generation: int = 1,
    state_version: int = 1,
    checkpoint: str = "cp-1",
    outcome: str = "COMPLETED",
    decision_schema: str = DECISION_SCHEMA,
) -> IdentityInput:
    return IdentityInput(workspace_id, task_id, generation, state_version, checkpoint, outcome, decision_schema)


# (name, note, input): the note says what the vector demonstrates.
CASES: tuple[tuple[str, str, IdentityInput], ...] = (
    ("ascii-completed", "plain ASCII, generation 1, COMPLETED", _input()),
    ("ascii-failed", "the same fields with outcome FAILED: a different identity", _input(outcome="FAILED")),
    (
        "empty-checkpoint",
        "no checkpoint yet: the empty string, state version 0",
        _input(checkpoint="", state_version=0),
    ),
    (
        "empty-checkpoint-failed",
        "empty checkpoint with a FAILED outcome",
        _input(task_id="task-2", checkpoint="", state_version=3, outcome="FAILED"),
    ),
    (
        "large-generation",
        "generation 2^53-1, the largest integer RFC 8785 represents exactly",
        _input(generation=MAX_SAFE_INTEGER, state_version=42),
    ),
    (
        "large-state-version",
        "state version 2^53-1 at a multi-digit generation",
        _input(generation=12, state_version=MAX_SAFE_INTEGER, checkpoint="cp-9000"),
    ),
    (
        "large-both-failed",
        "both integers large (2^53-1 and 2^32), FAILED",
        _input(generation=2**32, state_version=MAX_SAFE_INTEGER, outcome="FAILED", checkpoint="cp-z"),
    ),
    (
        "unicode-accents",
        "precomposed (NFC) accented letters in ids and checkpoint, written as raw UTF-8",
        _input(workspace_id="café", task_id="tâche-été", checkpoint="point-de-contrôle-ü"),
    ),
    (
        "unicode-decomposed-checkpoint",
        "unicode-accents' checkpoint in decomposed form (o + U+0302, u + U+0308): JCS does not normalize",
        _input(workspace_id="café", task_id="tâche-été", checkpoint="point-de-contro\u0302le-u\u0308"),
    ),
    (
        "unicode-cjk",
        "CJK ids and checkpoint (3-byte UTF-8)",
        _input(workspace_id="工作区", task_id="任务-七", checkpoint="检查点-三", generation=7, state_version=19),
    ),
    (
        "unicode-non-bmp",
        "emoji and other non-BMP characters (4-byte UTF-8, surrogate pairs in UTF-16), never escaped",
        _input(task_id="rocket-\U0001f680", checkpoint="\U0001f600 ok \U0001d11e", generation=2, state_version=5),
    ),
    (
        "escape-quote-backslash",
        "a quote and backslashes: the only printable characters JCS escapes",
        _input(checkpoint='say "hi" C:\\work\\cp', state_version=8),
    ),
    (
        "escape-control-short",
        "control characters with short escapes: \\b \\t \\n \\f \\r",
        _input(checkpoint="a\bb\tc\nd\fe\rf", state_version=9),
    ),
    (
        "escape-control-unicode",
        "control characters without a short escape: lowercase \\u00xx (U+0000, U+0001, U+001F)",
        _input(checkpoint="nul\u0000one\u0001unit\u001fend", state_version=10),
    ),
    (
        "no-escape-needed",
        "'/', U+007F, U+2028 and U+2029 are written as is",
        _input(checkpoint="a/b\u007fc\u2028d\u2029e", state_version=11),
    ),
)


def build() -> dict[str, object]:
    vectors = []
    for name, note, identity_input in CASES:
        payload = identity_payload(identity_input)
        vectors.append(
            {
                "name": name,
                "note": note,
                "input": identity_input.document(),
                "canonical_json": payload.decode("utf-8"),
                "canonical_json_utf8_hex": payload.hex(),
                "identity": completion_identity(identity_input),
            }
        )
    return {
        "description": DESCRIPTION,
        "schema": IDENTITY_SCHEMA,
        "vectors": vectors,
    }


def render() -> str:
    return json.dumps(build(), ensure_ascii=False, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed file is not this output")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = VECTORS_PATH.read_text(encoding="utf-8") if VECTORS_PATH.exists() else None
        if current != text:
            print(f"{VECTORS_PATH} is stale; run scripts/generate_identity_vectors.py", file=sys.stderr)
            return 1
        return 0
    VECTORS_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {len(CASES)} vectors to {VECTORS_PATH.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
