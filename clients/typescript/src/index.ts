// @funnel/client: generated types and clients for funnel's two services, and
// errorDetails() for their errors. The generated modules are re-exported as
// namespaces because both packages define `ErrorReason`, `ErrorDetails` and `Caller`.
export * as lifecycle from "./gen/funnel/lifecycle/v1/lifecycle_pb.js";
export * as completion from "./gen/funnel/completion/v1/completion_pb.js";
export * as transcript from "./gen/funnel/completion/v1/transcript_pb.js";
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
