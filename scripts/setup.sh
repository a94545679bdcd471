#!/usr/bin/env bash
# Create the virtual environment (.venv) and install hiermem with every extra; idempotent.
# CPU-only torch first, so sentence-transformers does not pull a CUDA build. Override with TORCH_SPEC.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${HIERMEM_VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.hiermem-install-stamp"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "installing hiermem and its dependencies into $VENV (first run takes a few minutes)"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet "$TORCH_SPEC"
  "$VENV/bin/python" -m pip install --quiet -e ".[all]"
  echo "$want" > "$stamp"
fi
