#!/usr/bin/env bash
# Runs the suite twice: on the embedded defaults (SQLite, no Redis), then scaled out on
# PostgreSQL and Redis. A machine without those skips the second run; CI may not.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${VENV:-.venv}/bin"
export HF_HUB_OFFLINE=1
PG_URL="${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/ferrum_memory}"
export TEST_REDIS_URL="${TEST_REDIS_URL:-redis://127.0.0.1:6379/15}"

answers() {  # answers URL: does something listen at the URL's host and port?
  "$BIN/python" - "$1" <<'PY'
import socket, sys
from urllib.parse import urlsplit
url = urlsplit(sys.argv[1])
try:
    socket.create_connection((url.hostname, url.port), timeout=2).close()
except OSError:
    sys.exit(1)
PY
}

"$BIN/coverage" erase
echo "== embedded: SQLite, database working memory, SQLite broker"
env -u DATABASE_URL -u REDIS_URL -u CELERY_BROKER_URL -u QDRANT_URL \
  "$BIN/pytest" --cov --cov-report= "$@"

if answers "$PG_URL" && answers "$TEST_REDIS_URL"; then
  echo "== scaled out: PostgreSQL, Redis"
  # The live-server tests (schemathesis) run the service on the embedded defaults in either
  # run; once is enough.
  DATABASE_URL="$PG_URL" REDIS_URL="$TEST_REDIS_URL" \
    "$BIN/pytest" --cov --cov-append --cov-report= -m "not live_server" "$@"
elif [ "${CI:-}" = "true" ]; then
  echo "CI needs PostgreSQL at $PG_URL and Redis at $TEST_REDIS_URL; one of them does not answer." >&2
  exit 1
else
  echo "== scaled-out run skipped: no PostgreSQL at $PG_URL or no Redis at $TEST_REDIS_URL"
fi

"$BIN/coverage" report --fail-under=95
