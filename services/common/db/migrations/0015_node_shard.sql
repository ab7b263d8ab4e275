-- Node shards (Ironic's nodes.shard, API 1.82): a free-form name API clients
-- use to split the nodes among themselves; Ferrum does not use it itself.
-- Indexed for the ?shard= and ?sharded= list filters and GET /v1/shards.
ALTER TABLE nodes ADD COLUMN shard text CHECK (char_length(shard) <= 255);
CREATE INDEX nodes_shard ON nodes (shard);
