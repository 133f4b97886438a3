"""Every rank of every supported split checks a witness cell of every quantized weight it loads.

Checkpoints are analysed as push does (witnesses made on the real bytes), planned with the real
planner at tp 2, 3, 4, 6, 8 (and ep for stacked experts), and each rank's slices are cut from the file
bytes exactly as the plan's byte runs say; :func:`check_rank_witnesses` then runs as a rank load does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from witness_artifacts import gguf_model, gptq_llama

from shardport.loader.witness_check import check_rank_witnesses
from shardport.placement import Topology, plan
from shardport.placement.errors import PlacementError
from shardport.registry.checkpoint.analysis import Analysis, analyze
from shardport.registry.contracts import CellWitness, FloatContract
from shardport.registry.contracts.errors import WitnessMismatchError
from shardport.registry.contracts.model import cell_positions

TPS = (2, 3, 4, 6, 8)


def analysed(root: Path) -> Analysis:
    result = analyze(root, sorted(p.name for p in root.iterdir()))
    assert result is not None
    return result


def rank_loads(
    root: Path,
    analysis: Analysis,
    params: dict[str, Any],
    topology: Topology,
    tamper: tuple[str, int] | None = None,
) -> list[tuple[Any, list[Any]]]:
    """Per rank: (its plan, its loaded (read, bytes)) cut from the file by the plan's runs."""
    p = plan((analysis.weights, analysis.tensors, params or analysis.params), topology)
    files: dict[str, np.ndarray] = {}
    out = []
    for rank in p.ranks:
        loaded = []
        for read in rank.reads:
            data = files.setdefault(read.file, np.fromfile(root / read.file, dtype=np.uint8)).copy()
            if tamper is not None and read.tensor == tamper[0]:
                data[tamper[1]] ^= 0x10
            pieces = [data[o : o + n] for o, n in read.pieces]
            loaded.append((read, np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint8)))
        out.append((rank, loaded))
    return out


def quantized_loaded(rank: Any, analysis: Analysis) -> set[str]:
    q = {w.name for w in analysis.weights if not isinstance(w.contract, FloatContract)}
    return {r.weight for r in rank.reads if r.weight in q}


def assert_every_rank_checks(
    root: Path, analysis: Analysis, params: dict[str, Any], topologies: list[Topology]
) -> int:
    supported = 0
    for topology in topologies:
        try:
            loads = rank_loads(root, analysis, params, topology)
        except PlacementError:
            continue  # a split the planner refuses for this model (e.g. tp 4 with 3 kv heads)
        supported += 1
        for rank, loaded in loads:
            count = check_rank_witnesses(analysis.weights, {e.name: e for e in analysis.tensors}, loaded)
            wanted = quantized_loaded(rank, analysis)
            assert count.unchecked == (), (topology, rank.rank, count.unchecked)
            assert count.weights == len(wanted) > 0, (topology, rank.rank)
    return supported


def test_every_rank_checks_every_gptq_weight(tmp_path: Path) -> None:
    params = gptq_llama(tmp_path)
    analysis = analysed(tmp_path)
    assert assert_every_rank_checks(tmp_path, analysis, params, [Topology(tp=t) for t in TPS]) == len(TPS)


def test_every_rank_checks_every_gguf_weight(tmp_path: Path) -> None:
    gguf_model(tmp_path)
    analysis = analysed(tmp_path)
    # 3 kv heads: tp 2, 3 and 6 split; 4 and 8 are refused by the planner
    assert assert_every_rank_checks(tmp_path, analysis, {}, [Topology(tp=t) for t in TPS]) == 3


def test_every_rank_checks_its_experts(tmp_path: Path) -> None:
    gguf_model(tmp_path, experts=8)
    analysis = analysed(tmp_path)
    stacked = [w for w in analysis.weights if w.shape.axes[0] == "E"]
    assert len(stacked) == 3 and all(
        isinstance(w.witness, CellWitness) and w.witness.experts == 8 for w in stacked
    )
    topologies = [Topology(tp=t, ep=e) for e in (1, 2, 4, 8) for t in (1, 2, 3)]
    assert assert_every_rank_checks(tmp_path, analysis, {}, topologies) == len(topologies)


def test_a_tampered_byte_in_any_ranks_cell_is_caught_by_that_rank(tmp_path: Path) -> None:
    params = gptq_llama(tmp_path)
    analysis = analysed(tmp_path)
    entries = {e.name: e for e in analysis.tensors}
    for name, tp in (("model.layers.0.mlp.gate_proj.weight", 3), ("model.layers.0.mlp.down_proj.weight", 6)):
        weight = next(w for w in analysis.weights if w.name == name)
        assert isinstance(weight.witness, CellWitness)
        codes = entries[weight.name.removesuffix(".weight") + ".qweight"]  # int32 [K/8, N]
        n = codes.shape[1]
        clean = rank_loads(tmp_path, analysis, params, Topology(tp=tp))
        for rank, _ in clean:
            box = next(r.slice for r in rank.reads if r.weight == name)
            (n0, n1), (k0, k1) = box.bounds
            row, c0, _ = next(
                c for c in cell_positions(weight.witness) if n0 <= c[0] < n1 and k0 <= c[1] and c[2] <= k1
            )
            offset = codes.start + ((c0 // 8) * n + row) * 4  # the word holding codes c0..c0+7 of ``row``
            tampered = rank_loads(tmp_path, analysis, params, Topology(tp=tp), tamper=(codes.name, offset))
            for other, loaded in tampered:
                if other.rank == rank.rank:
                    with pytest.raises(WitnessMismatchError, match=name):
                        check_rank_witnesses(analysis.weights, entries, loaded)


def test_ranks_check_the_producer_witness_rows_in_their_slice(tmp_path: Path) -> None:
    from shardport.registry.artifact.witness_file import ProducerWitness
    from shardport.registry.checkpoint.analysis import PlaneReader
    from shardport.registry.contracts import decode_weight

    params = gptq_llama(tmp_path)
    analysis = analysed(tmp_path)
    entries = {e.name: e for e in analysis.tensors}
    reader = PlaneReader(tmp_path)
    names = ["model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.down_proj.weight"]
    rows, values = {}, {}
    for w in analysis.weights:
        if w.name in names:
            rows[w.name] = np.arange(0, w.shape.rows, w.shape.rows // 8, dtype=np.int64)
            values[w.name] = decode_weight(w, reader.planes(w, entries), [int(r) for r in rows[w.name]])
    producer = ProducerWitness(rows=rows, values=values)
    for rank, loaded in rank_loads(tmp_path, analysis, params, Topology(tp=3)):
        count = check_rank_witnesses(analysis.weights, entries, loaded, producer)
        assert count.producer_rows >= 8 + 2, rank.rank  # all 8 rows of down_proj, 2+ of gate_proj
    wrong = ProducerWitness(rows=rows, values={k: v * 1.25 for k, v in values.items()})
    for _rank, loaded in rank_loads(tmp_path, analysis, params, Topology(tp=3)):
        with pytest.raises(WitnessMismatchError, match="producer witness"):
            check_rank_witnesses(analysis.weights, entries, loaded, wrong)


def test_every_range_of_every_split_holds_a_cell() -> None:
    """The grid argument against the planner's own split arithmetic, over many extents and units."""
    from shardport.placement.errors import UnsplittableError
    from shardport.placement.layout import Constraint
    from shardport.placement.splits import Dim, split_dim
    from shardport.registry.contracts.witness import MAX_CELL_WIDTH, _axis_grid

    checked = 0
    for align, extra in ((1, 1), (32, 1), (32, 3), (128, 1), (256, 1), (8, 12), (16, 6)):
        unit = align * extra  # the planner's unit is a multiple of the weight's alignment
        for extent in range(unit, 64 * unit + 1, max(1, unit // 8) * 5 + align):
            blocks = -(-extent // align)
            seed = extent * 7919
            witness = CellWitness.model_construct(
                kind="cells", seed=seed, experts=1, rows=extent, columns=extent, align=align,
                width=min(align, MAX_CELL_WIDTH), row_grid=_axis_grid(extent, seed),
                block_grid=_axis_grid(blocks, seed >> 24), digests="", rel_error=None,
            )  # fmt: skip
            cells = cell_positions(witness)
            for parts in TPS:
                dim = Dim("d", "N", extent, (Constraint(unit, f"unit {unit}", "test"),), ("w",))
                try:
                    ranges = split_dim(dim, parts, "align").ranges
                except UnsplittableError:
                    continue
                for lo, hi in ranges:
                    assert any(lo <= r < hi for r, _, _ in cells), ("rows", extent, unit, parts, lo, hi)
                    whole = any(lo <= c0 and c1 <= hi for _, c0, c1 in cells)
                    assert whole, ("K", extent, unit, parts, lo, hi)
                    checked += 1
    assert checked > 5000
