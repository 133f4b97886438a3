"""``registry decode``: the reference decode of one weight, written as float32 safetensors.

Works on a stored reference (only the files holding the weight's planes are fetched, each verified
by its sha256), on a pulled folder (its recorded manifest) or on a plain local checkpoint (gated and
inferred on the spot). The output is written from a contiguous buffer to a temporary file, reopened
and compared, then renamed into place.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from shardport.registry.artifact.manifest import Manifest
from shardport.registry.artifact.manifest_check import check_manifest
from shardport.registry.artifact.refs import Ref
from shardport.registry.checkpoint.analysis import analyze, decode
from shardport.registry.checkpoint.describe import METADATA_DIR, scan
from shardport.registry.errors import DigestMismatchError, UsageError
from shardport.registry.output.writers import write_safetensors
from shardport.registry.session import Session
from shardport.registry.trust.resolve import resolve


@dataclass(frozen=True)
class Decoded:
    """What was decoded and where it was written."""

    weight: str
    tensor: str
    shape: tuple[int, ...]
    out: Path
    family: str

    def to_json(self) -> dict[str, object]:
        """The ``--json`` form."""
        return {
            "weight": self.weight,
            "tensor": self.tensor,
            "shape": list(self.shape),
            "out": str(self.out),
            "family": self.family,
            "dtype": "F32",
        }


def _from_manifest(root: Path, manifest: Manifest, name: str) -> tuple[str, str, npt.NDArray[np.float32]]:
    if not manifest.tensors or not manifest.weights:
        raise UsageError("this artifact records no tensor inventory (not a safetensors/GGUF checkpoint)")
    w, values = decode(root, manifest.tensors, manifest.weights, name)
    return w.name, w.contract.family, values


def decode_local(path: Path, name: str) -> tuple[str, str, npt.NDArray[np.float32]]:
    """Decode from a pulled folder or a plain checkpoint folder/file."""
    meta = path / METADATA_DIR / "manifest.json"
    if path.is_dir() and meta.exists():
        manifest = Manifest.from_bytes(meta.read_bytes(), source=str(meta))
        check_manifest(manifest, source=str(meta))
        return _from_manifest(path, manifest, name)
    root, paths = (path.parent, [path.name]) if path.is_file() else (path, [r for r, _ in scan(path)])
    # decode shows the values, a NaN included: judging them is push's and verify's
    analysis = analyze(root, paths, witnesses=False, allow_nonfinite=True)
    if analysis is None:
        raise UsageError(f"{path}: no safetensors or GGUF files to decode from")
    w, values = decode(root, analysis.tensors, analysis.weights, name)
    return w.name, w.contract.family, values


def decode_ref(
    session: Session, ref: Ref, name: str, workdir: Path
) -> tuple[str, str, npt.NDArray[np.float32]]:
    """Decode from the store: fetch (and verify) only the files that hold the weight's planes."""
    manifest = resolve(session, ref).manifest
    if not manifest.tensors or not manifest.weights:
        raise UsageError(f"{ref}: the manifest records no tensor inventory")
    weight = next(
        (w for w in manifest.weights if w.name == name or any(p.tensor == name for p in w.planes)), None
    )
    if weight is None:
        raise UsageError(f"{ref}: no weight or tensor named {name!r}")
    wanted = {p.tensor for p in weight.planes}
    files = {t.file for t in manifest.tensors if t.name in wanted}
    for entry in manifest.files:
        if entry.path in files:
            target = workdir / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            got, size = session.store.fetch_blob(entry.digest, target, max_size=entry.size)
            if (got, size) != (entry.digest, entry.size):
                raise DigestMismatchError(f"{ref}: file {entry.path}: store returned bytes hashing to {got}")
    return _from_manifest(workdir, manifest, name)


def write_f32(values: npt.NDArray[np.float32], tensor: str, out: Path) -> None:
    """Write ``values`` as ``tensor`` in a safetensors file, verified by reopening before publishing."""
    write_safetensors({tensor: np.asarray(values, dtype=np.float32)}, out)


def run_decode(session: Session | None, target: str, name: str, out: Path) -> Decoded:
    """Decode ``name`` from ``target`` (a local path, or a reference resolved through ``session``)."""
    path = Path(target)
    if path.exists():
        weight, family, values = decode_local(path, name)
    else:
        from shardport.registry.artifact.refs import parse_ref

        if session is None:
            raise UsageError(f"{target}: no such path")
        with tempfile.TemporaryDirectory(prefix="shardport-decode-") as tmp:
            weight, family, values = decode_ref(session, parse_ref(target), name, Path(tmp))
    write_f32(values, name, out)
    return Decoded(weight=weight, tensor=name, shape=tuple(values.shape), out=out, family=family)
