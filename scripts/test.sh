#!/usr/bin/env bash
# Set up (with the test, export, import, tensorboard and serve extras) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# The suite starts some hundred Python processes: the first to import a module writes its byte
# code for all the others (where PYTHONDONTWRITEBYTECODE is set, each would compile again every
# module it imports, and setup.sh would compile all of site-packages, most of it never imported).
unset PYTHONDONTWRITEBYTECODE
bash scripts/setup.sh dev,export,import,tensorboard,serve
# Two workers, one thread each (tests/conftest.py): most tests are one thread's work or wait on
# the processes they start. `-n N` in the arguments takes N workers instead, `-n 0` none.
exec .venv/bin/python -m pytest -n 2 --dist loadgroup "$@"
