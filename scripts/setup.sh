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
# Debian's Chromium and ChromeDriver for the browser test of the HTML viewer (skipped when absent).
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && ! command -v chromedriver >/dev/null 2>&1; then
  echo "installing chromium and chromium-driver (Debian packages) for the browser test"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
    || echo "could not install chromium; the browser test will be skipped"
fi
# Debian's PostgreSQL server binaries for the tests of the PostgreSQL store (each test run starts a
# private cluster in a temporary directory; skipped when no binaries can be had).
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
  && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  echo "installing postgresql-15 (Debian package) for the PostgreSQL store tests"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15 >/dev/null) \
    || echo "could not install postgresql-15; the PostgreSQL tests will be skipped"
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
