#!/usr/bin/env bash
# Starts or checks the local PostgreSQL and Redis that the test suite talks to.
#   start           start whichever is not answering, then wait until both answer (~30 s)
#   check-postgres  exit 0 if PostgreSQL accepts connections on 127.0.0.1:5432 and offers pgvector
set -euo pipefail

HOST=127.0.0.1
PG_PORT=5432
REDIS_PORT=6379
WAIT_SECONDS=30

# A bare TCP connect, for machines without the client tools.
port_open() {
    "${PYTHON:-python3}" -c 'import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()' "$1" "$2" 2>/dev/null
}

postgres_up() {
    if command -v pg_isready >/dev/null; then
        pg_isready -q -h "$HOST" -p "$PG_PORT"
    else
        port_open "$HOST" "$PG_PORT"
    fi
}

redis_up() {
    if command -v redis-cli >/dev/null; then
        [ "$(redis-cli -h "$HOST" -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]
    else
        port_open "$HOST" "$REDIS_PORT"
    fi
}

# The start commands are the ones the machine image uses (machines/python-svc.md). A failing
# start command is only reported: the wait below decides, since the server may be mid-start.
start_postgres() {
    pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start
}

start_redis() {
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log
}

ensure() {
    local name=$1 check=$2 starter=$3
    if "$check"; then
        echo "$name: already answering"
        return 0
    fi
    echo "$name: not answering, starting it"
    local rc=0
    "$starter" || rc=$?
    if [ "$rc" = 127 ]; then
        echo "ERROR: $name is not installed here (start command not found)" >&2
        return 1
    elif [ "$rc" != 0 ]; then
        echo "$name: start command failed (exit $rc); waiting in case it is already starting" >&2
    fi
    for _ in $(seq "$WAIT_SECONDS"); do
        if "$check"; then
            echo "$name: answering"
            return 0
        fi
        sleep 1
    done
    echo "ERROR: $name still not answering after ${WAIT_SECONDS}s" >&2
    return 1
}

case "${1:-}" in
    start)
        status=0
        ensure PostgreSQL postgres_up start_postgres || status=1
        ensure Redis redis_up start_redis || status=1
        exit "$status"
        ;;
    check-postgres)
        # The memories' migration needs the vector extension (scripts/pgvector.sh builds it).
        if postgres_up && command -v psql >/dev/null && [ -z "$(psql -h "$HOST" -p "$PG_PORT" \
                -U postgres -d postgres -Atqc "SELECT 1 FROM pg_available_extensions WHERE name = 'vector'" 2>/dev/null)" ]; then
            echo "PostgreSQL: answering on $HOST:$PG_PORT, without pgvector (bash scripts/pgvector.sh as root, or PGDG's postgresql-NN-pgvector)"
            exit 1
        elif postgres_up; then
            echo "PostgreSQL: answering on $HOST:$PG_PORT"
        else
            echo "PostgreSQL: not answering on $HOST:$PG_PORT"
            exit 1
        fi
        ;;
    *)
        echo "usage: $0 start|check-postgres" >&2
        exit 2
        ;;
esac
