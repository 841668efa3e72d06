#!/usr/bin/env bash
# Set up (with the test, export and tensorboard extras) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,export,tensorboard
exec .venv/bin/python -m pytest "$@"
