-- ListTasks filters (issue 24), each served from an index in task-id order: open
-- tasks by lifecycle state and by work status, and the tasks that ended other than
-- completed by outcome. Completed tasks, the bulk of a workspace, are in none of
-- these partial indexes; a filter that matches them (state TERMINAL, outcome
-- COMPLETED, work status DONE or CANCELLED) reads the primary key's order.
CREATE INDEX tasks_open_by_state ON tasks (workspace_id, state, task_id) WHERE state != 'TERMINAL';
CREATE INDEX tasks_open_by_work_status ON tasks (workspace_id, work_status, task_id)
    WHERE work_status IN ('READY', 'IN_PROGRESS', 'BLOCKED');
CREATE INDEX tasks_ended_by_outcome ON tasks (workspace_id, outcome, task_id)
    WHERE outcome IN ('CANCELLED', 'FAILED', 'TIMED_OUT');
