-- Node fields of API 1.104 and 1.109 and node history fields of 1.113/1.115.
-- instance_name mirrors instance_info.display_name unless set on its own;
-- health is what the BMC last reported (Redfish System Status.Health), or
-- NULL where the management interface cannot tell. A history entry records
-- the project of the request behind it, the node's provision and target
-- state when it was written, and the seconds since the last provision change.
ALTER TABLE nodes ADD COLUMN instance_name text CHECK (char_length(instance_name) BETWEEN 1 AND 255);
CREATE INDEX nodes_instance_name ON nodes (instance_name);
ALTER TABLE nodes ADD COLUMN health text CHECK (char_length(health) <= 32);
ALTER TABLE node_history ADD COLUMN project text CHECK (char_length(project) <= 255);
ALTER TABLE node_history ADD COLUMN state text;
ALTER TABLE node_history ADD COLUMN target_provision_state text;
ALTER TABLE node_history ADD COLUMN duration_seconds integer;
