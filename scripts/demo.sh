#!/usr/bin/env bash
# Set up (if needed) and run the main job: `hiermem demo` on the embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${HIERMEM_VENV:-.venv}/bin/hiermem" demo "$@"
