-- Inspection rules (Ironic's inspection_rules table, API 1.96): conditions on
-- an inspected node's inventory and actions to take when they all hold. The
-- conductor runs the rules of phase "main" after each in-band inspection,
-- highest priority first, together with the built-in rules of its
-- inspection_rules_file (those are not stored here and not shown by the API).
CREATE TABLE inspection_rules (
    id          bigserial PRIMARY KEY,
    uuid        uuid NOT NULL UNIQUE,
    description text CHECK (char_length(description) <= 255),
    priority    integer NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 9999),
    sensitive   boolean NOT NULL DEFAULT false,
    phase       text NOT NULL DEFAULT 'main' CHECK (char_length(phase) <= 16),
    conditions  jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(conditions) = 'array'),
    actions     jsonb NOT NULL CHECK (jsonb_typeof(actions) = 'array' AND jsonb_array_length(actions) >= 1),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz
);
CREATE INDEX inspection_rules_phase ON inspection_rules (phase, priority DESC, id);
