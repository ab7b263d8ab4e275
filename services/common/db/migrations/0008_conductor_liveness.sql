-- A conductor that holds a session-level advisory lock while it runs (key:
-- the liveness class and its row id) is known dead the moment its database
-- session ends, instead of a heartbeat timeout later. Rows written by older
-- conductors (false) keep heartbeat-only liveness.
ALTER TABLE conductors ADD COLUMN liveness_lock boolean NOT NULL DEFAULT false;
