-- What the last successful in-band inspection stored for a node (Ironic's
-- node_inventory table, API 1.81): the agent's inventory and the rest of what
-- it posted (plugin_data). One row per node; a new inspection replaces it.
CREATE TABLE node_inventory (
    node_id     bigint PRIMARY KEY REFERENCES nodes (id) ON DELETE CASCADE,
    inventory   jsonb NOT NULL CHECK (jsonb_typeof(inventory) = 'object'),
    plugin_data jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(plugin_data) = 'object'),
    created_at  timestamptz NOT NULL DEFAULT now()
);
