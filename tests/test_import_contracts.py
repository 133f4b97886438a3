"""The import contracts cover the tree as it is: a new registry module cannot slip past them."""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_standalone_contract_forbids_every_other_registry_module() -> None:
    """``registry.formats``/``registry.contracts`` may import only ``registry.errors`` of the rest.

    And the model families (``registry.families``): pure vocabulary, itself importing nothing of
    shardport (its own contract), which the contracts bind weight names with.
    """
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (standalone,) = [c for c in contracts if c["name"].startswith("Formats and contracts stand alone")]
    listed = set(standalone["forbidden_modules"])
    registry = ROOT / "registry"
    own = ("__init__", "errors")
    modules = {f"shardport.registry.{p.stem}" for p in registry.glob("*.py") if p.stem not in own}
    rooms = {
        f"shardport.registry.{p.name}"
        for p in registry.iterdir()
        if (p / "__init__.py").exists() and p.name not in ("formats", "contracts", "families")
    }
    assert modules | rooms == listed
