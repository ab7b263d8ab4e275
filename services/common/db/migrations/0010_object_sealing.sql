-- Objects encrypted at rest (docs/security.md, "Secrets at rest"): the id of
-- the key their bytes are sealed with, NULL for bytes stored as sent. The
-- object store decides from it how to serve a download (sendfile only for
-- plain bytes), and `ferrum db rotate-key` finds what is left to re-encrypt.
ALTER TABLE objects ADD COLUMN sealed_key_id text CHECK (sealed_key_id <> '');
