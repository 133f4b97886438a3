"""Analyze a checkpoint's containers: bounded gates, tensor inventory, contracts, values, witnesses.

Used by push (to fill the manifest's ``tensors`` and ``weights``), by ``verify PATH`` and by pull
(to re-check witnesses on the bytes it wrote). Plane bytes are read through ``np.memmap``: one
weight's planes at a time, never a whole checkpoint in memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardport.registry.artifact.gguf_header import header_digest
from shardport.registry.artifact.manifest import GgufHeaderDigest, TensorEntry, WitnessFileRef
from shardport.registry.artifact.witness_file import ProducerWitness, check_producer, producer_blob
from shardport.registry.checkpoint.describe import read_json_object
from shardport.registry.contracts import (
    DeclareSpec,
    FloatContract,
    GgufBlockContract,
    LogicalWeight,
    TensorInfo,
    check_witness,
    infer_gguf,
    infer_safetensors,
    make_witness,
    run_gates,
)
from shardport.registry.contracts.architecture import check_architecture
from shardport.registry.contracts.decode import decode_weight
from shardport.registry.contracts.errors import TiedAliasError
from shardport.registry.contracts.formats import scale_to_f32
from shardport.registry.contracts.model import QuantError
from shardport.registry.contracts.quant_error import measure_quant_error
from shardport.registry.errors import UsageError
from shardport.registry.families.llama import (
    CONFIG_KEYS,
    EMBED_SLOT,
    GGUF_ARCHITECTURE_KEY,
    HEAD_SLOT,
    gguf_head_tied,
    gguf_key,
)
from shardport.registry.formats import parse_gguf, parse_safetensors, validate_sharded_checkpoint
from shardport.registry.formats.elements import ELEMENTS
from shardport.registry.formats.errors import NonFiniteValueError
from shardport.registry.formats.finite import StoredFloat, check_finite
from shardport.registry.formats.notes import Note, Notes
from shardport.registry.tiles.grid import plane_layout
from shardport.registry.tiles.layout import LAYOUT, from_tiled

INDEX_FILE = "model.safetensors.index.json"
#: numpy dtypes of the safetensors element types (BF16 and the 8-bit floats as their raw bits).
NUMPY_DTYPES = {e.name: e.numpy for e in ELEMENTS.values() if e.safetensors and e.numpy is not None}


def witness_seed(name: str) -> int:
    """The recorded seed of a weight's witness rows (deterministic, below 2**53)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:6], "big")


@dataclass(frozen=True)
class Analysis:
    """What the containers of a checkpoint hold.

    ``notes``: what the gates found in fields no consumer reads (:mod:`shardport.registry.formats.notes`;
    recorded in the manifest). ``remarks``: what was checked, for people (not recorded).
    ``gguf_headers``: each GGUF file's header digest, by path (recorded on its file entry).
    ``gguf_meta``: the GGUF files' key/value pairs (long arrays as their type and length only).
    ``gguf_versions``: each GGUF file's header version, by path. ``quant_errors``: with ``--reference``,
    each referenced weight's distance from its float weight, by name
    (:mod:`shardport.registry.contracts.quant_error`).
    """

    kind: str
    tensors: tuple[TensorEntry, ...]
    weights: tuple[LogicalWeight, ...]
    notes: tuple[Note, ...] = ()
    remarks: tuple[str, ...] = ()
    architecture: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    gguf_headers: Mapping[str, GgufHeaderDigest] = field(default_factory=dict)
    gguf_meta: Mapping[str, Any] = field(default_factory=dict)
    gguf_versions: Mapping[str, int] = field(default_factory=dict)
    quant_errors: Mapping[str, QuantError] = field(default_factory=dict)


@dataclass
class PlaneReader:
    """Raw bytes of stored tensors, memory-mapped from files under ``root``."""

    root: Path
    _maps: dict[str, np.memmap[Any, np.dtype[np.uint8]]] = field(default_factory=dict)

    def raw(self, entry: TensorEntry) -> npt.NDArray[np.uint8]:
        """The tensor's row-major bytes (a view into the file; a de-tiled copy for tiled layouts)."""
        mm = self._maps.get(entry.file)
        if mm is None:
            mm = np.memmap(self.root / entry.file, dtype=np.uint8, mode="r")
            self._maps[entry.file] = mm
        region = np.asarray(mm[entry.start : entry.end])
        if entry.layout == "row_major":
            return region
        if entry.layout != LAYOUT or not entry.tile_rows or not entry.tile_cols:
            raise UsageError(f"tensor {entry.name} in {entry.file}: unknown layout {entry.layout!r}")
        shape = plane_layout(entry)
        return from_tiled(region, shape.rows, shape.row_bytes, entry.tile_rows, entry.tile_cols)

    def typed(self, entry: TensorEntry) -> npt.NDArray[Any]:
        """The tensor as a typed array (safetensors dtypes; BF16 as uint16)."""
        dt = NUMPY_DTYPES.get(entry.dtype)
        if dt is None:
            raise UsageError(
                f"tensor {entry.name} in {entry.file}: dtype {entry.dtype} cannot be read as numbers"
            )
        return self.raw(entry).view(dt).reshape(entry.shape)

    def planes(
        self, weight: LogicalWeight, by_name: Mapping[str, TensorEntry]
    ) -> dict[str, npt.NDArray[Any]]:
        """The weight's planes (missing ones are left out: the gates report a dropped plane)."""
        out: dict[str, npt.NDArray[Any]] = {}
        for plane in weight.planes:
            entry = by_name.get(plane.tensor)
            if entry is not None:
                out[plane.tensor] = self.raw(entry) if entry.dtype not in NUMPY_DTYPES else self.typed(entry)
        return out


def _as_f32(array: npt.NDArray[Any], dtype: str) -> npt.NDArray[np.float32]:
    fmt = ELEMENTS[dtype].float_format if dtype in ELEMENTS else None
    if fmt is not None and fmt != "binary64":
        return scale_to_f32(array, fmt, dtype)
    return array.astype(np.float32)


def _architecture(
    root: Path, gguf_meta: Mapping[str, Any], gguf_tensors: Iterable[str] = ()
) -> tuple[str | None, dict[str, Any]]:
    """The architecture and the parameters the inventory rule needs, from config.json or GGUF keys.

    GGUF has no tie key: a file without ``output.weight`` ties the head to ``token_embd`` (as llama.cpp
    reads it, and as the graph contract records it).
    """
    config = read_json_object(root / "config.json")
    if config is not None:
        archs = config.get("architectures") or [config.get("model_type")]
        return (str(archs[0]) if archs and archs[0] else None), config
    arch = gguf_meta.get(GGUF_ARCHITECTURE_KEY)
    if not isinstance(arch, str):
        return None, {}
    params: dict[str, Any] = {}
    if gguf_key(arch, "layers") in gguf_meta:
        params[CONFIG_KEYS["layers"]] = gguf_meta[gguf_key(arch, "layers")]
    params[CONFIG_KEYS["experts"]] = gguf_meta.get(gguf_key(arch, "experts")) or 0
    params[CONFIG_KEYS["tied_embeddings"]] = gguf_head_tied(gguf_tensors)
    return arch, params


def _gguf_params(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The architecture's scalar hyper-parameters from GGUF keys (``llama.block_count``…)."""
    arch = meta.get(GGUF_ARCHITECTURE_KEY)
    if not isinstance(arch, str):
        return {}
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if not key.startswith(f"{arch}.") or not isinstance(value, (int, float, str, bool)):
            continue
        if isinstance(value, float) and not np.isfinite(value):
            continue
        out[key] = value
    return out


def _check_tied(
    weights: Iterable[LogicalWeight],
    by_name: Mapping[str, TensorEntry],
    reader: PlaneReader,
    params: Mapping[str, Any],
) -> None:
    """Weights declared tied must hold identical bytes when both are stored."""
    if not params.get(CONFIG_KEYS["tied_embeddings"]):
        return
    slots = {w.binding.slot: w for w in weights if w.binding.layer is None}
    embed, head = slots.get(EMBED_SLOT), slots.get(HEAD_SLOT)
    if embed is None or head is None:
        return
    a, b = (by_name.get(w.planes[0].tensor) for w in (embed, head))
    if a is None or b is None:
        return
    if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(reader.raw(a), reader.raw(b)):
        raise TiedAliasError(
            head.name,
            "tied_alias",
            f"the bytes of {embed.name} ({CONFIG_KEYS['tied_embeddings']}: true)",
            "different bytes",
            "untie them in config.json, or store the head once",
        )


def _entries_with_roles(
    entries: Iterable[TensorEntry], weights: Iterable[LogicalWeight]
) -> tuple[TensorEntry, ...]:
    owner = {p.tensor: (w.name, p.role) for w in weights for p in w.planes}
    return tuple(
        e.model_copy(update={"weight": owner[e.name][0], "role": owner[e.name][1]}) if e.name in owner else e
        for e in entries
    )


def _reference_rows(reference: Path | None) -> dict[str, tuple[Path, TensorEntry]]:
    if reference is None:
        return {}
    files = [reference] if reference.is_file() else sorted(reference.rglob("*.safetensors"))
    if not files:
        raise UsageError(f"--reference {reference}: no .safetensors files (a float checkpoint is expected)")
    out = {}
    for f in files:
        header = parse_safetensors(f)
        for r in header.tensors:
            out[r.name] = (
                f.parent,
                TensorEntry(
                    name=r.name, file=f.name, start=r.start, end=r.end, dtype=r.dtype, shape=tuple(r.shape)
                ),
            )
    return out


def analyze(
    root: Path,
    paths: list[str],
    *,
    declare: str | Mapping[str, Any] | DeclareSpec | None = None,
    reference: Path | None = None,
    witnesses: bool = True,
    strict: bool = False,
    allow_nonfinite: bool = False,
) -> Analysis | None:
    """Gate every container under ``root`` (``paths`` relative), infer contracts, check values.

    Returns None when the checkpoint has no safetensors or GGUF files. Raises the named container,
    contract and usage errors. A check of a field no consumer reads becomes a note
    (:attr:`Analysis.notes`), or, with ``strict``, raises its error. A float tensor holding NaN or inf
    is refused (:mod:`shardport.registry.formats.finite`); with ``allow_nonfinite`` it becomes a note
    (even under ``strict``), unless it is a plane of a quantized weight.
    """
    st_files = sorted(p for p in paths if p.endswith(".safetensors"))
    gguf_files = sorted(p for p in paths if p.endswith(".gguf"))
    if not st_files and not gguf_files:
        return None
    notes = Notes(strict=strict, root=root)
    if INDEX_FILE in paths:
        validate_sharded_checkpoint(root / INDEX_FILE, notes=notes)
    reader = PlaneReader(root)
    entries = _safetensors_entries(root, st_files, notes)
    weights = _safetensors_weights(root, entries, reader, declare) if st_files else []
    g_entries, g_weights, gguf_meta, headers, versions = _gguf_inventory(root, gguf_files, notes, declare)
    entries += g_entries
    weights += g_weights
    by_name = {e.name: e for e in entries}
    architecture, params = _architecture(root, gguf_meta, (e.name for e in g_entries))
    remarks = check_architecture(architecture, params, weights, notes=notes)
    _check_tied(weights, by_name, reader, params)
    quant_errors: dict[str, QuantError] = {}
    refs = _reference_rows(reference)
    checked = _checked_weights(weights, reader, by_name, refs, witnesses=witnesses, measured=quant_errors)
    _check_finite(root, entries, checked, notes, allow=allow_nonfinite)
    gguf_only = bool(gguf_files) and not st_files
    return Analysis(
        kind="gguf" if gguf_only else "safetensors",
        tensors=_entries_with_roles(entries, checked),
        weights=tuple(checked),
        notes=notes.items,
        remarks=remarks,
        architecture=architecture,
        params=_gguf_params(gguf_meta) if gguf_only else {},
        gguf_headers=headers,
        gguf_meta=gguf_meta,
        gguf_versions=versions,
        quant_errors=quant_errors,
    )


def _check_finite(
    root: Path, entries: Iterable[TensorEntry], weights: Iterable[LogicalWeight], notes: Notes, *, allow: bool
) -> None:
    """Every stored float tensor finite: refused, or noted with ``allow`` (a quantized plane: refused)."""
    # the float planes beside a quantized weight's codes (a GGUF tensor is its own plane)
    quantized = {
        p.tensor
        for w in weights
        if not isinstance(w.contract, FloatContract | GgufBlockContract)
        for p in w.planes
    }

    def report(error: NonFiniteValueError, fatal: bool) -> None:
        if fatal or not allow:
            raise error
        notes.keep(error)

    check_finite(
        root,
        (StoredFloat(e.file, e.name, e.start, e.end, e.dtype) for e in entries if e.layout == "row_major"),
        report=report,
        fatal=quantized.__contains__,
    )


def _safetensors_entries(root: Path, files: list[str], notes: Notes) -> list[TensorEntry]:
    """Every tensor of the safetensors ``files`` (gated), refusing a name stored in two files."""
    entries: list[TensorEntry] = []
    seen: dict[str, str] = {}
    for rel in files:
        header = parse_safetensors(root / rel, notes=notes)
        for r in header.tensors:
            if r.name in seen:
                raise UsageError(f"tensor {r.name} is stored twice: in {seen[r.name]} and in {rel}")
            seen[r.name] = rel
            entries.append(
                TensorEntry(
                    name=r.name, file=rel, start=r.start, end=r.end, dtype=r.dtype, shape=tuple(r.shape)
                )
            )
    return entries


def _safetensors_weights(
    root: Path,
    entries: list[TensorEntry],
    reader: PlaneReader,
    declare: str | Mapping[str, Any] | DeclareSpec | None,
) -> list[LogicalWeight]:
    """The logical weights inferred from the safetensors tensors, the config and the quantize config."""
    shape_values = {
        e.name: [int(v) for v in reader.typed(e).reshape(-1)]
        for e in entries
        if e.name.endswith("weight_shape") and e.dtype in ("I32", "I64")
    }
    return list(
        infer_safetensors(
            read_json_object(root / "config.json") or {},
            [TensorInfo(e.name, e.dtype, e.shape) for e in entries],
            quantize_config=read_json_object(root / "quantize_config.json")
            or read_json_object(root / "quant_config.json"),
            declare=declare,
            shape_values=shape_values,
        )
    )


def _gguf_inventory(
    root: Path, files: list[str], notes: Notes, declare: str | Mapping[str, Any] | DeclareSpec | None
) -> tuple[
    list[TensorEntry], list[LogicalWeight], dict[str, Any], dict[str, GgufHeaderDigest], dict[str, int]
]:
    """The GGUF ``files``' tensors (gated), logical weights, merged key-values, header digests, versions."""
    entries: list[TensorEntry] = []
    weights: list[LogicalWeight] = []
    meta: dict[str, Any] = {}
    headers: dict[str, GgufHeaderDigest] = {}
    versions: dict[str, int] = {}
    for rel in files:
        gheader = parse_gguf(root / rel, notes=notes)
        headers[rel] = header_digest(root / rel, gheader)
        versions[rel] = gheader.version
        meta.update(gheader.kv)
        g_entries = [
            TensorEntry(
                name=t.name, file=rel, start=t.start, end=t.end, dtype=t.ggml_type, shape=tuple(t.shape)
            )
            for t in gheader.tensors
        ]
        weights += infer_gguf(
            dict(gheader.kv), [TensorInfo(e.name, e.dtype, e.shape) for e in g_entries], declare=declare
        )
        entries += g_entries
    return entries, weights, meta, headers, versions


def _checked_weights(
    weights: list[LogicalWeight],
    reader: PlaneReader,
    by_name: dict[str, TensorEntry],
    refs: dict[str, tuple[Path, TensorEntry]],
    *,
    witnesses: bool,
    measured: dict[str, QuantError],
) -> list[LogicalWeight]:
    """Every weight through its semantic gates, with witness rows where wanted.

    With ``witnesses``, quantized (or referenced) weights get witness rows, decoded against the
    ``--reference`` rows where given; their measured errors go into ``measured``.
    """
    inventory = stored_inventory(by_name.values())
    checked: list[LogicalWeight] = []
    for w in weights:
        planes = reader.planes(w, by_name)
        run_gates(w, planes, inventory)
        quantized = not isinstance(w.contract, FloatContract)
        if witnesses and (quantized or w.name in refs):
            ref = None
            if refs:
                if w.name not in refs:
                    raise UsageError(f"--reference: no tensor {w.name} in the reference checkpoint")
                folder, entry = refs[w.name]
                ref = _as_f32(PlaneReader(folder).typed(entry), entry.dtype).reshape(w.shape.extents)
            seed = witness_seed(w.name)
            witness = make_witness(w, planes, seed)
            if ref is not None:
                sums, measured[w.name] = measure_quant_error(w, planes, ref, seed=seed)
                witness = witness.model_copy(update={"rel_error": sums.rel_frobenius})
            w = w.model_copy(update={"witness": witness})
        checked.append(w)
    return checked


def check_stored(
    root: Path,
    tensors: Iterable[TensorEntry],
    weights: Iterable[LogicalWeight],
    *,
    producer: ProducerWitness | None,
) -> int:
    """Re-run the semantic gates, every witness and the producer's witness against bytes on disk.

    ``producer``: the manifest's ``push --witness`` rows
    (:func:`~shardport.registry.artifact.witness_file.load_producer`), or None. Returns the weights checked.
    """
    by_name = {e.name: e for e in tensors}
    inventory = stored_inventory(by_name.values())
    reader = PlaneReader(root)
    n = 0
    listed = list(weights)
    for w in listed:
        check_weight(w, reader.planes(w, by_name), inventory)
        n += 1
    if producer is not None:
        check_producer(producer, listed, lambda w: reader.planes(w, by_name), stored=True)
    return n


def stored_inventory(tensors: Iterable[TensorEntry]) -> dict[str, TensorInfo]:
    """What the semantic gates know of stored tensors: name, dtype, shape."""
    return {e.name: TensorInfo(e.name, e.dtype, e.shape) for e in tensors}


def check_weight(
    weight: LogicalWeight, planes: dict[str, npt.NDArray[Any]], inventory: Mapping[str, TensorInfo]
) -> None:
    """Run the semantic gates and the witness (if recorded) of one weight against its stored planes."""
    run_gates(weight, planes, inventory)
    if weight.witness is not None:
        check_witness(weight, planes)


def decode(
    root: Path, tensors: Iterable[TensorEntry], weights: Iterable[LogicalWeight], name: str
) -> tuple[LogicalWeight, npt.NDArray[np.float32]]:
    """The reference decode (float32, logical shape) of weight ``name``.

    ``name`` may also be one of the weight's planes (e.g. a GPTQ ``qweight``).
    """
    by_name = {e.name: e for e in tensors}
    for w in weights:
        if w.name == name or any(p.tensor == name for p in w.planes):
            return w, decode_weight(w, PlaneReader(root).planes(w, by_name))
    raise UsageError(f"no weight or tensor named {name!r} in this checkpoint")


def producer_witness(root: Path, analysis: Analysis, path: Path) -> tuple[bytes, WitnessFileRef]:
    """``push --witness FILE``: the file checked against the decode of ``root``'s bytes, as a blob and ref."""
    reader = PlaneReader(root)
    by_name = {e.name: e for e in analysis.tensors}
    return producer_blob(path, analysis.weights, lambda w: reader.planes(w, by_name))
