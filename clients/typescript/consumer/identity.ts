// The completion identity, recomputed as the protos describe it (message
// CompletionIdentity, identity_vectors.json): SHA-256 over the RFC 8785 (JCS)
// JSON of eight fields, as `sha256:<hex>`. Shared by the vector test (test/) and
// the story that the consumer project runs against the installed package.
import { createHash } from "node:crypto";
import canonicalize from "canonicalize";

export interface IdentityInput {
  schema: string;
  workspace_id: string;
  task_id: string;
  generation: number;
  state_version: number;
  checkpoint: string;
  outcome: string;
  decision_schema: string;
}

export const IDENTITY_KEYS = [
  "schema", "workspace_id", "task_id", "generation", "state_version", "checkpoint", "outcome", "decision_schema",
];

export function canonicalBytes(input: IdentityInput): Buffer {
  const text = canonicalize(input);
  if (text === undefined) throw new Error("canonicalize returned nothing");
  return Buffer.from(text, "utf8");
}

export function identity(input: IdentityInput): string {
  return `sha256:${createHash("sha256").update(canonicalBytes(input)).digest("hex")}`;
}

/** int64 fields are bigint in protobuf-es; the identity wants JSON numbers below 2^53. */
export function jsonNumber(value: bigint): number {
  if (value < 0n || value > BigInt(Number.MAX_SAFE_INTEGER)) throw new RangeError(`${value} is not below 2^53`);
  return Number(value);
}
