"""L5 read from the manifest: real dispatch traces of a pushed GGUF agree with the kernels push pinned,
and a trace that selected another kernel is named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bringup_artifacts import gguf_tiny
from support import Cli

from shardport.deploy.pinned_kernels import check_pins
from shardport.deploy.rank_ops import is_quantized
from shardport.kernels import FallbackPolicy, default_catalog, dispatch_activations, rank_weight
from shardport.registry.artifact.manifest import Manifest
from shardport.registry.checkpoint.analysis import PlaneReader
from shardport.registry.store.protocol import Store


@pytest.fixture
def pushed(capsys: pytest.CaptureFixture[str], tmp_path: Path, home: Path) -> tuple[Manifest, Path]:
    folder = gguf_tiny(tmp_path / "g")
    cli = Cli(capsys, str(tmp_path / "store"))
    cli.ok("keygen")
    out = cli.ok("push", folder, "g:v1")
    return Manifest.from_bytes(Store(cli.store).read_blob(out["digest"])), folder


def _report(
    manifest: Manifest, folder: Path, activations: Any, policy: FallbackPolicy | None = None
) -> dict[str, Any]:
    """One tp = 1 rank's dispatch report, as the rank writes it: every quantized weight, both phases."""
    reader = PlaneReader(folder)
    by_name = {t.name: t for t in manifest.tensors or ()}
    traces = []
    for w in manifest.weights or ():
        if not is_quantized(w) or len(w.shape.extents) != 2:
            continue
        rw = rank_weight(w, reader.planes(w, by_name))
        chosen = dispatch_activations(rw, default_catalog(), activations, policy=policy or FallbackPolicy())
        traces += [t.model_dump(mode="json") for _, t in chosen.values()]
    return {"rank": 0, "activations": activations, "device": "cpu", "dispatch": traces}


@pytest.mark.parametrize("activations", ["float32", "bfloat16"])
def test_every_trace_selects_the_pinned_kernel(pushed: tuple[Manifest, Path], activations: str) -> None:
    manifest, folder = pushed
    report = _report(manifest, folder, activations)
    result = check_pins(manifest, [report])
    assert result["pinned"] and result["passed"], result["unexpected"]
    assert result["checked"] == len(report["dispatch"]) > 0 and result["not_pinned"] == 0


def test_another_kernel_than_the_pin_is_named(pushed: tuple[Manifest, Path]) -> None:
    manifest, folder = pushed
    report = _report(manifest, folder, "float32")
    report["dispatch"][0]["selected"] = "reference@1"
    result = check_pins(manifest, [report])
    assert not result["passed"] and len(result["unexpected"]) == 1
    assert "reference@1, the manifest pins" in result["unexpected"][0]
    older = manifest.model_copy(
        update={"runtime": manifest.runtime.model_copy(update={"expected_kernels": None})}
    )
    assert check_pins(older, [report]) == {
        "pinned": False,
        "checked": 0,
        "not_pinned": len(report["dispatch"]),
        "policy_refused": 0,
        "unexpected": [],
        "passed": True,
    }


def test_a_pinned_kernel_the_runs_policy_refuses_is_not_held_against_the_run(
    pushed: tuple[Manifest, Path],
) -> None:
    """Pins are computed under the default policy; ``--fallback forbid`` also forbids conversions, so a
    bfloat16 run selects another kernel where the pin converts: counted apart, not a failure."""
    manifest, folder = pushed
    report = _report(manifest, folder, "bfloat16", FallbackPolicy.from_cli("forbid"))
    result = check_pins(manifest, [report])
    assert result["passed"], result["unexpected"]
    assert result["policy_refused"] > 0 and result["checked"] + result["policy_refused"] == len(
        report["dispatch"]
    )
    forged = [{**t, "candidates": []} for t in report["dispatch"]]  # no refusal on record: held to the pin
    assert not check_pins(manifest, [{**report, "dispatch": forged}])["passed"]
