"""Tiles fit every split: each rank's rectangles of every plan land on tile boundaries, and no tile cuts a
quantization group, GGUF block or packed word.

The tile grids are made as push makes them (:func:`shardport.registry.tiles.splits.plane_cuts` → the
grid); the plans are the planner's own, for every tp in ``SPLITS`` (and ep for stacked experts) that it
accepts on the model. A rectangle edge off a tile boundary would make two ranks read the whole tile.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from placement_builders import Shape, inventory, lay_out

from shardport.loader.rank_pull import slices_of
from shardport.placement import Inventory, Topology, TopologyError, UnsplittableError, plan
from shardport.registry.contracts import TensorInfo, infer_gguf
from shardport.registry.contracts.gguf_blocks import BLOCK_SIZES
from shardport.registry.tiles.grid import choose_grid, plane_layout
from shardport.registry.tiles.model import TensorTiles, TileIndex
from shardport.registry.tiles.splits import SPLITS, plane_cuts, split_points


def _grids(inv: Inventory) -> dict[str, tuple[int, int, int, int, int]]:
    """tensor → (rows, row_bytes, quantum, row_block, col_block) as push would tile it."""
    cuts = plane_cuts(inv.weights, inv.tensors, inv.params)
    out = {}
    for e in inv.tensors:
        layout = plane_layout(e)
        g = choose_grid(layout, cuts=cuts.get(e.name))
        out[e.name] = (layout.rows, layout.row_bytes, layout.quantum, g.row_block, g.col_block)
    return out


def _group_units(inv: Inventory, fmt: str, group: int) -> dict[str, tuple[int, int]]:
    """Independently of the grid code: (rows, column quanta) a tile edge must be a multiple of."""
    out = {}
    for e in inv.tensors:
        if fmt == "gptq" and e.name.endswith(".qweight"):
            out[e.name] = (group // 8, 1)  # [K/8, N] int32: 8 K-codes per row, a group is group/8 rows
        elif fmt == "awq" and e.name.endswith(".qweight"):
            out[e.name] = (group, 1)  # [K, N/8]: a group is `group` rows
        else:
            out[e.name] = (1, 1)  # GGUF blocks and packed words are whole quanta already
    return out


def _check(inv: Inventory, fmt: str, group: int, tps: tuple[int, ...], eps: tuple[int, ...] = (1,)) -> int:
    """Every rank's rectangles on tile edges, every tile edge on a group; returns the plans checked."""
    grids = _grids(inv)
    units = _group_units(inv, fmt, group)
    for name, (rows, row_bytes, q, rb, cb) in grids.items():
        ru, cu = units[name]
        assert rb % ru == 0 or rb == rows, (name, rb, ru)
        assert cb % (cu * q) == 0 or cb == row_bytes, (name, cb, q, cu)
    entries = {e.name: e for e in inv.tensors}
    planned = 0
    for tp in tps:
        for ep in eps:
            try:
                result = plan(inv, Topology(tp=tp, ep=ep))
            except (UnsplittableError, TopologyError):
                continue
            planned += 1
            for rank in result.ranks:
                for read in rank.reads:
                    rows, row_bytes, _, rb, cb = grids[read.tensor]
                    for s in slices_of(read, entries[read.tensor]):
                        where = (tp, ep, rank.rank, read.tensor, s, rb, cb)
                        assert s.row0 % rb == 0 and (s.row1 % rb == 0 or s.row1 == rows), where
                        assert s.col0 % cb == 0 and (s.col1 % cb == 0 or s.col1 == row_bytes), where
    return planned


@st.composite
def shapes(draw: st.DrawFn) -> tuple[Shape, str, int]:
    kv_heads = draw(st.sampled_from([1, 2, 3, 4, 8]))
    heads = kv_heads * draw(st.sampled_from([1, 2, 3]))
    experts = draw(st.sampled_from([0, 0, 0, 3, 4, 8]))
    fmt = draw(st.sampled_from(["float", "gptq", "awq", "gguf"]))
    group = draw(st.sampled_from([32, 64, 128]))
    head_dim = draw(st.sampled_from([32, 64, 128]))
    unit = 256 if fmt == "gguf" else group  # Q4_K rows are blocks of 256
    shape = Shape(
        layers=1,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=unit * draw(st.integers(1, 30)) if fmt != "gguf" else 32 * draw(st.integers(2, 60)),
        vocab=draw(st.integers(8, 400)),
        experts=experts,
        tied=draw(st.booleans()),
    )
    return shape, fmt, group


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes())
@example(
    (Shape(layers=1, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152, tied=True), "gguf", 32)
)
@example((Shape(layers=1, heads=32, kv_heads=32, head_dim=128, intermediate=11008, vocab=64), "gptq", 128))
def test_every_split_point_is_a_tile_boundary(case: tuple[Shape, str, int]) -> None:
    shape, fmt, group = case
    qtype = "Q8_0" if fmt == "gguf" else "Q4_1"
    inv = inventory(shape, fmt, group=group, qtype=qtype)
    eps = tuple(e for e in (1, *SPLITS) if e <= max(shape.experts, 1))
    _check(inv, fmt, group, (1, *SPLITS), eps)


def test_smollm_dims_plan_at_tp_2_3_6_and_tiles_stay_whole_groups() -> None:
    """The 135M llama (9 heads / 3 kv heads): tp 4 and 8 are refused by the planner, 2, 3 and 6 hit tiles."""
    shape = Shape(layers=1, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152, tied=True)
    inv = inventory(shape, "gguf", qtype="Q4_1")
    assert _check(inv, "gguf", 32, SPLITS) == 3
    grids = _grids(inv)
    rows, row_bytes, q, rb, cb = grids["blk.0.attn_q.weight"]
    assert (rows, q, rb, cb) == (576, 20, 64, row_bytes)  # a head per tile row band (tp 6 cuts at heads)
    assert grids["blk.0.ffn_down.weight"][4] == 8 * 20  # K cut every 256 = 8 blocks (tp 2, 3, 6)


def test_gptq_k_11008_tiles_are_whole_groups() -> None:
    """The issue's case: a GPTQ qweight with K = 11008 (86 groups of 128) got row_block 172."""
    shape = Shape(layers=1, heads=32, kv_heads=32, head_dim=128, intermediate=11008, vocab=64)
    inv = inventory(shape, "gptq", group=128)
    grids = _grids(inv)
    rows, _, _, rb, _ = grids["model.layers.0.mlp.down_proj.qweight"]
    assert rows == 11008 // 8 and rb % 16 == 0  # 16 packed rows = one group of 128
    assert _check(inv, "gptq", 128, SPLITS) == len(SPLITS)  # every tp splits (aligned at 3, 4, 6, 8)


def test_split_points_are_the_planners() -> None:
    """Placement's split ranges are built from the registry's arithmetic (one rule, two users)."""
    from shardport.placement.layout import Constraint
    from shardport.placement.splits import Dim, split_dim

    for extent in (96, 100, 576, 1536, 11008):
        for unit in (1, 32, 64, 128, 192):
            for parts in SPLITS:
                dim = Dim("d", "K", extent, (Constraint(unit, "u", "t"),), ("w",))
                points = split_points(extent, unit, parts)
                if points is None:
                    assert -(-extent // unit) < parts
                    continue
                ranges = split_dim(dim, parts, "align").ranges
                assert tuple(a for a, _ in ranges[1:]) == points
                assert all(p % math.gcd(unit, extent) == 0 for p in points)


def test_gguf_block_size_is_the_column_quantum() -> None:
    shape = Shape(layers=1, heads=4, kv_heads=2, head_dim=64, intermediate=512, vocab=64)
    inv = inventory(shape, "gguf", qtype="Q4_1")
    _, _, q, _, cb = _grids(inv)["blk.0.ffn_down.weight"]
    assert q == BLOCK_SIZES["Q4_1"][1] and cb % q == 0


def test_tile_index_of_the_30_layer_135m_gguf_is_under_0_1_percent() -> None:
    """The bench's checkpoint (SmolLM-135M's dims, 30 layers, Q4_1 + tied Q8_0 embedding), as pushed:
    its tile index, cut at every split point, stays under 0.1% of the checkpoint."""
    hidden, inter, vocab, kv = 576, 1536, 49152, 192
    infos = [TensorInfo("token_embd.weight", "Q8_0", (vocab, hidden))]
    for n in range(30):
        infos.append(TensorInfo(f"blk.{n}.attn_norm.weight", "F32", (hidden,)))
        for stem, shape in {
            "attn_q": (hidden, hidden),
            "attn_k": (kv, hidden),
            "attn_v": (kv, hidden),
            "attn_output": (hidden, hidden),
            "ffn_gate": (inter, hidden),
            "ffn_up": (inter, hidden),
            "ffn_down": (hidden, inter),
        }.items():
            infos.append(TensorInfo(f"blk.{n}.{stem}.weight", "Q4_1", shape))
        infos.append(TensorInfo(f"blk.{n}.ffn_norm.weight", "F32", (hidden,)))
    infos.append(TensorInfo("output_norm.weight", "F32", (hidden,)))
    params = {  # as the manifest records a GGUF's keys
        "llama.attention.head_count": 9,
        "llama.attention.head_count_kv": 3,
        "llama.block_count": 30,
        "llama.embedding_length": hidden,
        "llama.feed_forward_length": inter,
    }
    tensors = [e.model_copy(update={"file": "model.gguf"}) for e in lay_out(infos, header=1 << 20)]
    inv = Inventory(tuple(infer_gguf({"general.architecture": "llama"}, infos)), tuple(tensors), params)
    cuts = plane_cuts(inv.weights, inv.tensors, inv.params)
    rng = random.Random(0)
    tiles = {}
    for e in inv.tensors:
        layout = plane_layout(e)
        g = choose_grid(layout, cuts=cuts.get(e.name))
        count = -(-layout.rows // g.row_block) * -(-layout.row_bytes // g.col_block)
        tiles[e.name] = TensorTiles(
            file=e.file,
            start=e.start,
            rows=layout.rows,
            row_bytes=layout.row_bytes,
            row_block=g.row_block,
            col_block=g.col_block,
            hashes=tuple(rng.randbytes(32).hex() for _ in range(count)),
        )
    assert _check(inv, "gguf", 32, SPLITS) == 3  # tp 2, 3 and 6 plan, and hit tile edges
    checkpoint = tensors[-1].end
    size = len(TileIndex(tensors=tiles).to_bytes())
    assert size / checkpoint < 0.001, (size, checkpoint)


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"num_attention_heads": "9", "num_key_value_heads": 3},
        {"num_attention_heads": True, "num_key_value_heads": 3},
        {"num_attention_heads": 0, "num_key_value_heads": 0},
        {"num_attention_heads": 9, "num_key_value_heads": 4},  # not whole query groups
        {"num_attention_heads": 3, "num_key_value_heads": 9},
        {"num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 7},  # disagrees with the shapes
    ],
)
def test_cuts_of_unusable_parameters_are_still_a_valid_grid(params: dict[str, object]) -> None:
    """Push computes cuts from the checkpoint's own parameters: odd ones must not fail it."""
    shape = Shape(layers=1, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=96)
    inv = inventory(shape, "gguf", qtype="Q4_1")
    cuts = plane_cuts(inv.weights, inv.tensors, params)
    for e in inv.tensors:
        layout = plane_layout(e)
        g = choose_grid(layout, cuts=cuts.get(e.name))
        assert 1 <= g.row_block <= max(layout.rows, 1) and g.col_block % layout.quantum == 0
    if not params or params.get("head_dim") == 7:  # attention cannot be planned: no tp anywhere
        assert all(not c.rows.points and not c.cols.points for c in cuts.values())
