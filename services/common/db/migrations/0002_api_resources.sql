-- REST resources the api serves on its own (Ironic microversions 1.40-1.55).

-- Deploy templates (1.55): a named (trait-like) list of deploy steps.
CREATE TABLE deploy_templates (
    id          bigserial PRIMARY KEY,
    uuid        uuid NOT NULL UNIQUE,
    name        text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 255),
    steps       jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(steps) = 'array'),
    extra       jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(extra) = 'object'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz
);

-- Cached BIOS settings (1.40), one row per setting; they go with their node.
CREATE TABLE bios_settings (
    id          bigserial PRIMARY KEY,
    node_id     bigint NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 255),
    value       text,
    attribute_type  text,
    allowable_values jsonb,
    lower_bound integer,
    upper_bound integer,
    min_length  integer,
    max_length  integer,
    read_only   boolean,
    reset_required boolean,
    "unique"    boolean,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz,
    UNIQUE (node_id, name)
);
