#!/usr/bin/env bash
# The README's test command: bootstrap everything, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest -p no:cacheprovider -q "$@"
