#!/usr/bin/env bash
# Set up (with the test, export, tensorboard and serve extras) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,export,tensorboard,serve
exec .venv/bin/python -m pytest "$@"
