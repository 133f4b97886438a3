#!/usr/bin/env bash
# ruff, mypy --strict and the import-layer contracts. mypy and import-linter cannot follow the
# package-dir mapping (root folders -> shardport.*), so they run over a copy assembled under build/.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
ruff check .
tree=build/typecheck
rm -rf "$tree" && mkdir -p "$tree/shardport"
cp src/shardport/*.py "$tree/shardport/"
cp -r src/shardport/cli "$tree/shardport/cli"
for p in registry loader placement provenance kernels deploy; do
    cp -r "$p" "$tree/shardport/$p"
done
find "$tree" -name __pycache__ -prune -exec rm -rf {} +
(cd "$tree" && mypy --config-file ../../pyproject.toml -p shardport)
(cd "$tree" && PYTHONPATH=. lint-imports --config ../../pyproject.toml)
