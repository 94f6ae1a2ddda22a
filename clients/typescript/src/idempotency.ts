// Request ids derived exactly as `funnel mcp` derives them (funnel_mcp/idempotency.py):
// `mcp-` + the first 40 hex digits of SHA-256 over the compact JSON, keys sorted,
// of {tool, workspace, arguments, call}. The same call (same call id, tool,
// workspace and arguments) gets the same id, so the service answers a repeat with
// the first answer; any difference gives another id. Both implementations are
// checked against one file of vectors made by the Python one
// (tests/contract/request_id_vectors.json).
import { createHash } from "node:crypto";

/** The `_meta` key under which an MCP host passes its own call id. */
export const CALL_ID_META_KEY = "io.funnel/callId";

const PREFIX = "mcp-";

/** What the derivation accepts: JSON without fractions (see `pythonJson`). */
export type JsonValue = string | number | bigint | boolean | null | JsonValue[] | { [key: string]: JsonValue };

/** A host's own name for one call, e.g. the model's tool-use id. */
export type CallId = string | number;

/** A valid service `request_id` (`mcp-` + 40 hex digits) for the call named `call`. */
export function requestId(tool: string, workspace: string, args: { [key: string]: JsonValue }, call: string): string {
  const material = pythonJson({ tool, workspace, arguments: args, call });
  return PREFIX + createHash("sha256").update(material, "utf8").digest("hex").slice(0, 40);
}

/**
 * Which source names a call, as the MCP server picks it: the host's call id
 * (a non-empty string or an integer), else the JSON-RPC id within a connection,
 * else nothing (`undefined`: the call goes without a request id).
 */
export function callIdentity(metaCallId: unknown, connection?: string | null, jsonrpcId?: string | number | null): string | undefined {
  if ((typeof metaCallId === "string" && metaCallId !== "") || Number.isInteger(metaCallId)) {
    return `host:${metaCallId}`;
  }
  if (connection !== undefined && connection !== null) {
    return `connection:${connection}:${jsonrpcId === undefined || jsonrpcId === null ? "None" : jsonrpcId}`;
  }
  return undefined;
}

/**
 * Python's `json.dumps(value, sort_keys=True, separators=(",", ":"),
 * ensure_ascii=False)`. JSON.stringify escapes strings as Python does (`"`, `\`,
 * the short escapes, other controls as lower-case `\u00xx`, nothing else); the
 * differences are handled here: keys sort by code point (not UTF-16 unit),
 * integers of any size print whole, and what Python would print differently or
 * refuse to encode is refused: fractions (Python prints `1.0` and `1e+16` where
 * JavaScript prints `1` and `10000000000000000`) and lone surrogates.
 */
export function pythonJson(value: JsonValue): string {
  if (value === null) return "null";
  if (typeof value === "boolean") return value ? "true" : "false";
  if (typeof value === "bigint") return value.toString();
  if (typeof value === "number") {
    if (!Number.isSafeInteger(value)) throw new RangeError(`only integers below 2^53 are derived alike: ${value}`);
    return String(value);
  }
  if (typeof value === "string") {
    if (LONE_SURROGATE.test(value)) throw new RangeError("a lone surrogate cannot be encoded as UTF-8");
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) return `[${value.map(pythonJson).join(",")}]`;
  const keys = Object.keys(value).sort(byCodePoint);
  return `{${keys.map((key) => `${pythonJson(key)}:${pythonJson(value[key])}`).join(",")}}`;
}

// With the `u` flag a well-formed pair is one code point: only lone halves match.
const LONE_SURROGATE = /\p{Cs}/u;

function byCodePoint(a: string, b: string): number {
  const x = Array.from(a, (c) => c.codePointAt(0)!);
  const y = Array.from(b, (c) => c.codePointAt(0)!);
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    if (x[i] !== y[i]) return x[i] - y[i];
  }
  return x.length - y.length;
}
