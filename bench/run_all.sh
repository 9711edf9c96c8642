#!/usr/bin/env bash
# Every benchmark, then a summary table against issue 13's goals:
#   bench/run_all.sh --full    (the default; about 15 minutes on 2 cores, throughput and the backlog in three rounds)
#   bench/run_all.sh --quick
# Uses BENCH_DATABASE_URL (default postgres://postgres@127.0.0.1:5432/backwave_bench), which it
# creates and migrates when missing; the benchmarks empty its job table, so never point it at a
# database you keep. VENV is the virtualenv (default .venv beside this repository).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-$PWD/.venv}"
export DATABASE_URL="${BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/backwave_bench}"
"$VENV/bin/python" - <<'PY'
import os, psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
params = conninfo_to_dict(os.environ["DATABASE_URL"])
name = params["dbname"]
if "bench" not in name:
    raise SystemExit(f"BENCH_DATABASE_URL names {name!r}: the benchmarks empty its job table, so its name must contain 'bench'")
with psycopg.connect(make_conninfo(**{**params, "dbname": "postgres"}), autocommit=True) as conn:
    if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
PY
"$VENV/bin/python" manage.py migrate -v0
cd bench && exec "$VENV/bin/python" all.py "$@"
