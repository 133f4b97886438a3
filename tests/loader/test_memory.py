"""Peak resident memory of a rank's load: its assigned bytes plus the ledger's stated bounds.

Each load runs in a fresh Python process that resets its peak (``/proc/self/clear_refs``), loads one
rank's slices of a 64 MiB checkpoint, and reports the growth of ``VmHWM`` and of
``resource.getrusage().ru_maxrss`` next to the ledger's bounds: staging slots, scratch buffers and the
page-cache pages mapped at once (``mapped_bound_bytes``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from loader_artifacts import publish
from safetensors.numpy import save_file

SCRIPT = r"""
import json, resource, sys
from pathlib import Path
from shardport.loader import PlaneSlice, ReadOptions, read_slices
from shardport.registry.manifest import FileEntry, TensorEntry
from shardport.registry.store import Store
from shardport.registry.tiles import TileIndex

def status(key):
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(key))
    return int(line.split()[1]) * 1024

spec = json.load(open(sys.argv[1]))
index = TileIndex.from_bytes(open(spec["index"], "rb").read())
tensors = [TensorEntry(**e) for e in spec["entries"]]
files = [FileEntry(**f) for f in spec["files"]]
slices = [PlaneSlice(*s) for s in spec["slices"]]
store = Store(spec["store"])
options = ReadOptions(page_cache=spec["page_cache"], batch_bytes=4 << 20)
# a first small load imports and initializes everything the measured one uses
read_slices(slices[:1], tensors=tensors, files=files, index=index, store=store, options=options)
Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from the current RSS
before, before_ru = status("VmRSS:"), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
got = read_slices(slices, tensors=tensors, files=files, index=index, store=store, options=options)
ledger = got.ledger
print(json.dumps({
    "growth": status("VmHWM:") - before,
    "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "ru_before": before_ru,
    "assigned": ledger.bytes_assigned,
    "bound": ledger.staging_bound_bytes + ledger.scratch_bytes + ledger.mapped_bound_bytes,
    "mapped_bound": ledger.mapped_bound_bytes,
    "cached": ledger.page_cache_batches,
}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("page_cache", [True, False], ids=["mapped", "preadv"])
@pytest.mark.parametrize("axis", ["row", "col"])
def test_rank_load_peak_rss_is_assigned_bytes_plus_the_stated_bounds(
    tmp_path: Path, axis: str, page_cache: bool
) -> None:
    rng = np.random.default_rng(3)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    arrays = {f"w{k}": rng.integers(0, 1 << 16, (2048, 4096), dtype=np.uint16) for k in range(4)}
    save_file(arrays, str(ckpt / "model.safetensors"))  # 64 MiB
    art = publish(ckpt / "model.safetensors", str(tmp_path / "store"), target=1 << 20, minimum=64 << 10)
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
        "page_cache": page_cache,
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    command = [sys.executable, "-c", SCRIPT, str(tmp_path / "spec.json")]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    assert got["assigned"] == 16 << 20
    assert (got["cached"] > 0) == page_cache and (got["mapped_bound"] > 0) == page_cache
    slack = 8 << 20  # the interpreter's own allocations during a load (plan objects, thread stacks)
    assert got["growth"] <= got["assigned"] + got["bound"] + slack, got
    assert got["bound"] <= 24 << 20  # the bounds are the in-flight window, not the 64 MiB model
    # getrusage's peak covers the whole process life: it may not rise by more than the same bound
    assert got["ru_maxrss"] - got["ru_before"] <= got["assigned"] + got["bound"] + slack, got
