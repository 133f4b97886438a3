"""Internal consistency of a manifest: pure, run wherever a manifest is accepted.

A signature says who wrote a manifest, not that it makes sense. :func:`check_manifest` runs at push
(before anything is uploaded), at every resolve (pull, rank pulls, inspect, tag, rollback, verify REF)
and on a pulled folder's manifest (verify DIR). It checks:

- every file path against the one set of path rules (:mod:`shardport.registry.artifact.paths`); a file's
  ``gguf_header`` digest range lies inside that file, which is a ``.gguf`` file;
- every tensor names a file listed in ``files`` exactly (not a case or Unicode-form variant), once, with
  a non-negative shape, a known layout (``row_major``, or ``shardport-tiled`` with its tile size) and a
  byte range ``start <= end <= size`` of that file whose length is what its dtype and shape need;
- every weight is named once and each of its planes names a listed tensor, with that tensor's dtype and
  shape; a tensor that names its weight names a listed one.

Digest forms are checked by the model itself (:data:`shardport.registry.artifact.digests.Digest`).
"""

from __future__ import annotations

from typing import NoReturn

from shardport.registry.artifact.manifest import Manifest, TensorEntry
from shardport.registry.artifact.paths import check_paths, fold
from shardport.registry.errors import ManifestInconsistentError
from shardport.registry.tiles.errors import TileGridError
from shardport.registry.tiles.layout import LAYOUT


def _fail(source: str, field: str, value: object, why: str) -> NoReturn:
    raise ManifestInconsistentError(f"{source}: field {field!r} = {value!r}: {why}")


def _variant(name: str, listed: dict[str, int]) -> str:
    """A hint when ``name`` is a case or Unicode-form variant of a listed file."""
    folded = fold(name)
    for path in listed:
        if fold(path) == folded:
            return f" (files lists {path!r}, which differs only in case or Unicode form)"
    return ""


def _check_tensor(t: TensorEntry, field: str, sizes: dict[str, int], source: str) -> None:
    if t.file not in sizes:
        why = f"tensor {t.name!r} lies in a file 'files' does not list{_variant(t.file, sizes)}"
        _fail(source, f"{field}.file", t.file, why)
    if any(d < 0 for d in t.shape):
        _fail(source, f"{field}.shape", list(t.shape), f"tensor {t.name!r} has a negative dimension")
    size = sizes[t.file]
    if t.end < t.start or t.end > size:
        why = f"tensor {t.name!r}: range [{t.start}, {t.end}) is not inside {t.file!r} ({size} bytes)"
        _fail(source, f"{field}.end", t.end, why)
    if t.layout not in ("row_major", LAYOUT):
        _fail(source, f"{field}.layout", t.layout, f"tensor {t.name!r}: expected 'row_major' or {LAYOUT!r}")
    if t.layout == LAYOUT and not (t.tile_rows and t.tile_cols and t.tile_rows > 0 and t.tile_cols > 0):
        why = f"tensor {t.name!r}: the {LAYOUT} layout needs positive tile_rows and tile_cols"
        _fail(source, f"{field}.tile_rows", (t.tile_rows, t.tile_cols), why)
    from shardport.registry.tiles.grid import plane_layout  # lazily: it loads the container formats

    try:
        plane_layout(t)
    except TileGridError as exc:
        _fail(source, f"{field}.dtype", t.dtype, str(exc))


def check_manifest(manifest: Manifest, *, source: str) -> None:
    """Raise :class:`ManifestInconsistentError` (or ``UnsafePathError`` for a path) unless consistent.

    ``source`` names the manifest in messages (e.g. ``manifest sha256:…``).
    """
    check_paths([f.path for f in manifest.files], source=source)
    sizes = {f.path: f.size for f in manifest.files}
    for i, f in enumerate(manifest.files):
        if f.gguf_header is not None and (f.gguf_header.end > f.size or not f.path.endswith(".gguf")):
            why = f"the header digest of {f.path!r} must cover bytes of a .gguf file of {f.size} bytes"
            _fail(source, f"files.{i}.gguf_header.end", f.gguf_header.end, why)
    tensors: dict[str, TensorEntry] = {}
    for i, t in enumerate(manifest.tensors or ()):
        if t.name in tensors:
            _fail(source, f"tensors.{i}.name", t.name, "tensor listed twice")
        _check_tensor(t, f"tensors.{i}", sizes, source)
        tensors[t.name] = t
    weights: set[str] = set()
    for i, w in enumerate(manifest.weights or ()):
        if w.name in weights:
            _fail(source, f"weights.{i}.name", w.name, "weight listed twice")
        weights.add(w.name)
        for j, plane in enumerate(w.planes):
            entry = tensors.get(plane.tensor)
            if entry is None:
                _fail(
                    source,
                    f"weights.{i}.planes.{j}.tensor",
                    plane.tensor,
                    f"weight {w.name!r} binds a tensor the tensor table does not list",
                )
            if (plane.dtype, tuple(plane.shape)) != (entry.dtype, tuple(entry.shape)):
                _fail(
                    source,
                    f"weights.{i}.planes.{j}",
                    f"{plane.dtype}{list(plane.shape)}",
                    f"weight {w.name!r}: tensor {plane.tensor!r} is {entry.dtype}{list(entry.shape)} "
                    "in the tensor table",
                )
    for i, t in enumerate(manifest.tensors or ()):
        if t.weight is not None and manifest.weights is not None and t.weight not in weights:
            why = f"tensor {t.name!r} names a weight 'weights' does not list"
            _fail(source, f"tensors.{i}.weight", t.weight, why)
