// Recomputes every vector of protos/funnel/completion/v1/identity_vectors.json
// with an RFC 8785 library from npm (canonicalize) and node:crypto.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import { canonicalBytes, identity, IDENTITY_KEYS, type IdentityInput } from "../consumer/identity.js";

// dist/test/ -> the repository's protos/ unless the environment names the file.
const VECTORS_PATH = process.env.FUNNEL_IDENTITY_VECTORS
  ?? fileURLToPath(new URL("../../../../protos/funnel/completion/v1/identity_vectors.json", import.meta.url));

interface Vector {
  name: string;
  input: IdentityInput;
  canonical_json: string;
  canonical_json_utf8_hex: string;
  identity: string;
}

const file = JSON.parse(readFileSync(VECTORS_PATH, "utf8")) as { schema: string; vectors: Vector[] };

test("the vector file has vectors of the documented shape", () => {
  assert.equal(file.schema, "funnel.completion.identity/v1");
  assert.ok(file.vectors.length > 0);
  for (const vector of file.vectors) {
    assert.deepEqual(Object.keys(vector.input).sort(), [...IDENTITY_KEYS].sort(), vector.name);
    assert.equal(vector.input.schema, file.schema, vector.name);
  }
});

for (const vector of file.vectors) {
  test(`identity vector ${vector.name}`, () => {
    const bytes = canonicalBytes(vector.input);
    assert.equal(bytes.toString("hex"), vector.canonical_json_utf8_hex, "canonical bytes");
    assert.equal(bytes.toString("utf8"), vector.canonical_json, "canonical text");
    assert.equal(identity(vector.input), vector.identity, "identity");
  });
}
