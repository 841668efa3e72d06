#!/usr/bin/env bash
# Set up (with the test, export, import, tensorboard and serve extras) and run the test suite in
# parallel, one worker per core. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,export,import,tensorboard,serve
# One worker process per core (pytest-xdist), each test file on one worker so that a file's
# fixtures are made once; `-n 0` runs everything in this process.
parallel=(-n auto --dist loadfile)
for arg in "$@"; do
  case "$arg" in -n|-n*|--numprocesses*|no:xdist) parallel=() ;; esac
done
exec .venv/bin/python -m pytest "${parallel[@]}" "$@"
