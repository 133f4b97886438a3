"""The :class:`BlobSource` protocol every storage backend's reader implements."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from ..bands import Band
from ..ranges import FetchPlan
from .placing import Dest, MappedBands, TileCheck


class BlobSource(Protocol):
    """Reads checkpoint files (stored as blobs) into band destinations."""

    kind: str
    holds_responses: bool
    """Whether a fetch holds the fetched bytes besides the destinations (S3 responses)."""
    direct_bytes: int
    """Bytes read so far with O_DIRECT (not through the page cache)."""
    retries: int
    """Requests retried so far (S3: a reset, truncated or 5xx answer re-requested)."""

    def fetch(
        self, plan: FetchPlan, bands: Sequence[Band], dests: Sequence[Dest], check: TileCheck | None = None
    ) -> bool:
        """Fill ``dests[k]`` with the bytes of ``bands[k]`` for every band ``plan`` reads.

        A tiled band's bytes that pass through the load's own memory as the file lays them out (a bounce
        buffer, an S3 response), where each tile is contiguous, go to ``check`` there, before they are
        de-tiled into the destination (no gather needed to hash them). Returns whether the fetch waited
        on the storage (some of it not in memory: the page cache) rather than only copied.
        """

    def map_cached(
        self, bands: Sequence[Band], limit: int, among: Iterable[int] | None = None
    ) -> MappedBands:
        """The bands (``among``: only those) whose file bytes are all in memory, mapped read-only.

        In groups spanning at most ``limit`` bytes; release each band after use, close at the end.
        """

    def prefetch(self, plan: FetchPlan, bands: Sequence[Band]) -> None:
        """Ask the storage to start on ``plan``'s spans (of ``bands``) now (:meth:`fetch` reads them)."""

    def close(self) -> None:
        """Release files and connections."""


def _where(file: str, key: str, offset: int, length: int) -> str:
    return f"{file} (blob {key}): bytes [{offset}, {offset + length})"
