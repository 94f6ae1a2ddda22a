// errorDetails() on errors shaped like the wire delivers them, without services
// (the story test decodes real ones; RATE_LIMITED is hard to provoke there).
import assert from "node:assert/strict";
import { test } from "node:test";
import { create, toBinary } from "@bufbuild/protobuf";
import { DurationSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import { errorDetails } from "../src/index.js";
import { ErrorInfoSchema, RetryInfoSchema } from "../src/gen/google/rpc/error_details_pb.js";

test("RATE_LIMITED: ErrorInfo and RetryInfo as they arrive in grpc-status-details-bin", () => {
  const error = new ConnectError("rate limit exceeded", Code.ResourceExhausted);
  // What Connect's gRPC transport makes of the trailer's google.rpc.Status details.
  error.details = [
    {
      type: "google.rpc.ErrorInfo",
      value: toBinary(ErrorInfoSchema, create(ErrorInfoSchema, {
        reason: "RATE_LIMITED", domain: "funnel.completion.v1", metadata: { limit_per_second: "1000", burst: "2000" },
      })),
    },
    {
      type: "google.rpc.RetryInfo",
      value: toBinary(RetryInfoSchema, create(RetryInfoSchema, {
        retryDelay: create(DurationSchema, { seconds: 0n, nanos: 250_000_000 }),
      })),
    },
  ];
  const details = errorDetails(error);
  assert.equal(details.code, Code.ResourceExhausted);
  assert.equal(details.codeName, "RESOURCE_EXHAUSTED");
  assert.equal(details.message, "rate limit exceeded");
  assert.equal(details.reason, "RATE_LIMITED");
  assert.equal(details.errorInfo?.metadata.burst, "2000");
  assert.equal(details.retryInfo?.retryDelay?.nanos, 250_000_000);
  assert.equal(details.badRequest, undefined);
});

test("an error that is not from a call: UNKNOWN, no details", () => {
  const details = errorDetails(new TypeError("boom"));
  assert.equal(details.codeName, "UNKNOWN");
  assert.equal(details.reason, "");
  assert.equal(details.errorInfo, undefined);
});
