-- Object store: a unique index on backend keys (the orphan sweep asks "which
-- of these keys are still referenced?") and a place to keep a generated
-- temp-URL secret so that temp URLs survive restarts and are shared by every
-- object store replica.
CREATE UNIQUE INDEX objects_backend_key_idx ON objects (backend_key);

CREATE TABLE objectstore_secrets (
    name        text PRIMARY KEY,
    value       text NOT NULL CHECK (length(value) >= 32),
    created_at  timestamptz NOT NULL DEFAULT now()
);
