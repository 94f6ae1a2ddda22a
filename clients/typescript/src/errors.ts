// Decodes the error model of both services: the `grpc-status-details-bin`
// trailer is a google.rpc.Status whose details hold exactly one
// google.rpc.ErrorInfo, a google.rpc.BadRequest with INVALID_ARGUMENT and a
// google.rpc.RetryInfo with RATE_LIMITED (see `ErrorDetails` in the protos).
import { Code, ConnectError } from "@connectrpc/connect";
import {
  BadRequestSchema,
  ErrorInfoSchema,
  RetryInfoSchema,
  type BadRequest,
  type ErrorInfo,
  type RetryInfo,
} from "./gen/google/rpc/error_details_pb.js";

export interface FunnelErrorDetails {
  /** The gRPC status code (Connect's `Code` has the same numbers). */
  code: Code;
  /** The gRPC name of the code, e.g. `FAILED_PRECONDITION`. */
  codeName: string;
  /** The server's message, for people. */
  message: string;
  /** `errorInfo.reason` (an `ErrorReason` name, e.g. `RUN_ALREADY_FINISHED`); "" without ErrorInfo. */
  reason: string;
  /** Domain `funnel.lifecycle.v1` or `funnel.completion.v1`, reason, metadata. */
  errorInfo?: ErrorInfo;
  /** With INVALID_ARGUMENT: one violation per offending field. */
  badRequest?: BadRequest;
  /** With RATE_LIMITED: `retryDelay` says how long to wait. */
  retryInfo?: RetryInfo;
}

/** The gRPC names of the codes, indexed by number. */
const CODE_NAMES = [
  "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
  "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
  "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
  "UNAUTHENTICATED",
];

/**
 * The status and decoded details of an error thrown by a funnel client call.
 * Accepts anything: an error that is not a ConnectError (a bug in the caller,
 * a network failure) comes back with code UNKNOWN (or the code Connect gave it)
 * and no details.
 */
export function errorDetails(error: unknown): FunnelErrorDetails {
  const connectError = ConnectError.from(error);
  const errorInfo = connectError.findDetails(ErrorInfoSchema)[0];
  return {
    code: connectError.code,
    codeName: CODE_NAMES[connectError.code] ?? String(connectError.code),
    message: connectError.rawMessage,
    reason: errorInfo?.reason ?? "",
    errorInfo,
    badRequest: connectError.findDetails(BadRequestSchema)[0],
    retryInfo: connectError.findDetails(RetryInfoSchema)[0],
  };
}
