// A claimed run as one object: what ClaimTask returned (workspace, task, agent,
// run, generation, epoch, lease TTL) is kept for the calls that need it, so a
// host does not carry it between calls. Mutating calls given a `callId` send the
// request id `funnel mcp` would derive for the same tool call (./idempotency.ts):
// a repeat with the same call id is answered with the first answer.
import type { CallOptions } from "@connectrpc/connect";
import type { Timestamp } from "@bufbuild/protobuf/wkt";
import type {
  AttemptCompletionResponse,
  CompleteRunResponse,
  RecordEvidenceResponse,
  RenewLeaseResponse,
} from "./gen/funnel/completion/v1/completion_messages_pb.js";
import { EvidenceVerdict, FinalStatus, RequestedOutcome, RunOutcome } from "./gen/funnel/completion/v1/enums_pb.js";
import type { Run } from "./gen/funnel/completion/v1/types_pb.js";
import type { CompletionClient } from "./connect.js";
import { callIdentity, requestId, type CallId, type JsonValue } from "./idempotency.js";

/** Call options plus the host's name for this call (e.g. the model's tool-use id). */
export interface SessionCallOptions extends CallOptions {
  /** Same id, same arguments: same request id. Without one no request id is sent. */
  callId?: CallId;
}

export interface ClaimInput {
  workspaceId: string;
  taskId: string;
  /** Must equal the agent token's `sub`. */
  agentId: string;
  /** The lease lifetime, also used by `renew()`; 60 s unless given. */
  leaseTtlSeconds?: number;
}

export interface EvidenceInput {
  kind: string;
  verdict: EvidenceVerdict;
  checkpoint?: string;
  details?: string;
}

export interface AttemptInput {
  result: string;
  /** `COMPLETED` unless given. */
  outcome?: RequestedOutcome;
  stateVersion?: number | bigint;
}

export interface CloseInput {
  outcome: RunOutcome;
  tokensInput?: number | bigint;
  tokensOutput?: number | bigint;
  tokensTotal?: number | bigint;
  notes?: string;
  error?: string;
  finalStatus?: FinalStatus;
}

const DEFAULT_LEASE_TTL_SECONDS = 60;

/** Claims a task (ClaimTask) and returns the session of the new run. */
export async function claimTask(client: CompletionClient, input: ClaimInput, options: SessionCallOptions = {}): Promise<RunSession> {
  const { callId, ...callOptions } = options;
  const leaseTtlSeconds = input.leaseTtlSeconds ?? DEFAULT_LEASE_TTL_SECONDS;
  const response = await client.claimTask(
    {
      workspaceId: input.workspaceId,
      taskId: input.taskId,
      agentId: input.agentId,
      leaseTtl: { seconds: BigInt(leaseTtlSeconds) },
      requestId: derived("claim_task", input.workspaceId, claimArguments(input.taskId), callId),
    },
    callOptions,
  );
  return new RunSession(client, response.run!, leaseTtlSeconds);
}

/** The session of a run claimed earlier (e.g. before the host restarted), read with GetRun. */
export async function resumeRun(
  client: CompletionClient, workspaceId: string, runId: string,
  leaseTtlSeconds = DEFAULT_LEASE_TTL_SECONDS, options: CallOptions = {},
): Promise<RunSession> {
  const { run } = await client.getRun({ workspaceId, runId }, options);
  return new RunSession(client, run!, leaseTtlSeconds);
}

export class RunSession {
  readonly workspaceId: string;
  readonly taskId: string;
  readonly agentId: string;
  readonly runId: string;
  readonly generation: bigint;
  /** The lease epoch the claim granted: the fencing token of every later call. */
  readonly epoch: bigint;
  /** When the lease lapses unless renewed; moved by `renew()`. */
  leaseExpireTime: Timestamp | undefined;

  constructor(readonly client: CompletionClient, run: Run, readonly leaseTtlSeconds: number) {
    this.workspaceId = run.workspaceId;
    this.taskId = run.taskId;
    this.agentId = run.agentId;
    this.runId = run.runId;
    this.generation = run.generation;
    this.epoch = run.epoch;
    this.leaseExpireTime = run.leaseExpireTime;
  }

  /** RenewLease: the lease lasts `leaseTtlSeconds` from now; the epoch stays. */
  async renew(options: CallOptions = {}): Promise<RenewLeaseResponse> {
    const response = await this.client.renewLease(
      { workspaceId: this.workspaceId, runId: this.runId, epoch: this.epoch, leaseTtl: { seconds: BigInt(this.leaseTtlSeconds) } },
      options,
    );
    this.leaseExpireTime = response.lease?.expireTime;
    return response;
  }

  /** RecordEvidence for this run's task and generation. */
  recordEvidence(input: EvidenceInput, options: SessionCallOptions = {}): Promise<RecordEvidenceResponse> {
    const { callId, ...callOptions } = options;
    return this.client.recordEvidence(
      {
        workspaceId: this.workspaceId, taskId: this.taskId, generation: this.generation, runId: this.runId,
        kind: input.kind, verdict: input.verdict, checkpoint: input.checkpoint ?? "", details: input.details ?? "",
        requestId: derived("record_evidence", this.workspaceId, evidenceArguments(this.runId, input), callId),
      },
      callOptions,
    );
  }

  /** AttemptCompletion with this run's lease epoch. */
  attemptCompletion(input: AttemptInput, options: SessionCallOptions = {}): Promise<AttemptCompletionResponse> {
    const { callId, ...callOptions } = options;
    return this.client.attemptCompletion(
      {
        workspaceId: this.workspaceId, taskId: this.taskId, runId: this.runId, epoch: this.epoch,
        outcome: input.outcome ?? RequestedOutcome.COMPLETED, result: input.result,
        stateVersion: optionalBigint(input.stateVersion),
        requestId: derived("attempt_completion", this.workspaceId, attemptArguments(this.runId, input), callId),
      },
      callOptions,
    );
  }

  /** CompleteRun: closes this run (the `complete_task` contract). */
  complete(input: CloseInput, options: SessionCallOptions = {}): Promise<CompleteRunResponse> {
    const { callId, ...callOptions } = options;
    return this.client.completeRun(
      {
        workspaceId: this.workspaceId, runId: this.runId, outcome: input.outcome,
        tokensInput: optionalBigint(input.tokensInput), tokensOutput: optionalBigint(input.tokensOutput),
        tokensTotal: optionalBigint(input.tokensTotal), notes: input.notes ?? "", error: input.error ?? "",
        finalStatus: input.finalStatus ?? FinalStatus.UNSPECIFIED,
        requestId: derived("complete_task", this.workspaceId, closeArguments(this.runId, input), callId),
      },
      callOptions,
    );
  }
}

// The arguments of the `funnel mcp` tool each call corresponds to, shaped as
// funnel_mcp/server.py passes them to request_id(): every parameter, null when
// not given, enums as the tools' lower-case words.

export function claimArguments(taskId: string): { [key: string]: JsonValue } {
  return { taskId };
}

export function evidenceArguments(runId: string, input: EvidenceInput): { [key: string]: JsonValue } {
  return {
    runId, kind: input.kind, verdict: word(EvidenceVerdict, input.verdict),
    checkpoint: input.checkpoint ?? null, details: input.details ?? null,
  };
}

export function attemptArguments(runId: string, input: AttemptInput): { [key: string]: JsonValue } {
  return {
    runId, result: input.result, outcome: word(RequestedOutcome, input.outcome ?? RequestedOutcome.COMPLETED),
    stateVersion: integer(input.stateVersion),
  };
}

export function closeArguments(runId: string, input: CloseInput): { [key: string]: JsonValue } {
  return {
    runId, outcome: word(RunOutcome, input.outcome),
    tokensInput: integer(input.tokensInput), tokensOutput: integer(input.tokensOutput),
    tokensTotal: integer(input.tokensTotal), notes: input.notes ?? null, error: input.error ?? null,
    finalStatus: input.finalStatus === undefined || input.finalStatus === FinalStatus.UNSPECIFIED
      ? null : word(FinalStatus, input.finalStatus),
  };
}

function derived(tool: string, workspace: string, args: { [key: string]: JsonValue }, callId: CallId | undefined): string {
  const call = callIdentity(callId);
  return call === undefined ? "" : requestId(tool, workspace, args, call);
}

/** `RunOutcome.SUCCEEDED` -> `succeeded`: the tools' words are the enum names. */
function word(values: Record<number, string>, value: number): string {
  return (values[value] ?? String(value)).toLowerCase();
}

function integer(value: number | bigint | undefined): number | null {
  return value === undefined ? null : Number(value);
}

function optionalBigint(value: number | bigint | undefined): bigint | undefined {
  return value === undefined ? undefined : BigInt(value);
}
