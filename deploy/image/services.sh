#!/bin/sh
# The entry point of cdiflow's service images: `postgres`, `redis` or `s3`, each configured
# from files under /run/secrets (never from the command line, which `ps` shows) and serving on
# every address of its container (its network decides who reaches it).
set -eu

secret() { # the content of /run/secrets/$1, or a clear stop
    [ -r "/run/secrets/$1" ] || { echo "services.sh: /run/secrets/$1 is missing or unreadable" >&2; exit 64; }
    cat "/run/secrets/$1"
}

case "${1:-}" in
postgres)
    PGDATA=${PGDATA:-/var/lib/postgresql/data}
    bin=/usr/lib/postgresql/15/bin
    if [ ! -s "$PGDATA/PG_VERSION" ]; then
        # The first start on an empty volume: the superuser `postgres` (for set-up alone) and
        # the role `cdiflow`, owner of the database `cdiflow` and nothing more; their passwords
        # from the secrets; scram for every connection.
        umask 077
        secret postgres-admin-password > /tmp/pwfile
        "$bin/initdb" --pgdata="$PGDATA" --username=postgres --pwfile=/tmp/pwfile \
            --auth-local=scram-sha-256 --auth-host=scram-sha-256 --encoding=UTF8 \
            --locale=C.UTF-8 >/dev/null
        rm -f /tmp/pwfile
        printf '%s\n' "host all all 0.0.0.0/0 scram-sha-256" "host all all ::/0 scram-sha-256" \
            >> "$PGDATA/pg_hba.conf"
        printf "CREATE ROLE cdiflow LOGIN PASSWORD '%s';\nCREATE DATABASE cdiflow OWNER cdiflow;\n" \
            "$(secret postgres-password)" | "$bin/postgres" --single -D "$PGDATA" postgres >/dev/null
    fi
    exec "$bin/postgres" -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/tmp \
        -c max_connections="${POSTGRES_MAX_CONNECTIONS:-200}"
    ;;
redis)
    # Nothing persisted: Redis holds only what cdiflow rebuilds from Postgres.
    umask 077
    printf 'requirepass %s\n' "$(secret redis-password)" > /tmp/redis.conf
    exec redis-server /tmp/redis.conf --bind 0.0.0.0 -::* --port 6379 --save '' \
        --appendonly no --dir /tmp --daemonize no
    ;;
s3)
    ROOT_ACCESS_KEY_ID=$(secret s3-access-key-id)
    ROOT_SECRET_ACCESS_KEY=$(secret s3-secret-access-key)
    export ROOT_ACCESS_KEY_ID ROOT_SECRET_ACCESS_KEY
    exec versitygw --port 0.0.0.0:7070 --region "${AWS_REGION:-us-east-1}" --keep-alive --quiet \
        posix --file-perms 0600 --dir-perms 0700 /data
    ;;
*)
    echo "usage: services.sh postgres|redis|s3" >&2
    exit 64
    ;;
esac
