"""A small store holding one of every stored object kind, for the tamper matrix and the fuzz seeds.

Two versions of ``acme/q:prod`` (a GPTQ checkpoint pushed with a producer witness and small tiles,
so every tensor has several tiles), one artifact of another repository (``acme/other:prod``), and a
signed bring-up evidence statement attached to each manifest. The client has pulled version 2, so
it remembers that version (what a rollback or replay is measured against).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from quantized import gptq_planes, quantize_minmax
from safetensors.numpy import save_file

from shardport.cli import run
from shardport.registry.artifact.manifest import Manifest
from shardport.registry.evidence import store_evidence
from shardport.registry.session import Session
from shardport.registry.tiles.model import TileIndex
from shardport.registry.trust.signatures import SIGNATURE_ARTIFACT, referrers

NAME, TAG = "acme/q", "prod"
OTHER = "acme/other"
REF = f"{NAME}:{TAG}"
PREFIX = "model.layers.0.mlp.down_proj"
WEIGHT = f"{PREFIX}.weight"
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "checkpoint_format": "gptq"}
TILES = ("--tile-min", "256", "--tile-size", "1024")
ROWS = np.array([0, 17, 63], dtype=np.int64)


def cli(store: str, *args: str | Path) -> tuple[int, dict[str, Any]]:
    """``registry --store STORE --json ARGS`` in-process: (exit code, its JSON)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = run(["--store", store, "--json", *map(str, args)])
    return code, json.loads(buf.getvalue())


def ok(store: str, *args: str | Path) -> dict[str, Any]:
    code, out = cli(store, *args)
    assert code == 0, out
    return out


def gptq_checkpoint(folder: Path, seed: int) -> Path:
    """A one-weight GPTQ checkpoint (64 x 128, groups of 32) and its producer witness file."""
    original = np.random.default_rng(seed).standard_normal((64, 128)).astype(np.float32)
    planes = gptq_planes(quantize_minmax(original, 32), PREFIX)
    planes["model.norm.weight"] = np.random.default_rng(seed + 100).standard_normal(64).astype(np.float16)
    folder.mkdir(parents=True)
    save_file({k: np.ascontiguousarray(v) for k, v in planes.items()}, str(folder / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "quantization_config": GPTQ}
    (folder / "config.json").write_text(json.dumps(config))
    save_file(
        {f"{WEIGHT}.rows": ROWS, f"{WEIGHT}.values": original[ROWS]}, str(folder.parent / f"w{seed}.st")
    )
    return folder


@dataclass(frozen=True)
class Digests:
    v1: str
    v2: str
    other: str


def build(root: Path, store: str | None = None) -> Digests:
    """Build the world in ``store`` (default ``root/store``) and ``root/home`` (``$SHARDPORT_HOME`` must
    name the latter)."""
    store = store or str(root / "store")
    ok(store, "keygen")
    src = root / "src"
    digests = []
    for seed, ref in ((1, REF), (2, REF), (3, f"{OTHER}:{TAG}")):
        ckpt = gptq_checkpoint(src / f"c{seed}", seed)
        digests.append(ok(store, "push", ckpt, ref, "--witness", src / f"w{seed}.st", *TILES)["digest"])
    d = Digests(*digests)
    session = Session.open(store)
    for name, digest in ((NAME, d.v1), (NAME, d.v2), (OTHER, d.other)):
        store_evidence(
            session,
            name,
            digest,
            {"created": "2026-12-01T00:00:00Z", "topology": {"tp": 2}, "passed": True, "parity": PARITY},
        )
    ok(store, "pull", REF, root / "seen")  # the client now trusts version 2
    shutil.rmtree(root / "seen")
    return d


#: The evidence's one row: ``registry verify`` recomputes a statement's verdict from its rows (a pass
#: with none is flagged), so the world's statements carry one that measured something.
PARITY = [
    {
        "level": "L4",
        "name": "greedy tokens identical",
        "status": "pass",
        "passed": True,
        "value": 3,
        "measured": 3,
    }
]


@contextlib.contextmanager
def home_at(path: Path) -> Iterator[None]:
    old = os.environ.get("SHARDPORT_HOME")
    os.environ["SHARDPORT_HOME"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SHARDPORT_HOME", None)
        else:
            os.environ["SHARDPORT_HOME"] = old


class World:
    """A copy of the built world: its store, its client home, and readers for its objects."""

    def __init__(self, root: Path, digests: Digests, store: str | None = None) -> None:
        self.root, self.d = root, digests
        self.store = store or str(root / "store")
        self.session = Session.open(self.store)

    def manifest(self, digest: str | None = None) -> Manifest:
        return Manifest.from_bytes(self.session.store.read_blob(digest or self.d.v2))

    def tile_index_digest(self, digest: str | None = None) -> str:
        ref = self.manifest(digest).tile_index
        assert ref is not None
        return ref.digest

    def tile_index(self, digest: str | None = None) -> TileIndex:
        return TileIndex.from_bytes(self.session.store.read_blob(self.tile_index_digest(digest)))

    def file_digest(self, digest: str | None = None) -> str:
        return next(f.digest for f in self.manifest(digest).files if f.path == "model.safetensors")

    def witness_digest(self, digest: str | None = None) -> str:
        ref = self.manifest(digest).producer_witness
        assert ref is not None
        return ref.digest

    def signature(self, name: str = NAME, digest: str | None = None) -> str:
        (sig,) = referrers(self.session, name, digest or self.d.v2, SIGNATURE_ARTIFACT)
        return sig

    def evidence(self, name: str = NAME, digest: str | None = None) -> str:
        from shardport.registry.evidence import EVIDENCE_ARTIFACT

        (blob,) = referrers(self.session, name, digest or self.d.v2, EVIDENCE_ARTIFACT)
        return blob


def copy_world(built: Path, dest: Path, digests: Digests) -> World:
    """A private copy of a built world (store and client home) at ``dest``.

    ``$SHARDPORT_HOME`` must already name ``dest/home``. The client state is keyed by the store's
    folder, so the copied state file is renamed to the copy's key (the copy remembers version 2 too).
    """
    assert os.environ.get("SHARDPORT_HOME") == str(dest / "home")
    shutil.copytree(built / "store", dest / "store", symlinks=True)
    shutil.copytree(built / "home", dest / "home", symlinks=True)
    world = World(dest, digests)
    (state,) = (dest / "home" / "state").glob("*.json")
    state.rename(world.session.state.path)
    return world
