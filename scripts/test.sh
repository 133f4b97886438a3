#!/usr/bin/env bash
# Installs what the tests need into .venv, then runs linters, type checks, layer contracts and the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# The test extra includes `compare`: transformers + accelerate, test_vs_transformers' reference.
bash scripts/setup-venv.sh test
# The HTML report is tested in a real browser: Debian's headless Chromium (about a minute to install).
if ! command -v chromium-headless-shell >/dev/null 2>&1; then
    apt-get install -y -q chromium-headless-shell >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium-headless-shell >/dev/null; }
fi
export PATH="$PWD/.venv/bin:$PATH"
bash scripts/lint.sh
# Two workers, one per core of a CI machine; a whole test file stays on one worker (its module
# fixtures start once). Each worker starts its own servers and Ray cluster on 127.0.0.1.
# SHARDPORT_TEST_WORKERS=0 runs the suite in this process.
pytest -n "${SHARDPORT_TEST_WORKERS:-2}" --dist loadfile "$@"
