"""Real checkpoints (safetensors, GGUF Q4_1) put into a store with a tile index, for the loader tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import quantize
from hypothesis import strategies as st
from safetensors.numpy import save_file

from shardport.loader import PlaneSlice, ReadOptions, SliceRead, read_slices
from shardport.registry.artifact.hashing import digest_file
from shardport.registry.artifact.manifest import FileEntry, TensorEntry
from shardport.registry.formats import parse_gguf, parse_safetensors
from shardport.registry.store.keys import blob_key
from shardport.registry.store.protocol import Store
from shardport.registry.tiles.build import CheckpointReader, build_tile_index
from shardport.registry.tiles.grid import plane_layout
from shardport.registry.tiles.layout import LAYOUT, to_tiled
from shardport.registry.tiles.model import TensorTiles, TileIndex


@dataclass
class Artifact:
    """One checkpoint file in a store, its manifest entries and its tile index."""

    path: Path
    entries: list[TensorEntry]
    files: list[FileEntry]
    index: TileIndex
    store: Store
    raw: bytes

    @property
    def file(self) -> str:
        return self.files[0].path

    @property
    def blob(self) -> str:
        return blob_key(self.files[0].digest)

    def entry(self, name: str) -> TensorEntry:
        return next(e for e in self.entries if e.name == name)

    def matrix(self, name: str) -> np.ndarray:
        """The tensor's bytes as the tile index's rows x row_bytes matrix."""
        t = self.index.tensors[name]
        return np.frombuffer(self.raw, np.uint8, t.nbytes, t.start).reshape(t.rows, t.row_bytes)

    def expected(self, s: PlaneSlice) -> np.ndarray:
        return self.matrix(s.tensor)[s.row0 : s.row1, s.col0 : s.col1]

    def flip(self, offset: int) -> None:
        """Flip one byte of the stored blob (not of the source file)."""
        data = bytearray(self.store.read(self.blob))
        data[offset] ^= 0xFF
        self.store.put(self.blob, bytes(data))


def safetensors_entries(path: Path) -> list[TensorEntry]:
    header = parse_safetensors(path)
    return [
        TensorEntry(
            name=r.name, file=path.name, start=r.start, end=r.end, dtype=r.dtype, shape=tuple(r.shape)
        )
        for r in header.tensors
    ]


def gguf_entries(path: Path) -> list[TensorEntry]:
    header = parse_gguf(path)
    return [
        TensorEntry(
            name=t.name, file=path.name, start=t.start, end=t.end, dtype=t.ggml_type, shape=tuple(t.shape)
        )
        for t in header.tensors
    ]


def llama_arrays(
    hidden: int = 512, kv: int = 128, inter: int = 1024, vocab: int = 1000, seed: int = 0
) -> dict:
    rng = np.random.default_rng(seed)

    def f16(*shape: int) -> np.ndarray:
        return np.ascontiguousarray(rng.standard_normal(shape).astype(np.float16))

    return {
        "model.embed_tokens.weight": f16(vocab, hidden),
        "model.layers.0.self_attn.q_proj.weight": f16(hidden, hidden),
        "model.layers.0.self_attn.k_proj.weight": f16(kv, hidden),
        "model.layers.0.self_attn.o_proj.weight": f16(hidden, hidden),
        "model.layers.0.mlp.down_proj.weight": f16(hidden, inter),
        "model.layers.0.mlp.up_proj.weight": f16(inter, hidden),
        "model.layers.0.input_layernorm.weight": np.ones(hidden, dtype=np.float32),
        "model.layers.0.mlp.gate_proj.g_idx": np.arange(hidden, dtype=np.int32),
    }


def write_safetensors(root: Path, **shape: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "model.safetensors"
    arrays = llama_arrays(**shape)
    save_file(arrays, str(path))
    return path


def write_gguf(root: Path, hidden: int = 1024, inter: int = 2048, seed: int = 1) -> Path:
    """A llama-shaped GGUF with Q4_1 weights (ggml rows of ``hidden`` elements) and an F32 norm."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "model.gguf"
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, "llama")
    for name, (rows, cols) in {
        "blk.0.attn_q.weight": (hidden, hidden),
        "blk.0.attn_k.weight": (hidden // 4, hidden),
        "blk.0.ffn_down.weight": (hidden, inter),
        "blk.0.ffn_up.weight": (inter, hidden),
    }.items():
        data = quantize(rng.standard_normal((rows, cols)).astype(np.float32), GGMLQuantizationType.Q4_1)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=GGMLQuantizationType.Q4_1)
    writer.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(hidden).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def publish(path: Path, store_url: str, *, target: int = 32 << 10, minimum: int = 4 << 10) -> Artifact:
    """Put ``path`` into the store as a blob and build its tile index."""
    entries = gguf_entries(path) if path.suffix == ".gguf" else safetensors_entries(path)
    digest, size = digest_file(path)
    store = Store(store_url)
    store.upload_blob(path, digest)
    with CheckpointReader(path.parent) as read:
        index = build_tile_index(entries, read, target=target, minimum=minimum)
    files = [FileEntry(path=path.name, size=size, digest=digest)]
    return Artifact(path, entries, files, index, store, path.read_bytes())


def splits(n: int, tp: int, unit: int = 1) -> list[tuple[int, int]]:
    """``tp`` equal parts of ``n`` (a multiple of ``tp * unit``)."""
    step = n // tp
    assert step * tp == n and step % unit == 0, (n, tp, unit)
    return [(k * step, (k + 1) * step) for k in range(tp)]


def rank_slices(art: Artifact, tp: int, rank: int, axis: str) -> list[PlaneSlice]:
    """Every tensor (by name) split ``tp`` ways along ``axis`` (whole quanta); 0-/1-D tensors whole."""
    out = []
    for e in sorted(art.entries, key=lambda e: e.name):
        t = art.index.tensors[e.name]
        if len(e.shape) < 2:
            out.append(PlaneSlice(e.name, 0, t.rows, 0, t.row_bytes))
        elif axis == "row":
            a, b = splits(t.rows, tp)[rank]
            out.append(PlaneSlice(e.name, a, b, 0, t.row_bytes))
        else:
            q = plane_layout(e).quantum
            a, b = splits(t.row_bytes // q, tp)[rank]
            out.append(PlaneSlice(e.name, 0, t.rows, a * q, b * q))
    return out


def load(art: Artifact, slices: list[PlaneSlice], **options: int | float | bool) -> SliceRead:
    """:func:`read_slices` of ``slices`` from ``art`` with ``ReadOptions(**options)``."""
    return read_slices(
        slices,
        tensors=art.entries,
        files=art.files,
        index=art.index,
        store=art.store,
        options=ReadOptions(**options),  # type: ignore[arg-type]
    )


TILED_FILE = "model.tiled.bin"
HEADER = 1000 + 7
"""Bytes before the first tensor of the tiled copy (so every tensor moves, to unaligned offsets)."""


def tiled_copy(art: Artifact, root: Path, store_url: str) -> Artifact:
    """``art``'s tensors in the tiled layout, in reverse order, in a new file put into ``store_url``."""
    root.mkdir(parents=True, exist_ok=True)
    out = bytearray(b"\x5a" * HEADER)
    entries: list[TensorEntry] = []
    tensors: dict[str, TensorTiles] = {}
    for e in sorted(art.entries, key=lambda e: e.start, reverse=True):
        t = art.index.tensors[e.name]
        region = to_tiled(art.matrix(e.name).reshape(-1), t.rows, t.row_bytes, t.row_block, t.col_block)
        start = len(out)
        out += region.tobytes() + b"\xa5" * 9
        update = {"file": TILED_FILE, "start": start, "end": start + t.nbytes}
        entries.append(
            TensorEntry.model_validate(
                {
                    **e.model_dump(),
                    **update,
                    "layout": LAYOUT,
                    "tile_rows": t.row_block,
                    "tile_cols": t.col_block,
                }
            )
        )
        tensors[e.name] = TensorTiles.model_validate(
            {**t.model_dump(), "file": TILED_FILE, "start": start, "layout": "tiled"}
        )
    path = root / TILED_FILE
    path.write_bytes(bytes(out))
    digest, size = digest_file(path)
    store = Store(store_url)
    store.upload_blob(path, digest)
    index = TileIndex(tile_target=art.index.tile_target, tile_minimum=art.index.tile_minimum, tensors=tensors)
    index = TileIndex.from_bytes(index.to_bytes())  # what a reader gets from the blob
    files = [FileEntry(path=TILED_FILE, size=size, digest=digest)]
    return Artifact(path, entries, files, index, store, bytes(out))


def rectangles(data: st.DataObject, art: Artifact) -> list[PlaneSlice]:
    """1-4 random rectangles (possibly empty, possibly overlapping) of ``art``'s tensors."""
    names = sorted(art.index.tensors)
    slices = []
    for _ in range(data.draw(st.integers(1, 4))):
        name = data.draw(st.sampled_from(names))
        t = art.index.tensors[name]
        r0 = data.draw(st.integers(0, t.rows))
        r1 = data.draw(st.integers(r0, t.rows))
        c0 = data.draw(st.integers(0, t.row_bytes))
        c1 = data.draw(st.integers(c0, t.row_bytes))
        slices.append(PlaneSlice(name, r0, r1, c0, c1))
    return slices
