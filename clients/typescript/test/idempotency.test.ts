// Request ids against the vectors funnel_mcp/idempotency.py produced
// (tests/contract/request_id_vectors.json; the Python suite checks the same file):
// the derivation, the choice of call identity, and the session's tool arguments.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import { CALL_ID_META_KEY, callIdentity, requestId, type JsonValue } from "../src/index.js";
import { pythonJson } from "../src/idempotency.js";
import { attemptArguments, claimArguments, closeArguments, evidenceArguments } from "../src/session.js";
import { EvidenceVerdict, FinalStatus, RequestedOutcome, RunOutcome } from "../src/gen/funnel/completion/v1/enums_pb.js";

// dist/test/ -> the repository's tests/contract/ unless the environment names the file.
const VECTORS_PATH = process.env.FUNNEL_REQUEST_ID_VECTORS
  ?? fileURLToPath(new URL("../../../../tests/contract/request_id_vectors.json", import.meta.url));

type Arguments = { [key: string]: JsonValue };
interface RequestIdVector { name: string; tool: string; workspace: string; arguments: Arguments; call: string; requestId: string }
interface CallIdentityVector { name: string; metaCallId: unknown; connection: string | null; jsonrpcId: string | number | null; call: string | null }

const file = JSON.parse(readFileSync(VECTORS_PATH, "utf8")) as {
  callIdMetaKey: string; requestIds: RequestIdVector[]; callIdentities: CallIdentityVector[];
};

test("every request id vector", () => {
  assert.ok(file.requestIds.length > 0);
  for (const v of file.requestIds) {
    assert.equal(requestId(v.tool, v.workspace, v.arguments, v.call), v.requestId, v.name);
  }
});

test("every call identity vector, and the _meta key", () => {
  assert.equal(CALL_ID_META_KEY, file.callIdMetaKey);
  assert.ok(file.callIdentities.length > 0);
  for (const v of file.callIdentities) {
    assert.equal(callIdentity(v.metaCallId, v.connection, v.jsonrpcId) ?? null, v.call, v.name);
  }
});

/** The tools' lower-case word back to the enum value (`in_progress` -> IN_PROGRESS). */
function value<E extends Record<string, string | number>>(values: E, word: JsonValue): E[keyof E] {
  const found = values[String(word).toUpperCase() as keyof E];
  assert.equal(typeof found, "number", `no enum value for ${word}`);
  return found;
}
const optional = <T>(x: JsonValue, as: (x: JsonValue) => T): T | undefined => (x === null ? undefined : as(x));
const text = (x: JsonValue) => x as string;
const count = (x: JsonValue) => x as number;

// The session's arguments for each tool-shaped vector, built from typed input,
// are the vector's own: same keys, nulls and words as funnel mcp's tools.
const SESSION_ARGUMENTS: Record<string, (a: Arguments) => Arguments> = {
  claim_task: (a) => claimArguments(text(a.taskId)),
  record_evidence: (a) => evidenceArguments(text(a.runId), {
    kind: text(a.kind), verdict: value(EvidenceVerdict, a.verdict),
    checkpoint: optional(a.checkpoint, text), details: optional(a.details, text),
  }),
  attempt_completion: (a) => attemptArguments(text(a.runId), {
    result: text(a.result), outcome: value(RequestedOutcome, a.outcome), stateVersion: optional(a.stateVersion, count),
  }),
  complete_task: (a) => closeArguments(text(a.runId), {
    outcome: value(RunOutcome, a.outcome), tokensInput: optional(a.tokensInput, count),
    tokensOutput: optional(a.tokensOutput, count), tokensTotal: optional(a.tokensTotal, count),
    notes: optional(a.notes, text), error: optional(a.error, text),
    finalStatus: optional(a.finalStatus, (w) => value(FinalStatus, w)),
  }),
};

test("the session builds each tool's arguments as funnel mcp does", () => {
  const tools = new Set<string>();
  for (const v of file.requestIds.filter((v) => v.tool in SESSION_ARGUMENTS)) {
    assert.deepEqual(SESSION_ARGUMENTS[v.tool](v.arguments), v.arguments, v.name);
    tools.add(v.tool);
  }
  assert.deepEqual([...tools].sort(), Object.keys(SESSION_ARGUMENTS).sort());
  // An attempt's outcome defaults to completed, as the tool's does.
  assert.equal(attemptArguments("run_1", { result: "r" }).outcome, "completed");
});

test("what Python would encode differently is refused, not derived differently", () => {
  assert.throws(() => pythonJson({ x: 1.5 }), RangeError);
  assert.throws(() => pythonJson({ x: 2 ** 53 }), RangeError);
  assert.throws(() => pythonJson({ x: "\ud800" }), RangeError);
  assert.equal(pythonJson({ x: 2n ** 64n }), '{"x":18446744073709551616}');
  assert.equal(pythonJson({ x: "\ud83d\ude00" }), '{"x":"\ud83d\ude00"}');
});
