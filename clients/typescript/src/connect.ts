// Transports and clients for the two services: Connect's gRPC transport (real
// gRPC over HTTP/2 with TLS), a bearer token on every call, a default deadline.
import { createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { CompletionService } from "./gen/funnel/completion/v1/completion_service_pb.js";
import { TranscriptService } from "./gen/funnel/completion/v1/transcript_service_pb.js";
import { TaskLifecycleService } from "./gen/funnel/lifecycle/v1/service_pb.js";

/** A bearer token, or a function returning the current one (called per call). */
export type TokenSource = string | (() => string | Promise<string>);

export interface FunnelTransportOptions {
  /** `host:port` of the service, e.g. `127.0.0.1:50051`. */
  address: string;
  /** PEM of the CA that signed the service's certificate; the system roots if omitted. */
  ca?: string | Buffer;
  /** PEM client certificate and key: the lifecycle service requires them. */
  cert?: string | Buffer;
  key?: string | Buffer;
  /** Sent as `authorization: Bearer <token>`; omit to send none. */
  token?: TokenSource;
  /** Deadline of a call that does not set `timeoutMs` itself; 10 s unless given. */
  defaultTimeoutMs?: number;
}

/** Adds `authorization: Bearer <token>` to every call. */
export function bearer(token: TokenSource): Interceptor {
  return (next) => async (request) => {
    const value = typeof token === "function" ? await token() : token;
    request.header.set("authorization", `Bearer ${value}`);
    return next(request);
  };
}

/** A gRPC (HTTP/2, TLS) transport to one service. */
export function createFunnelTransport(options: FunnelTransportOptions): Transport {
  return createGrpcTransport({
    baseUrl: `https://${options.address}`,
    nodeOptions: { ca: options.ca, cert: options.cert, key: options.key },
    interceptors: options.token === undefined ? [] : [bearer(options.token)],
    defaultTimeoutMs: options.defaultTimeoutMs ?? 10_000,
  });
}

export type LifecycleClient = Client<typeof TaskLifecycleService>;
export type CompletionClient = Client<typeof CompletionService>;
export type TranscriptClient = Client<typeof TranscriptService>;

/** `funnel.lifecycle.v1.TaskLifecycleService` (needs a client certificate). */
export function lifecycleClient(options: FunnelTransportOptions): LifecycleClient {
  return createClient(TaskLifecycleService, createFunnelTransport(options));
}

/** `funnel.completion.v1.CompletionService`. */
export function completionClient(options: FunnelTransportOptions): CompletionClient {
  return createClient(CompletionService, createFunnelTransport(options));
}

/** `funnel.completion.v1.TranscriptService` (served by the completion service). */
export function transcriptClient(options: FunnelTransportOptions): TranscriptClient {
  return createClient(TranscriptService, createFunnelTransport(options));
}
