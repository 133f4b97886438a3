"""Rank pulls of stacked experts, end to end: every rank's ledger counts a checked witness for every
quantized weight in its plan, none unchecked (tp x ep layouts of a GGUF with ``[E, N, K]`` experts)."""

from __future__ import annotations

import json
from pathlib import Path

from llama_artifacts import ok
from witness_artifacts import gguf_model

from shardport.registry.artifact.manifest import Manifest
from shardport.registry.session import Session


def test_every_rank_of_tp_and_ep_checks_its_experts_witnesses(tmp_path: Path, home: Path) -> None:
    src = tmp_path / "ck"
    src.mkdir()
    gguf_model(src, experts=8)
    store = str(tmp_path / "store")
    ok(store, "keygen")
    digest = ok(store, "push", src, "acme/moe:v1", "--tile-min", "256", "--tile-size", "16384")["digest"]
    manifest = Manifest.from_bytes(Session.open(store).store.read_blob(digest))
    quantized = {w.name for w in manifest.weights or [] if w.contract.family != "float"}
    for tp, ep in ((2, 2), (3, 4)):
        dest = tmp_path / f"tp{tp}-ep{ep}"
        for rank in range(tp * ep):
            args = ("--tp", str(tp), "--ep", str(ep), "--rank", str(rank))
            ledger = ok(store, "pull", "acme/moe:v1", dest, *args)["ledger"]
            plan = json.loads((dest / f"rank-{rank:05d}.plan.json").read_text())
            loads = {r["weight"] for r in plan["reads"]} & quantized
            assert any("exps" in name for name in loads)
            assert ledger["witness_weights_unchecked"] == 0, (tp, ep, rank)
            assert ledger["witness_weights_checked"] == len(loads), (tp, ep, rank)
            assert ledger["witness_cells_checked"] >= len(loads)
