#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for Podium's store tests and print its URL.
#
# Idempotent: installs PostgreSQL from Debian's registry only when it is missing, initializes a
# cluster once under $PODIUM_PG_DIR (default /tmp/podium-postgres), starts it only when it is not
# already running, and creates the database only when it does not exist. PostgreSQL refuses to
# run as root, so the server runs as the `postgres` system user.
#
#   eval "$(scripts/postgres.sh)"      # exports PODIUM_TEST_POSTGRES_URL
#   scripts/postgres.sh stop           # stops it (fast: sessions are cut); run again to restart
#
# The URL is also written to $PODIUM_PG_DIR/url for tests that start the server themselves.
set -euo pipefail

PG_DIR="${PODIUM_PG_DIR:-/tmp/podium-postgres}"
PG_PORT="${PODIUM_PG_PORT:-55432}"
PG_DB="${PODIUM_PG_DB:-podium_test}"
PG_USER=postgres

log() { echo "postgres.sh: $*" >&2; }

find_bindir() {
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        [ -x "$d/initdb" ] && { echo "$d"; return 0; }
    done
    command -v initdb >/dev/null 2>&1 && { dirname "$(readlink -f "$(command -v initdb)")"; return 0; }
    return 1
}

if ! BINDIR="$(find_bindir)"; then
    [ "$(id -u)" -eq 0 ] || { log "PostgreSQL is not installed and this is not root"; exit 1; }
    log "installing PostgreSQL from the Debian registry"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
    BINDIR="$(find_bindir)"
fi

# Run a command as the postgres user when we are root, as ourselves otherwise.
as_pg() {
    if [ "$(id -u)" -eq 0 ]; then
        if command -v runuser >/dev/null 2>&1; then
            runuser -u "$PG_USER" -- "$@"
        else
            su "$PG_USER" -s /bin/sh -c "$(printf '%q ' "$@")"
        fi
    else
        "$@"
    fi
}

if [ "$(id -u)" -eq 0 ]; then
    id "$PG_USER" >/dev/null 2>&1 || useradd --system --home-dir "$PG_DIR" "$PG_USER"
    RUN_AS="$PG_USER"
else
    RUN_AS="$(id -un)"
    PG_USER="$RUN_AS"
fi

mkdir -p "$PG_DIR"
[ "$(id -u)" -eq 0 ] && chown "$RUN_AS" "$PG_DIR"
DATA="$PG_DIR/data"

if [ ! -f "$DATA/PG_VERSION" ]; then
    log "initializing a cluster in $DATA"
    as_pg "$BINDIR/initdb" -D "$DATA" -U "$PG_USER" --auth=trust -E UTF8 >&2
fi

if [ "${1:-}" = "stop" ]; then
    as_pg "$BINDIR/pg_ctl" -D "$DATA" -m fast -w stop >&2
    exit 0
fi

accepting() { "$BINDIR/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" >/dev/null 2>&1; }

if ! accepting; then
    # A server killed hard (as a finished session's processes are) leaves postmaster.pid
    # behind, and its pid may belong to another process by now: pg_ctl would then report
    # "running" and never start. Nothing answers on our port, so the file is stale.
    if as_pg "$BINDIR/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
        as_pg "$BINDIR/pg_ctl" -D "$DATA" -m immediate stop >/dev/null 2>&1 || true
    fi
    if ! accepting && [ -f "$DATA/postmaster.pid" ]; then
        log "removing a stale postmaster.pid"
        rm -f "$DATA/postmaster.pid"
    fi
    log "starting on 127.0.0.1:$PG_PORT"
    (
        # The server outlives this script, so it must not keep the caller's descriptors: run
        # under `flock LOCK make test` it held the lock for as long as it ran (seen here).
        for fd in /proc/$BASHPID/fd/*; do
            fd="${fd##*/}"
            [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-" 2>/dev/null || true
        done
        as_pg "$BINDIR/pg_ctl" -D "$DATA" -l "$PG_DIR/server.log" -w -t 60 \
            -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_DIR -c fsync=off" start >&2
    )
fi

if ! as_pg "$BINDIR/psql" -h 127.0.0.1 -p "$PG_PORT" -U "$PG_USER" -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'" | grep -q 1; then
    as_pg "$BINDIR/createdb" -h 127.0.0.1 -p "$PG_PORT" -U "$PG_USER" "$PG_DB" >&2
fi

URL="postgresql+psycopg://$PG_USER@127.0.0.1:$PG_PORT/$PG_DB"
echo "$URL" > "$PG_DIR/url"
[ "$(id -u)" -eq 0 ] && chmod 0644 "$PG_DIR/url"
echo "export PODIUM_TEST_POSTGRES_URL=$URL"
