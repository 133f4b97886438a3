"""The topology layer push records lists exactly the degrees bring-up's plan-time checks accept, and
:func:`check_degrees` refuses any other before a rank starts, naming the valid ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from bringup_artifacts import gguf_tiny
from support import Cli

from shardport.deploy.errors import GraphLayoutError
from shardport.deploy.topology_check import TP_CANDIDATES, check_degrees, placeable_degrees
from shardport.deploy.up import UpRequest, check_plan
from shardport.registry.artifact.manifest import Manifest
from shardport.registry.artifact.refs import parse_ref
from shardport.registry.store.protocol import Store
from shardport.registry.trust.resolve import Resolved


@pytest.fixture
def manifest(capsys: pytest.CaptureFixture[str], tmp_path: Path, home: Path) -> Manifest:
    cli = Cli(capsys, str(tmp_path / "store"))
    cli.ok("keygen")
    out = cli.ok("push", gguf_tiny(tmp_path / "g"), "g:v1")
    return Manifest.from_bytes(Store(cli.store).read_blob(out["digest"]))


def _plan_accepts(manifest: Manifest, tp: int = 1, pp: int = 1) -> bool:
    resolved = Resolved(parse_ref("g:v1"), manifest.digest(), manifest, b"", None, ())
    try:
        check_plan(resolved, UpRequest(ref="g:v1", tokens=(1, 2), tp=tp, pp=pp))
    except Exception:  # any refusal is a degree bring-up does not take
        return False
    return True


def test_the_recorded_degrees_are_those_the_driver_accepts(manifest: Manifest) -> None:
    assert manifest.topology is not None
    assert manifest.topology == placeable_degrees(manifest)
    assert manifest.topology.tp == [tp for tp in TP_CANDIDATES if _plan_accepts(manifest, tp=tp)]
    assert manifest.topology.pp == [pp for pp in range(1, 4) if _plan_accepts(manifest, pp=pp)]


def test_a_degree_outside_the_layer_is_refused_naming_the_valid_ones(manifest: Manifest) -> None:
    check_degrees(manifest, tp=3, ep=1, pp=2)
    with pytest.raises(
        GraphLayoutError, match=r"--tp 4: the artifact can be placed at tp in \[1, 2, 3\]"
    ) as exc:
        check_degrees(manifest, tp=4, ep=1, pp=1)
    assert exc.value.exit_code == 5
    with pytest.raises(GraphLayoutError, match=r"--ep 2: .* ep in \[1\]; --pp 3: .* pp in \[1, 2\]"):
        check_degrees(manifest, tp=1, ep=2, pp=3)


def test_a_manifest_without_the_layer_is_left_to_the_plan_checks(manifest: Manifest) -> None:
    check_degrees(manifest.model_copy(update={"topology": None}), tp=4, ep=1, pp=1)


def test_a_degree_push_did_not_try_is_left_to_the_plan_checks(manifest: Manifest) -> None:
    assert 5 not in TP_CANDIDATES
    check_degrees(manifest, tp=5, ep=1, pp=1)  # not refused here: the world bounds and plan decide


def test_registry_up_refuses_an_unlisted_degree_before_anything_starts(home: Path, tmp_path: Path) -> None:
    from llama_artifacts import ok

    from shardport.deploy.up import admit
    from shardport.registry.session import Session

    store = str(tmp_path / "store")
    ok(store, "keygen")
    ok(store, "push", gguf_tiny(tmp_path / "gguf"), "llama/gguf:v1")
    session = Session.open(store)
    with pytest.raises(GraphLayoutError, match=r"the artifact can be placed at tp in \["):
        admit(session, UpRequest(ref="llama/gguf:v1", tokens=(1, 2), tp=6, store=store))


def test_layers_another_shardport_version_computed_are_not_held_against_a_request(manifest: Manifest) -> None:
    from shardport.deploy.runnable import pinned_here

    assert pinned_here(manifest)
    older = manifest.model_copy(
        update={"runtime": manifest.runtime.model_copy(update={"tested_version": "0.0.1"})}
    )
    assert not pinned_here(older)
    check_degrees(older, tp=4, ep=1, pp=1)  # the plan-time checks decide instead
    fewer = manifest.model_copy(
        update={"runtime": manifest.runtime.model_copy(update={"catalogue": manifest.runtime.catalogue[:-1]})}
    )
    check_degrees(fewer, tp=4, ep=1, pp=1)
