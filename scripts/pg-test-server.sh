#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests: a fresh cluster in a temporary folder, on a
# local port, owned by the `postgres` user (the server refuses to run as root), with a
# database and a user for the tests. Nothing of the system's own clusters is touched.
#
#   bash scripts/pg-test-server.sh start DIR [PORT]   # prints the URL on stdout
#                                                     # (PORT: a free one when not given)
#   bash scripts/pg-test-server.sh stop DIR
#
# `start` prints `postgres://tensortune:tensortune@127.0.0.1:PORT/tensortune`, the value the
# tests read from TENSORTUNE_TEST_PG_URL. Needs Debian's `postgresql` package (PostgreSQL's
# binaries under /usr/lib/postgresql/VERSION/bin) or initdb and pg_ctl on the PATH.
set -euo pipefail
cmd="${1:-}"
dir="${2:-}"
port="${3:-}"
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi

bin=""
if command -v pg_ctl >/dev/null 2>&1; then
  bin="$(dirname "$(readlink -f "$(command -v pg_ctl)")")"
else
  # The newest installed major version.
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V); do bin="$d"; done
fi
if [ -z "$bin" ] || [ ! -x "$bin/pg_ctl" ]; then
  echo "pg-test-server: no PostgreSQL found (apt-get install -y postgresql)" >&2
  exit 1
fi

# Runs a server binary as the owner of the cluster: `postgres` when we are root.
as_owner() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

case "$cmd" in
  start)
    if [ -z "$port" ]; then
      port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    fi
    mkdir -p "$dir"
    [ "$(id -u)" -eq 0 ] && chown postgres "$dir"
    as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 \
      >"$dir/initdb.log" 2>&1
    # Durability settings stay at their defaults: the tests kill writers, not the server.
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200" start \
      >/dev/null
    psql=("$bin/psql" -h "$dir" -p "$port" -U postgres -d postgres -q -v ON_ERROR_STOP=1)
    # CREATEDB: the tests make a schema each, and may make databases.
    as_owner "${psql[@]}" -c "CREATE USER tensortune PASSWORD 'tensortune' CREATEDB" >/dev/null
    as_owner "${psql[@]}" -c "CREATE DATABASE tensortune OWNER tensortune" >/dev/null
    echo "postgres://tensortune:tensortune@127.0.0.1:$port/tensortune"
    ;;
  stop)
    if [ -f "$dir/data/postmaster.pid" ]; then
      as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null || true
    fi
    ;;
  *)
    echo "pg-test-server: unknown command '$cmd' (expected start or stop)" >&2
    exit 2
    ;;
esac
