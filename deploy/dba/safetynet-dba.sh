#!/bin/sh
# The DBA's steps of docs/operations.md (install, upgrade, uninstall), as one script: the
# doc shows it verbatim and tests/integration/db/test_dba_steps.py runs it. One phase per
# run: sh safetynet-dba.sh install | upgrade | uninstall. It needs:
#   ADMIN    a psql connection string to the messenger's database, as a role that may
#            create and drop roles and grant on the database (a DBA's admin role)
#   OWNER    the role that owns the messenger's tables (it need not be a superuser)
#   CONFIG   a safetynet config file whose postgres.dsn connects as OWNER
#   RUNTIME  the daemon's role, RUNTIME_PASSWORD its password (from your secret store)
#   DB       the messenger's database
set -eu

admin() {
    psql "$ADMIN" -X -q -v ON_ERROR_STOP=1 -v db="$DB" -v owner="$OWNER" \
        -v role="$RUNTIME" -v pw="${RUNTIME_PASSWORD:-}"
}

install() {
    # 1. the daemon's role, nothing else (migrate grants it what it needs); the first
    #    install only: the owner may create the safetynet schema in the database
    admin <<'SQL'
CREATE ROLE :"role" LOGIN PASSWORD :'pw';
GRANT CREATE ON DATABASE :"db" TO :"owner";
SQL
    # 2. the messenger's tables against the contract ("safetynet not installed yet")
    safetynet check-schema -c "$CONFIG"
    # 3. review the plan, then migrate as the owner; 4. the runtime role's grants with it
    safetynet migrate --print-sql --grant-to "$RUNTIME" -c "$CONFIG" > safetynet-plan.sql
    safetynet migrate --grant-to "$RUNTIME" -c "$CONFIG"
    # the schema exists now: no later migrate needs CREATE on the database
    admin <<'SQL'
REVOKE CREATE ON DATABASE :"db" FROM :"owner";
SQL
    # 5. again; then start the daemon with the runtime role's DSN
    safetynet check-schema -c "$CONFIG"
}

upgrade() {
    # the new release's migrate before its rollout (the Kubernetes Job runs the same):
    # recorded roles are granted again, nothing more is needed than the owner's rights
    safetynet migrate -c "$CONFIG"
    safetynet check-schema -c "$CONFIG"
}

uninstall() {
    # every replica stopped first; review, then remove exactly what safetynet created
    safetynet uninstall --print-sql -c "$CONFIG" > safetynet-uninstall.sql
    safetynet uninstall --yes -c "$CONFIG"
    # the role: whatever it still owns or holds in this database, then the role itself
    admin <<'SQL'
REASSIGN OWNED BY :"role" TO :"owner";
DROP OWNED BY :"role";
DROP ROLE :"role";
SQL
}

"$1"
