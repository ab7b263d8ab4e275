#!/bin/sh
# Run once by the postgres image's entrypoint on an empty data directory (the
# official image and deploy/podman/postgres alike): the role Ferrum's
# services and migrations use. It owns database ferrum and is not a
# superuser, cannot create roles or databases (docs/security.md, "External
# PostgreSQL"); the superuser POSTGRES_USER is kept for the operator.
set -eu
if [ -z "${FERRUM_DB_PASSWORD:-}" ]; then
    echo "10-ferrum-role.sh: FERRUM_DB_PASSWORD is required" >&2
    exit 1
fi
psql -v ON_ERROR_STOP=1 -v password="$FERRUM_DB_PASSWORD" --username "$POSTGRES_USER" --dbname postgres <<'SQL'
SET password_encryption = 'scram-sha-256';
CREATE ROLE ferrum LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD :'password';
CREATE DATABASE ferrum OWNER ferrum;
REVOKE ALL ON DATABASE ferrum FROM PUBLIC;
SQL
