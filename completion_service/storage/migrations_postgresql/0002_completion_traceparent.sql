-- The W3C traceparent of the call that committed a completion (NULL outside a
-- trace): a settlement the outbox retries later joins that call's trace.
ALTER TABLE task_completions ADD COLUMN traceparent TEXT;
