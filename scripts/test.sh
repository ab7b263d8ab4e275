#!/usr/bin/env bash
# The README's test command: bootstrap everything, run the lint and type gate
# (scripts/lint.sh), then the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/lint.sh
# Two workers, one test file each at a time (module fixtures stay per file): the
# suite spends most of its time waiting on servers, VMs and timeouts, and used
# about half a core run serially (measured), so two files at once fit 2 cores.
exec .venv/bin/python -m pytest -p no:cacheprovider -q -n 2 --dist loadfile --durations=30 "$@"
