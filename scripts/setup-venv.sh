#!/usr/bin/env bash
# Creates .venv (if missing) and installs shardport with the extras named in $1.
# torch is installed first, pinned, so pip never resolves a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt "torch==2.13.0"
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".${extras:+[$extras]}"
