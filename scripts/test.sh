#!/usr/bin/env bash
# Set up (with the test, export, import, tensorboard and serve extras) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,export,import,tensorboard,serve
# The suite starts some hundred Python processes: compile the checkout once for all of them
# (where PYTHONDONTWRITEBYTECODE is set, each would compile every module it imports again).
# A file that does not compile is left to pytest, which reports it.
.venv/bin/python -m compileall -qq -j 0 tformer tests benchmarks || true
# Two workers, one thread each (tests/conftest.py): most tests are one thread's work or wait on
# the processes they start. `-n N` in the arguments takes N workers instead, `-n 0` none.
exec .venv/bin/python -m pytest -n 2 --dist loadgroup "$@"
