#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the tests. Source it, then `pg_start` exports
# SPECDEC_TEST_POSTGRES_URL and `pg_stop` stops the server and deletes the cluster (pg_start sets
# an EXIT trap for that, so it also happens on failure). Run directly: `postgres.sh start|stop`
# prints the URL / removes the cluster whose directory is in $SPECDEC_PG_DIR.
#
# Uses the server binaries if the machine has them, else installs Debian's `postgresql` (root).
# PostgreSQL refuses to run as root, so as root the cluster belongs to an unprivileged user.

_pg_bindir() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && { echo "$d"; return 0; }
  done
  command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 && {
    dirname "$(command -v initdb)"; return 0; }
  return 1
}

_pg_as() {  # run a command as the cluster's owner
  if [ "$(id -u)" = 0 ]; then runuser -u "$SPECDEC_PG_OS_USER" -- "$@"; else "$@"; fi
}

pg_start() {
  local bindir port
  if ! bindir=$(_pg_bindir); then
    [ "$(id -u)" = 0 ] || { echo "postgres.sh: no PostgreSQL server binaries and not root" >&2; return 1; }
    echo "postgres.sh: installing Debian's postgresql" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null
    bindir=$(_pg_bindir) || { echo "postgres.sh: no initdb after installing postgresql" >&2; return 1; }
  fi
  SPECDEC_PG_OS_USER=${SPECDEC_PG_OS_USER:-specdec-pg}
  if [ "$(id -u)" = 0 ] && ! id -u "$SPECDEC_PG_OS_USER" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$SPECDEC_PG_OS_USER"
  fi
  SPECDEC_PG_DIR=$(mktemp -d /tmp/specdec-pg.XXXXXX)
  export SPECDEC_PG_DIR SPECDEC_PG_OS_USER SPECDEC_PG_BIN=$bindir
  trap pg_stop EXIT
  chmod 755 "$SPECDEC_PG_DIR"
  [ "$(id -u)" = 0 ] && chown "$SPECDEC_PG_OS_USER" "$SPECDEC_PG_DIR"
  local password=specdec-test-pw
  _pg_as sh -c "printf '%s\n' '$password' > '$SPECDEC_PG_DIR/pw'"
  _pg_as "$bindir/initdb" -D "$SPECDEC_PG_DIR/data" -U specdec --pwfile="$SPECDEC_PG_DIR/pw" \
    --auth-host=scram-sha-256 --auth-local=trust -E UTF8 --no-sync >"$SPECDEC_PG_DIR/initdb.log" 2>&1 ||
    { cat "$SPECDEC_PG_DIR/initdb.log" >&2; return 1; }
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  _pg_as "$bindir/pg_ctl" -D "$SPECDEC_PG_DIR/data" -l "$SPECDEC_PG_DIR/server.log" -w -t 60 \
    -o "-p $port -k $SPECDEC_PG_DIR -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" \
    start >/dev/null || { cat "$SPECDEC_PG_DIR/server.log" >&2; return 1; }
  _pg_as "$bindir/psql" -q -h "$SPECDEC_PG_DIR" -p "$port" -U specdec -d postgres \
    -c "CREATE DATABASE specdec_test" >/dev/null
  export SPECDEC_TEST_POSTGRES_URL="postgresql+psycopg://specdec:$password@127.0.0.1:$port/specdec_test"
  echo "postgres.sh: PostgreSQL $("$bindir/postgres" --version | awk '{print $3}') on 127.0.0.1:$port (cluster $SPECDEC_PG_DIR)" >&2
}

pg_stop() {
  [ -n "${SPECDEC_PG_DIR:-}" ] && [ -d "$SPECDEC_PG_DIR" ] || return 0
  if [ -f "$SPECDEC_PG_DIR/data/postmaster.pid" ]; then
    _pg_as "$SPECDEC_PG_BIN/pg_ctl" -D "$SPECDEC_PG_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$SPECDEC_PG_DIR"
  unset SPECDEC_TEST_POSTGRES_URL
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  case "${1:-}" in
    start) pg_start; trap - EXIT
           echo "export SPECDEC_PG_DIR=$SPECDEC_PG_DIR SPECDEC_PG_OS_USER=$SPECDEC_PG_OS_USER SPECDEC_PG_BIN=$SPECDEC_PG_BIN"
           echo "export SPECDEC_TEST_POSTGRES_URL=$SPECDEC_TEST_POSTGRES_URL" ;;
    stop) SPECDEC_PG_BIN=${SPECDEC_PG_BIN:-$(_pg_bindir)}; pg_stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
  esac
fi
