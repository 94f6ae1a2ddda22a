-- Keep the per-task hot queries on per-task indexes however many tasks a
-- workspace holds: without these the planner walks the whole workspace (by
-- primary key or by global sequence) to honour an ORDER BY.

-- Open attached children of a parent generation, in task id order.
DROP INDEX tasks_by_parent;
CREATE INDEX tasks_by_parent ON tasks (workspace_id, parent_task_id, parent_generation, task_id)
    WHERE parent_task_id IS NOT NULL;

-- One task's history in commit order (watch with a task filter, the original
-- terminal event of a repeated settlement).
CREATE INDEX lifecycle_events_by_task ON lifecycle_events (workspace_id, task_id, sequence);
