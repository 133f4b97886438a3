"""Writing into a user's folder: where a pull may write, staged names, and atomic publication.

Consumes a destination path (and the store's and shardport's own folders, which it must never touch)
and the bytes to write; produces files published atomically: staged under owned temporary names, then
renamed into place, or the folder left as it was. Store objects are not written here (the backends'
create-only writes are).

- :mod:`.destination` — the DEST rules of a full, rank or one-file pull (:func:`full_pull_destination`);
- :mod:`.staging` — owned temporary names, cleaning up after a stopped pull, stopping on signals;
- :mod:`.writers` — :class:`StagedFiles`, :func:`write_safetensors` and :func:`write_file` (shardport's
  own small files: client state, trust policy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardport._lazy import lazy_exports

if TYPE_CHECKING:
    from .destination import file_destination, full_pull_destination, rank_pull_destination
    from .writers import StagedFiles, write_file, write_safetensors

#: Where each exported name lives; imported on first use (PEP 562).
_HOME = {
    **dict.fromkeys(("file_destination", "full_pull_destination", "rank_pull_destination"), "destination"),
    **dict.fromkeys(("StagedFiles", "write_file", "write_safetensors"), "writers"),
}

__getattr__ = lazy_exports(__name__, globals(), _HOME)

__all__ = [
    "StagedFiles",
    "file_destination",
    "full_pull_destination",
    "rank_pull_destination",
    "write_file",
    "write_safetensors",
]
