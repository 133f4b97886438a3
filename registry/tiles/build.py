"""Building a tile index: stream each file once in large sequential reads, hash tiles on a thread pool.

Reads go through a caller-supplied ``read(file, offset, length)`` (a local checkpoint folder:
:class:`CheckpointReader`); each read covers whole row blocks of one tensor, about ``chunk_bytes`` at a
time, in file order. Every row block becomes one hashing task (BLAKE3 and numpy's strided copy release
the GIL), and at most ``depth`` chunks are held at once, so memory stays near ``depth x chunk_bytes``.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

import numpy as np

from shardport.registry.artifact.manifest import TensorEntry
from shardport.registry.errors import StoreError, UsageError
from shardport.registry.tiles.errors import TileGridError
from shardport.registry.tiles.grid import (
    DEFAULT_MINIMUM,
    DEFAULT_TARGET,
    GridChoice,
    PlaneLayout,
    choose_grid,
    plane_layout,
)
from shardport.registry.tiles.model import BytesLike, TensorTiles, TileIndex, tile_hash
from shardport.registry.tiles.splits import PlaneCuts

Reader = Callable[[str, int, int], BytesLike]
"""``read(file, offset, length)`` → exactly ``length`` bytes of ``file`` from ``offset``."""

DEFAULT_CHUNK = 64 << 20


def _hash_row_block(
    buf: BytesLike, offset: int, nrows: int, layout: PlaneLayout, choice: GridChoice
) -> list[str]:
    """Hashes of the tiles of one row block held in ``buf[offset:]`` (tile-column order)."""
    row_bytes = layout.row_bytes
    if nrows == 0 or row_bytes == 0:
        return [tile_hash(b"")]
    rows = np.frombuffer(buf, dtype=np.uint8, count=nrows * row_bytes, offset=offset).reshape(
        nrows, row_bytes
    )
    out = []
    for c0 in range(0, row_bytes, choice.col_block):
        tile = rows[:, c0 : c0 + choice.col_block]
        out.append(tile_hash(np.ascontiguousarray(tile).data.cast("B")))
    return out


class _Job:
    """One tensor being hashed: its entry, layout, grid and the hashes collected so far."""

    def __init__(self, entry: TensorEntry, target: int, minimum: int, cuts: PlaneCuts | None) -> None:
        self.entry = entry
        self.layout = plane_layout(entry)
        self.choice = choose_grid(self.layout, target=target, minimum=minimum, cuts=cuts)
        self.blocks: list[Future[list[str]]] = []

    def tiles(self) -> TensorTiles:
        hashes = [h for block in self.blocks for h in block.result()]
        return TensorTiles(
            file=self.entry.file,
            start=self.entry.start,
            rows=self.layout.rows,
            row_bytes=self.layout.row_bytes,
            row_block=self.choice.row_block,
            col_block=self.choice.col_block,
            hashes=tuple(hashes),
        )


def build_tile_index(
    entries: Iterable[TensorEntry],
    read: Reader,
    *,
    target: int = DEFAULT_TARGET,
    minimum: int = DEFAULT_MINIMUM,
    chunk_bytes: int = DEFAULT_CHUNK,
    threads: int | None = None,
    depth: int = 3,
    cuts: Mapping[str, PlaneCuts] | None = None,
) -> TileIndex:
    """Hash every tile of every tensor in ``entries`` (see the module docstring for the I/O pattern).

    ``cuts``: per tensor, the split points and units its grid must honour (:func:`.splits.plane_cuts`);
    a tensor without gets the generic rule of :mod:`.grid`.
    """
    jobs: dict[str, _Job] = {}
    cuts = cuts or {}
    for entry in entries:
        if entry.name in jobs:
            raise TileGridError(f"tensor {entry.name!r} is listed twice (in {jobs[entry.name].entry.file})")
        jobs[entry.name] = _Job(entry, target, minimum, cuts.get(entry.name))
    order = sorted(jobs.values(), key=lambda job: (job.entry.file, job.entry.start))
    held: deque[list[Future[list[str]]]] = deque()
    with ThreadPoolExecutor(max_workers=threads or min(8, os.cpu_count() or 1)) as pool:
        for job in order:
            layout, rb = job.layout, job.choice.row_block
            if layout.nbytes == 0:
                job.blocks.append(pool.submit(_hash_row_block, b"", 0, 0, layout, job.choice))
                continue
            step = rb * max(1, chunk_bytes // (rb * layout.row_bytes))
            for r0 in range(0, layout.rows, step):
                nrows = min(step, layout.rows - r0)
                buf = _read_exactly(read, job.entry, r0 * layout.row_bytes, nrows * layout.row_bytes)
                futures = [
                    pool.submit(
                        _hash_row_block, buf, k * layout.row_bytes, min(rb, nrows - k), layout, job.choice
                    )
                    for k in range(0, nrows, rb)
                ]
                job.blocks += futures
                held.append(futures)
                while len(held) > depth:
                    for done in held.popleft():
                        done.result()
        tensors = {name: job.tiles() for name, job in jobs.items()}
    return TileIndex(tile_target=target, tile_minimum=minimum, tensors=tensors)


def _read_exactly(read: Reader, entry: TensorEntry, offset: int, length: int) -> BytesLike:
    at = entry.start + offset
    data = read(entry.file, at, length)
    if memoryview(data).nbytes != length:
        raise StoreError(
            f"{entry.file}: tensor {entry.name!r}: read of {length} bytes at offset {at} returned "
            f"{memoryview(data).nbytes} (file truncated or changed while indexing)"
        )
    return data


class CheckpointReader:
    """A :data:`Reader` over files in a local checkpoint folder (``os.pread``; files opened once).

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()
        self._fds: dict[str, int] = {}

    def __call__(self, file: str, offset: int, length: int) -> bytes:
        """``length`` bytes of ``file`` from ``offset`` (fewer at end of file)."""
        fd = self._fds.get(file)
        if fd is None:
            path = (self.root / file).resolve()
            if not path.is_relative_to(self.root):
                raise UsageError(f"{file}: escapes the checkpoint folder {self.root}")
            try:
                fd = self._fds[file] = os.open(path, os.O_RDONLY)
            except OSError as exc:
                raise StoreError(f"{path}: cannot open: {exc}") from exc
        chunks = []
        while length > 0:
            try:
                got = os.pread(fd, length, offset)
            except OSError as exc:
                raise StoreError(f"{file}: read at {offset}: {exc}") from exc
            if not got:
                break
            chunks.append(got)
            offset += len(got)
            length -= len(got)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def close(self) -> None:
        """Close every file opened."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
