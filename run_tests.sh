#!/usr/bin/env bash
# Set up .venv if needed, then run the test suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")"
source scripts/ensure_venv.sh
python -m pytest -q "$@"
