#!/usr/bin/env bash
# Installs shardport into .venv and runs the end-to-end demo on the embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
exec .venv/bin/python -m shardport.deploy.demo "$@"
