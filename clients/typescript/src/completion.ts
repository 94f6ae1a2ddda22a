// The proto package `funnel.completion.v1`, whichever file of protos/ defines a
// name (its three services, CompletionService, TranscriptService and the
// CompletionGate that external gates implement, share it): the `completion`
// namespace of the package's exports (index.ts). The sources of this client
// import from the generated module that defines a name.
export * from "./gen/funnel/completion/v1/completion_service_pb.js";
export * from "./gen/funnel/completion/v1/completion_messages_pb.js";
export * from "./gen/funnel/completion/v1/transcript_service_pb.js";
export * from "./gen/funnel/completion/v1/transcript_messages_pb.js";
export * from "./gen/funnel/completion/v1/gate_service_pb.js";
export * from "./gen/funnel/completion/v1/gate_messages_pb.js";
export * from "./gen/funnel/completion/v1/types_pb.js";
export * from "./gen/funnel/completion/v1/enums_pb.js";
export * from "./gen/funnel/completion/v1/errors_pb.js";
