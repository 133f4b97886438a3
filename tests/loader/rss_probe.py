"""Peak RSS of one verified load, measured in a fresh Python process (used by tests and bench/).

:func:`measure` writes ``spec`` (tile index path, manifest entries and files, slices, store URL, read
options) next to ``folder``, runs :data:`SCRIPT` in a new interpreter and returns what it reports: the
growth of ``VmHWM`` over the load (the peak is reset first through ``/proc/self/clear_refs``), the
``getrusage`` peaks before and after, and the ledger's bounds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPT = r"""
import json, resource, sys
from pathlib import Path
from shardport.loader import PlaneSlice, ReadOptions, read_slices
from shardport.registry.artifact.manifest import FileEntry, TensorEntry
from shardport.registry.store.protocol import Store
from shardport.registry.tiles.model import TileIndex

def status(key):
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(key))
    return int(line.split()[1]) * 1024

spec = json.load(open(sys.argv[1]))
index = TileIndex.from_bytes(open(spec["index"], "rb").read())
tensors = [TensorEntry(**e) for e in spec["entries"]]
files = [FileEntry(**f) for f in spec["files"]]
slices = [PlaneSlice(*s) for s in spec["slices"]]
store = Store(spec["store"])
options = ReadOptions(**spec.get("options", {}))
# a first small load imports and initializes everything the measured one uses
read_slices(slices[:1], tensors=tensors, files=files, index=index, store=store, options=options)
Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from the current RSS
before, before_ru = status("VmRSS:"), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
ledger = read_slices(slices, tensors=tensors, files=files, index=index, store=store, options=options).ledger
print(json.dumps({
    "peak_rss_growth_bytes": status("VmHWM:") - before,
    "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "ru_maxrss_before_bytes": before_ru,
    "assigned_bytes": ledger.bytes_assigned,
    "staging_bound_bytes": ledger.staging_bound_bytes,
    "scratch_bytes": ledger.scratch_bytes,
    "mapped_bound_bytes": ledger.mapped_bound_bytes,
    "bound_bytes": ledger.staging_bound_bytes + ledger.scratch_bytes + ledger.mapped_bound_bytes,
    "peak_staging_bytes": ledger.peak_staging_bytes,
    "page_cache_batches": ledger.page_cache_batches,
}))
"""


def measure(folder: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Run one load described by ``spec`` in a fresh interpreter; return its memory report."""
    path = folder / "rss-spec.json"
    path.write_text(json.dumps(spec))
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(path)], capture_output=True, text=True, check=True
    )
    return dict(json.loads(out.stdout))
