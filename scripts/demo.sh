#!/usr/bin/env bash
# The README's main command: bootstrap, then run the demo on the embedded stack.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/ferrum demo "$@"
