#!/usr/bin/env bash
# Run the whole test suite against real dependencies: PostgreSQL (started here), the real
# vLLM engine on the default model (materialized into the cache by the tests' session).
# `--fast` runs the fast tier instead: no engine, no PostgreSQL, no Ray, no browser
# (tests/README.md). The fast tier runs across PODIUM_TEST_WORKERS processes (pytest-xdist,
# default 2: this machine's cores); the rest (engines, the database, Ray: one at a time on a
# 2-core box) in one process after it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PODIUM_HOME="${PODIUM_HOME:-$PWD/.podium}"
export HF_HUB_OFFLINE=1
# pytest caches its rewritten test modules as bytecode; with PYTHONDONTWRITEBYTECODE set (some
# images do) every run and every xdist worker rewrites ~600 modules again (~4-12 s a process)
unset PYTHONDONTWRITEBYTECODE

.venv/bin/ruff check src tests bench

FAST="not engine and not postgres and not ray and not browser"
WORKERS="${PODIUM_TEST_WORKERS:-2}"

if [[ "${1:-}" == "--fast" ]]; then
    shift
    exec .venv/bin/python -m pytest -m "$FAST" -n "$WORKERS" "$@"
fi

# chromium for tests/console (a no-op once installed); without it those tests skip, saying so
# (in CI, CI=true, they fail instead: a skipped real-path test would hide the gap)
bash scripts/browser.sh >&2 || echo "scripts/browser.sh failed: tests/console will skip" >&2

# a failing command substitution inside eval would be ignored; an assignment is not
pg_env="$(bash scripts/postgres.sh)"
eval "$pg_env"

if [[ $# -gt 0 ]]; then  # a chosen subset: as asked, in one process
    exec .venv/bin/python -m pytest "$@"
fi
# the fast tier across processes, then the rest in one; both run whatever the first gives
status=0
.venv/bin/python -m pytest -m "$FAST" -n "$WORKERS" || status=$?
.venv/bin/python -m pytest -m "not ($FAST)" || status=$?
exit "$status"
