-- Port groups (REST 1.23/1.24/1.26): bonds of a node's ports. They go with
-- their node; a port leaves its group when the group is deleted.
CREATE TABLE portgroups (
    id                          bigserial PRIMARY KEY,
    uuid                        uuid NOT NULL UNIQUE,
    node_id                     bigint NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    name                        text UNIQUE CHECK (name IS NULL OR length(name) BETWEEN 1 AND 255),
    address                     text UNIQUE CHECK (address IS NULL OR address ~ '^([0-9a-f]{2}:){5}[0-9a-f]{2}$'),
    mode                        text CHECK (mode IS NULL OR length(mode) <= 255),
    properties                  jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(properties) = 'object'),
    extra                       jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(extra) = 'object'),
    internal_info               jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(internal_info) = 'object'),
    standalone_ports_supported  boolean NOT NULL DEFAULT true,
    created_at                  timestamptz NOT NULL DEFAULT now(),
    updated_at                  timestamptz
);
CREATE INDEX portgroups_node_id_idx ON portgroups (node_id);

ALTER TABLE ports ADD COLUMN portgroup_id bigint REFERENCES portgroups (id) ON DELETE SET NULL;
CREATE INDEX ports_portgroup_id_idx ON ports (portgroup_id) WHERE portgroup_id IS NOT NULL;
