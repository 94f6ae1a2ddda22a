-- What an operator needs to see of the settlement outbox (`funnel outbox`):
-- why the last settle call of a pending completion got no answer (NULL before
-- the first call and once settled or rejected). UTF-8 as the other free text:
-- an error text may quote what a peer sent.
ALTER TABLE task_completions ADD COLUMN last_settle_error BYTEA;  -- UTF-8
-- ListCompletions filtered by settlement (PENDING: the outbox) in commit order,
-- without reading the settled rows; task_completions_pending stays the outbox's
-- index by due time.
CREATE INDEX task_completions_by_settlement ON task_completions (workspace_id, settlement, committed_at, completion_id);
