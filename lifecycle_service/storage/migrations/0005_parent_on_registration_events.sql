-- A child task's registration event names its parent, so that a watcher of the
-- events (the completion service's lifecycle projection) learns of a new attached
-- child without reading the task. The link never changes after registration:
-- earlier registration events are filled in from their task, the one time
-- history is written to.
ALTER TABLE lifecycle_events ADD COLUMN parent_task_id TEXT;
ALTER TABLE lifecycle_events ADD COLUMN parent_generation INTEGER;
ALTER TABLE lifecycle_events ADD COLUMN parent_mode TEXT;

DROP TRIGGER lifecycle_events_immutable_update;
UPDATE lifecycle_events
   SET (parent_task_id, parent_generation, parent_mode) = (
       SELECT t.parent_task_id, t.parent_generation, t.parent_mode FROM tasks t
        WHERE t.workspace_id = lifecycle_events.workspace_id AND t.task_id = lifecycle_events.task_id)
 WHERE intent = 'REGISTER_TASK'
   AND EXISTS (SELECT 1 FROM tasks t WHERE t.workspace_id = lifecycle_events.workspace_id
                 AND t.task_id = lifecycle_events.task_id AND t.parent_task_id IS NOT NULL);
CREATE TRIGGER lifecycle_events_immutable_update BEFORE UPDATE ON lifecycle_events
BEGIN SELECT RAISE(ABORT, 'lifecycle events are immutable'); END;
