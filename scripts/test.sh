#!/usr/bin/env bash
# Set up (with the test and export extras) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,export
exec .venv/bin/python -m pytest "$@"
