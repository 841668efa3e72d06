#!/usr/bin/env bash
# Set up (with the test, export, import, tensorboard and serve extras) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,export,import,tensorboard,serve
exec .venv/bin/python -m pytest "$@"
