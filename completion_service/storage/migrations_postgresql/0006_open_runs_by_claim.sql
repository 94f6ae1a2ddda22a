-- ListRuns of the open runs only (open_only; the dashboard's attention page: leases
-- that lapsed without their run being closed, runs open long), newest claim first,
-- from an index that holds no closed run.
CREATE INDEX agent_runs_open_by_claim ON agent_runs (workspace_id, claimed_at, run_id) WHERE finished_at IS NULL;
