#!/bin/sh
# The part of the official postgres image's entrypoint that Ferrum's compose
# file relies on: initialise an empty PGDATA with POSTGRES_USER as the
# superuser (password POSTGRES_PASSWORD), create POSTGRES_DB, run the
# /docker-entrypoint-initdb.d scripts once, accept other hosts only with a
# SCRAM password, then run the server as PID 1 under the postgres account.
set -eu
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }

if [ "${1:-}" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "entrypoint: POSTGRES_PASSWORD is required" >&2
        exit 1
    fi
    mkdir -p "$PGDATA" && chown postgres:postgres "$PGDATA" && chmod 0700 "$PGDATA"
    pwfile=$(mktemp) && printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile" && chown postgres "$pwfile"
    as_postgres initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" -E UTF8 \
        --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    # Initialisation runs on the socket only; no other host can connect yet.
    as_postgres pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    if [ "$POSTGRES_DB" != postgres ]; then
        as_postgres psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d postgres -qc "CREATE DATABASE \"$POSTGRES_DB\""
    fi
    for f in /docker-entrypoint-initdb.d/*; do
        case "$f" in
            *.sh) echo "entrypoint: running $f"; . "$f" ;;
            *.sql) echo "entrypoint: running $f"; as_postgres psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d "$POSTGRES_DB" -f "$f" ;;
        esac
    done
    as_postgres pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    echo "entrypoint: database initialised"
fi
if [ "${1:-}" = postgres ]; then
    shift
    exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -c listen_addresses='*' "$@"
fi
exec "$@"
