// @funnel/client: generated types and clients for funnel's two services,
// errorDetails() for their errors, a session object for a claimed run and the
// request ids `funnel mcp` derives. The generated code is exported as one
// namespace per proto package (`lifecycle`: funnel.lifecycle.v1, `completion`:
// funnel.completion.v1) because both packages define `ErrorReason`,
// `ErrorDetails` and `Caller`.
export * as lifecycle from "./lifecycle.js";
export * as completion from "./completion.js";
export * as rpc from "./gen/google/rpc/error_details_pb.js";
export {
  bearer,
  completionClient,
  createFunnelTransport,
  lifecycleClient,
  transcriptClient,
  type CompletionClient,
  type FunnelTransportOptions,
  type LifecycleClient,
  type TokenSource,
  type TranscriptClient,
} from "./connect.js";
export { errorDetails, type FunnelErrorDetails } from "./errors.js";
// The error class and codes of the Connect copy this package was built and tested
// with: `instanceof` against another copy of @connectrpc/connect would be false.
export { Code, ConnectError } from "@connectrpc/connect";
export { callIdentity, CALL_ID_META_KEY, requestId, type CallId, type JsonValue } from "./idempotency.js";
export {
  claimTask,
  resumeRun,
  RunSession,
  type AttemptInput,
  type ClaimInput,
  type CloseInput,
  type EvidenceInput,
  type SessionCallOptions,
} from "./session.js";
