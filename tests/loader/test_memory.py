"""Peak resident memory of a rank's load: its assigned bytes plus the ledger's stated bounds.

Each load runs in a fresh Python process that resets its peak (``/proc/self/clear_refs``), loads one
rank's slices of a 64 MiB checkpoint, and reports the growth of ``VmHWM`` and of
``resource.getrusage().ru_maxrss`` next to the ledger's bounds: staging slots, scratch buffers and the
page-cache pages mapped at once (``mapped_bound_bytes``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from loader_artifacts import publish, tiled_copy
from rss_probe import measure
from safetensors.numpy import save_file


@pytest.mark.slow
@pytest.mark.parametrize(
    ("layout", "page_cache"),
    [("row_major", True), ("row_major", False), ("tiled", True), ("tiled", False)],
    ids=["mapped", "preadv", "tiled-mapped", "tiled-bounced"],
)
@pytest.mark.parametrize("axis", ["row", "col"])
def test_rank_load_peak_rss_is_assigned_bytes_plus_the_stated_bounds(
    tmp_path: Path, axis: str, layout: str, page_cache: bool
) -> None:
    rng = np.random.default_rng(3)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    arrays = {f"w{k}": rng.integers(0, 1 << 16, (2048, 4096), dtype=np.uint16) for k in range(4)}
    save_file(arrays, str(ckpt / "model.safetensors"))  # 64 MiB
    art = publish(ckpt / "model.safetensors", str(tmp_path / "store"), target=1 << 20, minimum=64 << 10)
    if layout == "tiled":  # its tile rows are read whole into a bounce buffer, then de-tiled
        art = tiled_copy(art, tmp_path / "tiled", str(tmp_path / "store"))
    slices = []
    for e in art.entries:
        t = art.index.tensors[e.name]
        if axis == "row":
            slices.append([e.name, t.rows // 4, t.rows // 2, 0, t.row_bytes])  # rank 1 of 4
        else:
            slices.append([e.name, 0, t.rows, t.row_bytes // 4, t.row_bytes // 2])
    (tmp_path / "index.json").write_bytes(art.index.to_bytes())
    spec = {
        "index": str(tmp_path / "index.json"),
        "entries": [e.model_dump() for e in art.entries],
        "files": [f.model_dump() for f in art.files],
        "slices": slices,
        "store": str(tmp_path / "store"),
        # 2 workers' buffers: one fetching at a time, one more verifying meanwhile
        "options": {"page_cache": page_cache, "batch_bytes": 4 << 20, "depth": 1, "verify_workers": 1},
    }
    got = measure(tmp_path, spec)
    assert got["assigned_bytes"] == 16 << 20
    # a row-major rank's row slices land whole in its arrays: read with preadv even when cached, never mapped
    maps = page_cache and not (layout == "row_major" and axis == "row")
    assert (got["page_cache_batches"] > 0) == maps and (got["mapped_bound_bytes"] > 0) == maps
    allowed = got["assigned_bytes"] + got["bound_bytes"] + (8 << 20)  # 8 MiB: the interpreter's own
    assert got["peak_rss_growth_bytes"] <= allowed, got
    assert got["bound_bytes"] <= 24 << 20  # the bounds are the in-flight window, not the 64 MiB model
    # getrusage's peak covers the whole process life: it may not rise by more than the same bound
    assert got["ru_maxrss_bytes"] - got["ru_maxrss_before_bytes"] <= allowed, got
