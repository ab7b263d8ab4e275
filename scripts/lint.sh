#!/usr/bin/env bash
# The lint and type gate that scripts/test.sh (and so CI) runs before the
# tests: ruff's rules, ruff's formatting, then mypy, all configured in
# pyproject.toml. It stops at the first check that fails. Run it on its own
# after bootstrap (which installs ruff and mypy and generates ferrum/v1):
#   bash scripts/lint.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"

fail() {
    echo "lint: FAILED: $1" >&2
    echo "lint: $2" >&2
    exit 1
}

if [ ! -f ferrum/v1/api_pb2_grpc.pyi ]; then
    fail "ferrum/v1 has no generated stubs" "run: $PYTHON scripts/gen_protos.py (bootstrap does)"
fi

echo "lint: ruff check"
"$PYTHON" -m ruff check --quiet . \
    || fail "ruff check found the problems above" "fix them; 'ruff check --fix .' does the safe ones"

echo "lint: ruff format --check"
"$PYTHON" -m ruff format --check --quiet . \
    || fail "the files above are not formatted" "run: $PYTHON -m ruff format ."

echo "lint: mypy"
"$PYTHON" -m mypy \
    || fail "mypy found the type errors above" "fix them; a '# type: ignore[code]' needs a reason beside it"

echo "lint: all checks passed"
