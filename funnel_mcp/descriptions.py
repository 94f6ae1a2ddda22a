"""What the model reads about each tool: its title and description. The
descriptions are wrapped here for reading and sent as one paragraph."""

from __future__ import annotations


def prose(text: str) -> str:
    return " ".join(text.split())


CLAIM_TASK = prose("""Claim a task before working on it. Opens a run for you and gives you the task's
lease, which this server keeps alive while the run is open. Returns runId (pass it to every other
tool), the lease epoch and expiry, and the task generation. Fails with LEASE_HELD if another run
holds the task, GENERATION_TERMINAL if it is finished, CANCELLATION_REQUESTED if it was cancelled.""")

COMPLETE_TASK = prose("""Call once at the end of your session to close your run. Records the outcome,
token counts (tokensTotal is kept as given; if omitted, tokensInput + tokensOutput) and notes (cut
at 2000 characters). With outcome succeeded the notes are the task's result, which the completion
gates require as attempt_completion requires its result: the task becomes done only if the gates
allow it (calling attempt_completion first tells). failed -> blocked; cancelled -> the task is
cancelled; stalled -> unchanged. finalStatus overrides the status, except that done is reached only
through an allowed, settled completion. The run closes in every case: taskEffect says what the close
did to the task (not_completed: the gates refused, the task stays open), nextStep what is left to
do. Closing a run twice is an error (RUN_ALREADY_FINISHED). Returns runId, finishedAt, finalStatus
(the task's real status) and tokensTotal.""")

RECORD_EVIDENCE = prose("""Record one fact that supports completing the task, e.g. that the tests passed
(kind "tests", verdict passed). Evidence counts only at the checkpoint it names: pass the
evidenceCheckpoint that attempt_completion reported as missing, or none when it reported null.
For each kind the latest fact counts, so record a new one after fixing a failure.""")

ATTEMPT_COMPLETION = prose("""Ask whether the task may be completed now, with a summary of what was
achieved as result. Returns the binding decision: verdict (allow, soft_block, hard_block), the single
nextAction to take, a one-line instruction, the actions forbidden now, and on a block `missing`: the
evidence kinds and checkpoint, open tool calls, open child tasks, the run holding the lease. Report
the task as complete only when nextAction is report_complete (the completion is then settled);
after a soft block, do what nextAction says and attempt again.""")

GET_TASK = prose("""Read the task's lifecycle truth: its state (registered, active, suspended, terminal),
generation, terminal outcome, whether cancellation was requested (then stop working), its backlog
status and the attached child tasks still open. This is the authority on whether the task is
finished; a tool's success is not.""")
