-- Completion events also record what happens to runs and evidence (RUN_CLAIMED,
-- RUN_CLOSED, EVIDENCE_RECORDED), so that a watcher follows a task's runs and
-- evidence from the stream: how a run closed, and which fact was stored. NULL
-- for every other kind (and for every event written before).
ALTER TABLE completion_events ADD COLUMN run_outcome TEXT;
ALTER TABLE completion_events ADD COLUMN evidence_id TEXT COLLATE "C";
