// The proto package `funnel.lifecycle.v1`, whichever file of protos/ defines a
// name: the `lifecycle` namespace of the package's exports (index.ts). The
// sources of this client import from the generated module that defines a name.
export * from "./gen/funnel/lifecycle/v1/service_pb.js";
export * from "./gen/funnel/lifecycle/v1/messages_pb.js";
export * from "./gen/funnel/lifecycle/v1/types_pb.js";
export * from "./gen/funnel/lifecycle/v1/enums_pb.js";
export * from "./gen/funnel/lifecycle/v1/errors_pb.js";
