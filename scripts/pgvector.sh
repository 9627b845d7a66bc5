#!/usr/bin/env bash
# Builds pgvector (the PostgreSQL extension the memories' vector column needs) from the vendored
# source in ../shared/vendor/ and installs it into the machine's PostgreSQL, unless the server
# already offers it. Debian 12's archive has no pgvector package. Run as root; the server is not
# restarted (a new extension needs no restart). About 5 s of build on 2 cores.
#   bash scripts/pgvector.sh                  install if missing, then say which version is there
#   PGVECTOR_FORCE=1 bash scripts/pgvector.sh build and install even so (another version)
set -euo pipefail
cd "$(dirname "$0")/.."

SOURCE="${PGVECTOR_SOURCE:-../shared/vendor/pgvector-0.8.6}"
PSQL=(psql -h 127.0.0.1 -U postgres -d postgres -Atqc)

available() {
    "${PSQL[@]}" "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'"
}

if [ -n "$(available)" ] && [ -z "${PGVECTOR_FORCE:-}" ]; then
    echo "pgvector $(available) is available to PostgreSQL"
    exit 0
fi

if [ ! -d "$SOURCE" ]; then
    echo "pgvector's source is not at $SOURCE (set PGVECTOR_SOURCE)" >&2
    exit 1
fi

# The server's major version decides the headers and where the library goes.
major="$("${PSQL[@]}" "SHOW server_version_num")"
major="${major:0:${#major}-4}"
pg_config="/usr/lib/postgresql/$major/bin/pg_config"
if [ ! -e "/usr/include/postgresql/$major/server/postgres.h" ] || [ ! -x "$pg_config" ]; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y "postgresql-server-dev-$major" make gcc
fi

# Built in a copy: shared/ may be laid without write bits. OPTFLAGS="": no -march=native, so the
# library runs on any CPU of the same architecture.
build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
cp -r "$SOURCE"/. "$build"
make -s -C "$build" PG_CONFIG="$pg_config" OPTFLAGS=""
make -s -C "$build" PG_CONFIG="$pg_config" OPTFLAGS="" install

echo "pgvector $(available) installed into PostgreSQL $major"
