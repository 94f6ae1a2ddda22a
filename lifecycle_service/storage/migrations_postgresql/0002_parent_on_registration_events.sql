-- A child task's registration event names its parent, so that a watcher of the
-- events (the completion service's lifecycle projection) learns of a new attached
-- child without reading the task. The link never changes after registration:
-- earlier registration events are filled in from their task, the one time
-- history is written to.
ALTER TABLE lifecycle_events ADD COLUMN parent_task_id TEXT COLLATE "C";
ALTER TABLE lifecycle_events ADD COLUMN parent_generation BIGINT;
ALTER TABLE lifecycle_events ADD COLUMN parent_mode TEXT;

ALTER TABLE lifecycle_events DISABLE TRIGGER lifecycle_events_immutable;
UPDATE lifecycle_events e
   SET parent_task_id = t.parent_task_id, parent_generation = t.parent_generation, parent_mode = t.parent_mode
  FROM tasks t
 WHERE e.intent = 'REGISTER_TASK' AND t.workspace_id = e.workspace_id AND t.task_id = e.task_id
   AND t.parent_task_id IS NOT NULL;
ALTER TABLE lifecycle_events ENABLE TRIGGER lifecycle_events_immutable;
