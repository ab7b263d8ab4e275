-- Allocations (REST 1.52): a request for a node of a resource class (and
-- traits), claimed by setting the node's instance_uuid to the allocation's UUID.
CREATE TABLE allocations (
    id              bigserial PRIMARY KEY,
    uuid            uuid NOT NULL UNIQUE,
    name            text UNIQUE CHECK (name IS NULL OR length(name) BETWEEN 1 AND 255),
    node_id         bigint UNIQUE REFERENCES nodes (id) ON DELETE CASCADE,
    state           text NOT NULL CHECK (state IN ('allocating', 'active', 'error')),
    last_error      text,
    resource_class  text CHECK (resource_class IS NULL OR length(resource_class) <= 80),
    traits          jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(traits) = 'array'),
    candidate_nodes jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(candidate_nodes) = 'array'),
    extra           jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(extra) = 'object'),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz
);
