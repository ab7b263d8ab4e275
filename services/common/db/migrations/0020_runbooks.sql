-- Runbooks (Ironic's runbooks table, API 1.92): a named list of steps that a
-- manual cleaning (or servicing) may run instead of a list given in the
-- request. A runbook with an owner and public false is only usable by that
-- project; public runbooks have no owner. From 1.112 a runbook carries a set
-- of traits (runbook_traits) and may run on a node sharing one of them.
CREATE TABLE runbooks (
    id              bigserial PRIMARY KEY,
    uuid            uuid NOT NULL UNIQUE,
    name            text NOT NULL UNIQUE CHECK (char_length(name) BETWEEN 1 AND 255),
    description     text CHECK (char_length(description) <= 255),
    steps           jsonb NOT NULL CHECK (jsonb_typeof(steps) = 'array' AND jsonb_array_length(steps) >= 1),
    disable_ramdisk boolean NOT NULL DEFAULT false,
    extra           jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(extra) = 'object'),
    public          boolean NOT NULL DEFAULT false,
    owner           text CHECK (char_length(owner) <= 255),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz
);
CREATE TABLE runbook_traits (
    runbook_id  bigint NOT NULL REFERENCES runbooks (id) ON DELETE CASCADE,
    trait       text NOT NULL CHECK (char_length(trait) BETWEEN 1 AND 255),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (runbook_id, trait)
);
