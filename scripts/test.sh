#!/usr/bin/env bash
# Installs what the tests need into .venv, then runs linters, type checks, layer contracts and the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh test
export PATH="$PWD/.venv/bin:$PATH"
bash scripts/lint.sh
pytest "$@"
