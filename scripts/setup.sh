#!/usr/bin/env bash
# Create .venv (once) and install tformer into it.
#
# torch: an existing torch in .venv is kept (install your CUDA/ROCm build there first to use it).
# Otherwise a CPU-only build is installed: on Linux, PyPI's default torch wheel bundles CUDA
# (several GB), so the PyTorch CPU index is offered next to PyPI and its "+cpu" build wins.
# Set TFORMER_TORCH_INDEX to another index (e.g. https://download.pytorch.org/whl/cu124) to change that.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${TFORMER_VENV:-.venv}"
TORCH_VERSION="${TFORMER_TORCH_VERSION:-2.13.0}"
TORCH_INDEX="${TFORMER_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "tformer setup: creating $VENV with $($PYTHON --version 2>&1)" >&2
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

if "$PY" -c "import torch" 2>/dev/null; then
  echo "tformer setup: keeping torch $("$PY" -c 'import torch; print(torch.__version__)')" >&2
else
  echo "tformer setup: installing torch $TORCH_VERSION (from $TORCH_INDEX or PyPI)" >&2
  "$PY" -m pip install -q --no-compile --retries 1 "torch==$TORCH_VERSION" --extra-index-url "$TORCH_INDEX"
fi

extras="${1:-}"
# The install is editable, so only a changed pyproject.toml (or other extras) needs pip again.
stamp="$VENV/.tformer-installed"
wanted="$("$PY" -c 'import hashlib,sys; print(hashlib.sha256(open("pyproject.toml","rb").read()).hexdigest())') [$extras]"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] && "$PY" -c "import tformer" 2>/dev/null; then
  exit 0
fi
if [ -n "$extras" ]; then
  "$PY" -m pip install -q --no-compile -e ".[$extras]"
else
  "$PY" -m pip install -q --no-compile -e .
fi
# Byte code: Python writes a module's byte code the first time it imports it, unless
# PYTHONDONTWRITEBYTECODE is set; then every process would compile again all it imports, so
# site-packages is compiled now, on every core (pip would do it file by file on one; a file for
# another Python version fails to compile and is skipped, as pip skips it).
[ -z "${PYTHONDONTWRITEBYTECODE:-}" ] || "$PY" -c '
import compileall, sysconfig
paths = sysconfig.get_paths()
for folder in sorted({paths["purelib"], paths["platlib"]}):  # platlib: lib64 on some systems
    compileall.compile_dir(folder, quiet=2, workers=0)
'
echo "$wanted" > "$stamp"
