// The golden story of funnel_cli/demo.py against real services, as a project
// that installed the packed @funnel/client writes it: the agent works through a
// RunSession (claim, renew, evidence, attempts, close) with call ids, so repeats
// are answered with the first answer; errors decoded with errorDetails(). The
// services and credentials come from the environment
// (tests/contract/test_typescript_client.py starts them and installs the package
// here); without FUNNEL_LIFECYCLE_ADDRESS the tests are skipped.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";
import {
  claimTask, completion, completionClient, ConnectError, errorDetails, lifecycle, lifecycleClient, resumeRun,
} from "@funnel/client";
import { identity, jsonNumber } from "./identity.js";

const env = process.env;
const configured = env.FUNNEL_LIFECYCLE_ADDRESS !== undefined;
// Every call carries this deadline explicitly.
const CALL = { timeoutMs: 10_000 };
const WORKSPACE = env.FUNNEL_WORKSPACE ?? "ts";

function required(name: string): string {
  const value = env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
}

/** A JWT's `sub`: an agent claims with its own subject as agent_id. */
function subject(jwt: string): string {
  return JSON.parse(Buffer.from(jwt.split(".")[1], "base64url").toString("utf8")).sub;
}

/** Runs `call`, expects it to fail, returns the decoded details. */
async function failure(call: () => Promise<unknown>) {
  try {
    await call();
  } catch (error) {
    assert.ok(error instanceof ConnectError, `not a ConnectError: ${error}`);
    return errorDetails(error);
  }
  assert.fail("the call succeeded");
}

function setup() {
  const ca = readFileSync(required("FUNNEL_CA"));
  // The lifecycle service requires a client certificate; the completion service only a token.
  const mtls = { ca, cert: readFileSync(required("FUNNEL_CLIENT_CERT")), key: readFileSync(required("FUNNEL_CLIENT_KEY")) };
  const lifecycleAddress = required("FUNNEL_LIFECYCLE_ADDRESS");
  const completionAddress = required("FUNNEL_COMPLETION_ADDRESS");
  const hostToken = required("FUNNEL_HOST_TOKEN");
  const agentToken = required("FUNNEL_AGENT_TOKEN");
  return {
    agentId: subject(agentToken),
    hostLifecycle: lifecycleClient({ address: lifecycleAddress, ...mtls, token: hostToken }),
    host: completionClient({ address: completionAddress, ca, token: hostToken }),
    agent: completionClient({ address: completionAddress, ca, token: agentToken }),
    anonymousLifecycle: lifecycleClient({ address: lifecycleAddress, ...mtls }),
    anonymous: completionClient({ address: completionAddress, ca }),
  };
}

const name = <E extends Record<number, string>>(values: E, value: number) => values[value] ?? String(value);

describe("golden story against real services", { skip: configured ? false : "FUNNEL_LIFECYCLE_ADDRESS is not set" }, () => {
  it("register, claim, blocked attempt, evidence, allowed attempt, settlement, terminal event, DONE", async (t) => {
    const { agentId, hostLifecycle, host, agent } = setup();
    const taskId = `ts-${randomUUID().slice(0, 8)}`;
    const say = (line: string) => t.diagnostic(line);

    // 1. The host registers the task.
    const registered = await hostLifecycle.registerTask(
      { workspaceId: WORKSPACE, taskId, requestId: `${taskId}-register`, cause: { source: "typescript test", reason: "golden story" } },
      CALL,
    );
    assert.equal(registered.task?.generation, 1n);
    assert.equal(registered.task?.state, lifecycle.GenerationState.REGISTERED);
    assert.equal(registered.task?.revision, 1n);
    say(`1. register ${taskId}: generation 1, REGISTERED, revision 1`);

    // 2. The agent claims it as itself; the session keeps run, generation and epoch.
    const session = await claimTask(agent, { workspaceId: WORKSPACE, taskId, agentId, leaseTtlSeconds: 60 }, { ...CALL, callId: "claim" });
    assert.equal(session.agentId, agentId);
    assert.equal(session.taskId, taskId);
    assert.equal(session.generation, 1n);
    assert.ok(session.epoch >= 1n);
    const active = await hostLifecycle.getTask({ workspaceId: WORKSPACE, taskId }, CALL);
    assert.equal(active.task?.state, lifecycle.GenerationState.ACTIVE);
    assert.equal(active.task?.workStatus, lifecycle.WorkStatus.IN_PROGRESS);
    // The same call id again is the same request: the first claim's answer, not LEASE_HELD.
    const replayed = await claimTask(agent, { workspaceId: WORKSPACE, taskId, agentId, leaseTtlSeconds: 60 }, { ...CALL, callId: "claim" });
    assert.equal(replayed.runId, session.runId);
    assert.equal(replayed.epoch, session.epoch);
    const held = await failure(() => claimTask(agent, { workspaceId: WORKSPACE, taskId, agentId }, { ...CALL, callId: "claim-2" }));
    assert.equal(held.reason, "LEASE_HELD");
    say(`2. claim ${session.runId} (epoch ${session.epoch}): ACTIVE, IN_PROGRESS; the repeat replayed, another claim LEASE_HELD`);

    // The lease is renewed with the session's epoch; a host that restarted resumes the run.
    const claimedUntil = session.leaseExpireTime!.seconds;
    const renewed = await session.renew(CALL);
    assert.equal(renewed.lease?.epoch, session.epoch);
    assert.ok(session.leaseExpireTime!.seconds >= claimedUntil);
    const resumed = await resumeRun(agent, WORKSPACE, session.runId, 60, CALL);
    assert.deepEqual(
      [resumed.taskId, resumed.generation, resumed.epoch, resumed.agentId],
      [session.taskId, session.generation, session.epoch, session.agentId],
    );

    const attempt = (callId: string) =>
      session.attemptCompletion({ result: "Implemented the change; all tests pass." }, { ...CALL, callId });

    // 3. Without evidence the policy (required_evidence = ["tests"]) soft-blocks.
    const blocked = await attempt("attempt-1");
    assert.equal(blocked.decision?.verdict, completion.Verdict.SOFT_BLOCK, blocked.decision?.instruction);
    assert.equal(blocked.decision?.nextAction, completion.AgentAction.RECORD_EVIDENCE);
    assert.equal(blocked.completion, undefined);
    const decisive = blocked.decision!.trace.filter((gate) => gate.decisive);
    assert.deepEqual(decisive.map((gate) => gate.gateId), ["evidence.required"]);
    say(`3. attempt: SOFT_BLOCK, next action RECORD_EVIDENCE: ${blocked.decision!.instruction}`);

    // 4. The agent records passing tests at the current (empty) checkpoint.
    const evidence = await session.recordEvidence(
      { kind: "tests", verdict: completion.EvidenceVerdict.PASSED, details: "node --test: all passed" },
      { ...CALL, callId: "evidence-1" },
    );
    assert.equal(evidence.evidence?.kind, "tests");
    assert.equal(evidence.evidence?.runId, session.runId);
    assert.equal(evidence.evidence?.generation, session.generation);
    say(`4. evidence ${evidence.evidence?.evidenceId}: tests PASSED`);

    // 5. Allowed: the completion is committed...
    const allowed = await attempt("attempt-2");
    assert.equal(allowed.decision?.verdict, completion.Verdict.ALLOW, allowed.decision?.instruction);
    let done = allowed.completion!;
    assert.equal(done.outcome, completion.RequestedOutcome.COMPLETED);
    assert.equal(done.runId, session.runId);
    // ...with the identity the vectors describe, recomputed here.
    assert.equal(
      done.identity,
      identity({
        schema: "funnel.completion.identity/v1",
        workspace_id: done.workspaceId,
        task_id: done.taskId,
        generation: jsonNumber(done.generation),
        state_version: jsonNumber(done.stateVersion),
        checkpoint: done.checkpoint,
        outcome: "COMPLETED",
        decision_schema: done.decision!.decisionSchema,
      }),
    );
    say(`5. attempt: ALLOW, completion ${done.completionId}, identity ${done.identity}`);

    // 6. ...and settled. REPORT_COMPLETE comes only with a settled completion; a
    // PENDING one (the lifecycle service was slow) settles by the outbox's next try.
    if (done.settlement === completion.SettlementStatus.SETTLED) {
      assert.equal(allowed.decision?.nextAction, completion.AgentAction.REPORT_COMPLETE);
    }
    for (let tries = 0; done.settlement === completion.SettlementStatus.PENDING && tries < 100; tries++) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      done = (await host.getCompletion({ workspaceId: WORKSPACE, taskId, generation: session.generation }, CALL)).completion!;
    }
    assert.equal(name(completion.SettlementStatus, done.settlement), "SETTLED");
    assert.ok(done.lifecycleRevision > 0n);
    say(`6. settlement SETTLED at lifecycle revision ${done.lifecycleRevision}`);

    // 7. The lifecycle history ends with one terminal COMPLETED event naming the completion.
    const history = await hostLifecycle.listLifecycleEvents({ workspaceId: WORKSPACE, taskId }, CALL);
    const terminal = history.events.filter((event) => event.toState === lifecycle.GenerationState.TERMINAL);
    assert.equal(terminal.length, 1);
    const [event] = terminal;
    assert.equal(event.outcome, lifecycle.TerminalOutcome.COMPLETED);
    assert.equal(event.intent, lifecycle.Intent.SETTLE_COMPLETION);
    assert.equal(event.completionId, done.completionId);
    assert.equal(event.revision, done.lifecycleRevision);
    assert.equal(event.sequence, done.lifecycleEventSequence);
    assert.equal(history.events.at(-1), event);
    say(`7. lifecycle event #${event.sequence}: generation ${event.generation} terminal COMPLETED at revision ${event.revision}`);

    // The same event through the server stream (backlog first), with a deadline.
    const watched = [];
    for await (const message of hostLifecycle.watchLifecycleEvents({ workspaceId: WORKSPACE, taskId }, CALL)) {
      watched.push(message.event!);
      if (message.event!.sequence === event.sequence) break;
    }
    assert.deepEqual(watched.map((e) => e.sequence), history.events.map((e) => e.sequence));

    // 8. complete_task: the run closes and the task's final status is DONE.
    const close = () => session.complete(
      {
        outcome: completion.RunOutcome.SUCCEEDED, tokensInput: 1200, tokensOutput: 300, tokensTotal: 1500,
        notes: "Implemented the change; all tests pass.",
      },
      { ...CALL, callId: "close" },
    );
    const closed = await close();
    assert.equal(closed.runId, session.runId);
    assert.equal(name(completion.FinalStatus, closed.finalStatus), "DONE");
    assert.equal(closed.tokensTotal, 1500n);
    const final = await hostLifecycle.getTask({ workspaceId: WORKSPACE, taskId }, CALL);
    assert.equal(final.task?.workStatus, lifecycle.WorkStatus.DONE);
    assert.equal(final.task?.completionId, done.completionId);
    say(`8. complete_task ${closed.runId}: final status DONE, ${closed.tokensTotal} tokens`);

    // The same close again (same call id) is answered as the first time...
    const closedAgain = await close();
    assert.deepEqual(closedAgain.finishTime, closed.finishTime);
    // ...a new close is an error: FAILED_PRECONDITION / RUN_ALREADY_FINISHED.
    const again = await failure(() =>
      session.complete({ outcome: completion.RunOutcome.SUCCEEDED }, { ...CALL, callId: "close-2" }),
    );
    assert.equal(again.codeName, "FAILED_PRECONDITION");
    assert.equal(again.reason, "RUN_ALREADY_FINISHED");
    assert.equal(again.reason, completion.ErrorReason[completion.ErrorReason.RUN_ALREADY_FINISHED]);
    assert.equal(again.errorInfo?.domain, "funnel.completion.v1");
    assert.equal(again.errorInfo?.metadata.run_id, session.runId);
    assert.equal(again.badRequest, undefined);
    say(`9. complete_task again: the same call replayed; a new one ${again.codeName} / ${again.reason}: ${again.message}`);
  });

  it("a call without a token: UNAUTHENTICATED / CREDENTIALS_MISSING, on both services", async () => {
    const { anonymous, anonymousLifecycle } = setup();
    const fromCompletion = await failure(() => anonymous.getRun({ workspaceId: WORKSPACE, runId: "run_none" }, CALL));
    assert.equal(fromCompletion.codeName, "UNAUTHENTICATED");
    assert.equal(fromCompletion.reason, "CREDENTIALS_MISSING");
    assert.equal(fromCompletion.errorInfo?.domain, "funnel.completion.v1");
    const fromLifecycle = await failure(() => anonymousLifecycle.getTask({ workspaceId: WORKSPACE, taskId: "t" }, CALL));
    assert.equal(fromLifecycle.codeName, "UNAUTHENTICATED");
    assert.equal(fromLifecycle.reason, "CREDENTIALS_MISSING");
    assert.equal(fromLifecycle.errorInfo?.domain, "funnel.lifecycle.v1");
  });

  it("a malformed request: INVALID_ARGUMENT with a BadRequest naming the field", async () => {
    const { hostLifecycle } = setup();
    const details = await failure(() =>
      hostLifecycle.registerTask({ workspaceId: WORKSPACE, taskId: "no spaces allowed" }, CALL),
    );
    assert.equal(details.codeName, "INVALID_ARGUMENT");
    assert.equal(details.reason, "FIELD_MALFORMED");
    assert.equal(details.errorInfo?.domain, "funnel.lifecycle.v1");
    assert.equal(details.errorInfo?.metadata.field, "task_id");
    assert.deepEqual(details.badRequest?.fieldViolations.map((violation) => violation.field), ["task_id"]);
  });

  it("an agent claiming for another agent_id: PERMISSION_DENIED / AGENT_ID_MISMATCH", async () => {
    const { hostLifecycle, agent } = setup();
    const taskId = `ts-${randomUUID().slice(0, 8)}`;
    await hostLifecycle.registerTask({ workspaceId: WORKSPACE, taskId }, CALL);
    const details = await failure(() => claimTask(agent, { workspaceId: WORKSPACE, taskId, agentId: "someone-else" }, CALL));
    assert.equal(details.codeName, "PERMISSION_DENIED");
    assert.equal(details.reason, "AGENT_ID_MISMATCH");
    assert.equal(details.errorInfo?.metadata.agent_id, "someone-else");
  });
});
