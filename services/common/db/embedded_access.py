"""Who may connect to the embedded PostgreSQL, and as what: the cluster's
``pg_hba.conf`` and the SQL that sets up its two roles.

Why two roles: the bootstrap superuser (``postgres``) can run programs as
the server account (``COPY ... TO PROGRAM``), read its files and change any
setting, so only the launcher uses it, to create roles and databases. Every
service, and the migrations, connect as the service role (``ferrum``): a
login role with no superuser, role-creation, database-creation, replication
or RLS-bypass rights, which owns Ferrum's databases and everything in them.
Owning is enough for DML, DDL in its databases (migrations), LISTEN/NOTIFY,
advisory locks, reading ``pg_locks`` and ending its own backends.

Why nothing but SCRAM in ``pg_hba.conf``: with ``trust`` any local account
could connect as the superuser. Only loopback TCP and the unix socket are
listed, so any other address, and replication, match no line and are refused.

These are pure functions returning text; :mod:`.embedded` runs them.
"""

from __future__ import annotations

import re

HBA_CONF = """\
# Written by Ferrum (services/common/db/embedded_access.py) at every start of
# the embedded PostgreSQL; edits are overwritten. Every connection proves a
# SCRAM-SHA-256 password; other addresses and replication match no line.
# TYPE  DATABASE  USER  ADDRESS        METHOD
local   all       all                  scram-sha-256
host    all       all   127.0.0.1/32   scram-sha-256
host    all       all   ::1/128        scram-sha-256
"""

_ROLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_SYSTEM_SCHEMAS = "n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'"


def _identifier(name: str) -> str:
    """``name`` as a quoted SQL identifier; only plain lower-case role names are accepted."""
    if not _ROLE_NAME.match(name):
        raise ValueError(f"unexpected role name {name!r}")
    return f'"{name}"'


def _literal(text: str) -> str:
    """``text`` as a standard-conforming SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def set_password_sql(role: str, verifier: str) -> str:
    """One line setting ``role``'s password from a SCRAM verifier (single-user mode reads line by line)."""
    return f"ALTER ROLE {_identifier(role)} WITH PASSWORD {_literal(verifier)};\n"


def service_role_sql(role: str, verifier: str) -> str:
    """Create the service role if missing, then state its rights and password.

    Stating every attribute at every start also takes back rights someone
    gave it by hand, so the role is always as documented.
    """
    ident = _identifier(role)
    return (
        "DO $$ BEGIN\n"
        f"  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {_literal(role)}) THEN\n"
        f"    CREATE ROLE {ident} LOGIN;\n"
        "  END IF;\n"
        "END $$;\n"
        f"ALTER ROLE {ident} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
        f"PASSWORD {_literal(verifier)};\n"
    )


def adopt_database_sql(old_owner: str, new_owner: str) -> str:
    """Give the current database and everything ``old_owner`` owns in it to ``new_owner``.

    Why not ``REASSIGN OWNED``: PostgreSQL refuses it for the bootstrap
    superuser, which owns the system objects too. So each user-level object
    (schemas, tables, views, sequences not owned by a column, routines and
    stand-alone types) outside the system schemas is altered one by one;
    indexes, triggers, row types and column sequences follow their table.
    Used on a database made by an older Ferrum (migrated as the superuser),
    and harmless when there is nothing to move.
    """
    old, new = _literal(old_owner), _identifier(new_owner)
    return f"""\
DO $adopt$
DECLARE
    old_owner oid := (SELECT oid FROM pg_roles WHERE rolname = {old});
    statement text;
BEGIN
    EXECUTE format('ALTER DATABASE %I OWNER TO {new}', current_database());
    FOR statement IN
        SELECT format('ALTER SCHEMA %I OWNER TO {new}', n.nspname)
          FROM pg_namespace n
         WHERE n.nspowner = old_owner AND {_SYSTEM_SCHEMAS}
        UNION ALL
        SELECT format('ALTER %s %s OWNER TO {new}',
                      CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW'
                                     WHEN 'm' THEN 'MATERIALIZED VIEW' WHEN 'f' THEN 'FOREIGN TABLE'
                                     ELSE 'TABLE' END,
                      c.oid::regclass)
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.relowner = old_owner AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S') AND {_SYSTEM_SCHEMAS}
           AND NOT EXISTS (SELECT 1 FROM pg_depend d
                            WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                              AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i'))
        UNION ALL
        SELECT format('ALTER ROUTINE %s OWNER TO {new}', p.oid::regprocedure)
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE p.proowner = old_owner AND {_SYSTEM_SCHEMAS}
        UNION ALL
        SELECT format('ALTER %s %s OWNER TO {new}',
                      CASE t.typtype WHEN 'd' THEN 'DOMAIN' ELSE 'TYPE' END, t.oid::regtype)
          FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
         WHERE t.typowner = old_owner AND {_SYSTEM_SCHEMAS}
           AND (t.typtype IN ('e', 'd', 'r')
                OR (t.typtype = 'c' AND (SELECT c.relkind FROM pg_class c WHERE c.oid = t.typrelid) = 'c'))
    LOOP
        EXECUTE statement;
    END LOOP;
END
$adopt$;
"""


def objects_owned_sql(owner: str) -> str:
    """Count user-level objects in the current database still owned by ``owner`` (for checks and tests)."""
    lit = _literal(owner)
    return f"""\
SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.relowner = (SELECT oid FROM pg_roles WHERE rolname = {lit}) AND {_SYSTEM_SCHEMAS})
     + (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE p.proowner = (SELECT oid FROM pg_roles WHERE rolname = {lit}) AND {_SYSTEM_SCHEMAS})
     + (SELECT count(*) FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
         WHERE t.typowner = (SELECT oid FROM pg_roles WHERE rolname = {lit}) AND {_SYSTEM_SCHEMAS})
     + (SELECT count(*) FROM pg_namespace n
         WHERE n.nspowner = (SELECT oid FROM pg_roles WHERE rolname = {lit}) AND {_SYSTEM_SCHEMAS})
"""
