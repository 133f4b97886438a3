"""Quantized layouts: every plane follows its codes, splits honour groups, blocks and packed words.

The decode tests cut each rank's bytes out of a random file image by its pieces, decode them as a
rank-local weight with the registry's reference decoder, and compare with the same slice of the
whole weight's decode, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from placement_builders import Shape, check_plan, inventory, lay_out, reads_of

from shardport.placement import Inventory, SplitRefusedError, Topology, UnsplittableError, plan
from shardport.registry.contracts import TensorInfo, decode_weight, infer_gguf, infer_safetensors

GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}


def _image(inv: Inventory, seed: int = 0) -> dict[str, np.ndarray]:
    """Random bytes for every file, with sequential g_idx planes (column k in group k // G)."""
    rng = np.random.default_rng(seed)
    size: dict[str, int] = {}
    for e in inv.tensors:
        size[e.file] = max(size.get(e.file, 0), e.end)
    files = {f: rng.integers(0, 256, n, dtype=np.uint8) for f, n in size.items()}
    for weight in inv.weights:
        contract = weight.contract
        for plane in weight.planes:
            if plane.role == "g_idx":
                entry = next(e for e in inv.tensors if e.name == plane.tensor)
                k = plane.shape[0]
                values = (np.arange(k) // contract.scales.group_size).astype("<i4")
                files[entry.file][entry.start : entry.end] = values.view(np.uint8)
    return files


def _whole(inv: Inventory, files: dict[str, np.ndarray], weight_name: str) -> np.ndarray:
    weight = next(w for w in inv.weights if w.name == weight_name)
    entries = {e.name: e for e in inv.tensors}
    planes = {
        p.tensor: files[entries[p.tensor].file][entries[p.tensor].start : entries[p.tensor].end]
        for p in weight.planes
    }
    with np.errstate(all="ignore"):
        return decode_weight(weight, planes)


def _local(read_set, files, dtypes, config, gguf: bool, group: int) -> np.ndarray:
    """Decode a rank's reads of one weight as a rank-local weight."""
    infos, planes = [], {}
    k0 = read_set[0].slice.bounds[-1][0]
    for read in read_set:
        raw = np.concatenate([files[read.file][o : o + n] for o, n in read.pieces])
        if read.role == "g_idx":
            raw = (raw.view("<i4") - k0 // group).astype("<i4").view(np.uint8)
        infos.append(TensorInfo(read.tensor, dtypes[read.tensor], read.shape))
        planes[read.tensor] = raw
    weights = infer_gguf({}, infos) if gguf else infer_safetensors(config, infos)
    (weight,) = [w for w in weights if w.name == read_set[0].weight]
    with np.errstate(all="ignore"):  # random bytes: some scales are NaN, compared bit for bit
        return decode_weight(weight, planes)


def _check_decodes(inv: Inventory, topo: Topology, weight_names: list[str], config, gguf=False, group=128):
    result = plan(inv, topo)
    check_plan(result, inv)
    files = _image(inv)
    dtypes = {e.name: e.dtype for e in inv.tensors}
    for name in weight_names:
        whole = _whole(inv, files, name)
        for rank in result.ranks:
            mine = [r for r in rank.reads if r.weight == name]
            if not mine:
                continue
            (n0, n1), (k0, k1) = mine[0].slice.bounds
            local = _local(mine, files, dtypes, config, gguf, group)
            assert np.array_equal(local.view(np.uint32), whole[n0:n1, k0:k1].view(np.uint32)), (
                name,
                rank.rank,
            )
    return result


@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_gptq_group_128_every_plane_follows_the_codes(tp):
    shape = Shape(layers=1, heads=8, kv_heads=8, head_dim=128, intermediate=3072, vocab=64)
    inv = inventory(shape, "gptq", group=128)
    down, gate = "model.layers.0.mlp.down_proj", "model.layers.0.mlp.gate_proj"
    result = _check_decodes(
        inv, Topology(tp), [f"{down}.weight", f"{gate}.weight"], {"quantization_config": GPTQ}
    )
    split = next(s for s in result.splits if s.key == "layers.0.mlp.intermediate")
    assert split.kind == "even" and split.ranges[1] == (3072 // tp, 2 * 3072 // tp)
    per = 3072 // tp
    for rank in range(tp):
        k0, k1 = rank * per, (rank + 1) * per
        assert reads_of(result, f"{down}.qweight")[rank].index == ((k0 // 8, k1 // 8), (0, 1024))
        assert reads_of(result, f"{down}.scales")[rank].index == ((k0 // 128, k1 // 128), (0, 1024))
        assert reads_of(result, f"{down}.qzeros")[rank].index == ((k0 // 128, k1 // 128), (0, 128))
        assert reads_of(result, f"{down}.g_idx")[rank].index == ((k0, k1),)
        assert len(reads_of(result, f"{down}.qweight")[rank].pieces) == 1  # leading-axis split
        assert reads_of(result, f"{gate}.qweight")[rank].index == ((0, 128), (k0, k1))
        assert reads_of(result, f"{gate}.qzeros")[rank].index == ((0, 8), (k0 // 8, k1 // 8))
        assert reads_of(result, f"{gate}.g_idx")[rank].index == ((0, 1024),)  # column split: whole
        assert len(reads_of(result, f"{gate}.scales")[rank].pieces) == 8  # one per group row


@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_gguf_q4_1_blocks_of_32(tp):
    shape = Shape(layers=1, heads=24, kv_heads=8, head_dim=32, intermediate=1536, vocab=48)
    inv = inventory(shape, "gguf", qtype="Q4_1")
    names = [
        "blk.0.ffn_down.weight",
        "blk.0.ffn_up.weight",
        "blk.0.attn_output.weight",
        "blk.0.attn_k.weight",
    ]
    result = _check_decodes(inv, Topology(tp), names, None, gguf=True)
    down = reads_of(result, "blk.0.ffn_down.weight")
    row_bytes = 1536 // tp // 32 * 20
    for rank, read in down.items():
        assert read.index == ((0, 768), (rank * 1536 // tp, (rank + 1) * 1536 // tp))
        assert len(read.pieces) == 768 and {n for _, n in read.pieces} == {row_bytes}
    if tp == 8:
        k_split = next(s for s in result.splits if s.key == "layers.0.self_attn.kv")
        assert k_split.ranges == tuple((r * 32, (r + 1) * 32) for r in range(8))


def test_gguf_k_quant_block_256_aligns_the_split():
    shape = Shape(layers=1, heads=8, kv_heads=8, head_dim=64, intermediate=768, vocab=16)
    inv = inventory(shape, "gguf", qtype="Q4_K")
    with pytest.raises(SplitRefusedError, match=r"K=768 per rank 384 is not a multiple of Q4_K block 256"):
        plan(inv, Topology(2), policy="refuse")
    result = _check_decodes(
        inv, Topology(2), ["blk.0.ffn_down.weight", "blk.0.ffn_gate.weight"], None, gguf=True
    )
    split = next(s for s in result.splits if s.key == "layers.0.mlp.intermediate")
    assert split.kind == "aligned" and split.ranges == ((0, 512), (512, 768))


def test_k576_refused_with_the_arithmetic_or_aligned_to_groups():
    shape = Shape(layers=1, heads=3, kv_heads=1, head_dim=128, intermediate=576, vocab=48)
    inv = inventory(shape, "gptq", group=128)
    with pytest.raises(SplitRefusedError, match=r"K=576 per rank 192 is not a multiple of group 128") as info:
        plan(inv, Topology(3), policy="refuse")
    assert info.value.exit_code == 2 and "tp in [1]" in str(info.value)
    down = "model.layers.0.mlp.down_proj"
    result = _check_decodes(
        inv,
        Topology(3),
        [f"{down}.weight", "model.layers.0.mlp.up_proj.weight"],
        {"quantization_config": GPTQ},
    )
    split = next(s for s in result.splits if s.key == "layers.0.mlp.intermediate")
    assert split.kind == "aligned" and split.ranges == ((0, 256), (256, 384), (384, 576))
    assert (
        "K=576 per rank 192 is not a multiple of group 128" in split.detail
        and "[256, 128, 192]" in split.detail
    )
    assert [r.index for r in reads_of(result, f"{down}.scales").values()] == [
        ((0, 2), (0, 384)),
        ((2, 3), (0, 384)),
        ((3, 5), (0, 384)),
    ]
    up = reads_of(result, "model.layers.0.mlp.up_proj.qweight")
    assert [r.slice.bounds[0] for r in up.values()] == list(split.ranges)  # paired operators agree


def test_act_order_scales_are_read_whole_under_a_k_split():
    shape = Shape(layers=1, heads=2, kv_heads=2, head_dim=64, intermediate=512, vocab=16)
    inv = inventory(shape, "gptq", group=128, act_order=True)
    result = plan(inv, Topology(2))
    check_plan(result, inv)
    down = "model.layers.0.mlp.down_proj"
    for rank, read in reads_of(result, f"{down}.scales").items():
        assert read.index == ((0, 4), (0, 128))
        assert reads_of(result, f"{down}.g_idx")[rank].index == ((rank * 256, rank * 256 + 256),)
    split = next(s for s in result.splits if s.key == "layers.0.mlp.intermediate")
    assert not any(c.startswith("group") for c in split.constraints)


def test_awq_n_split_at_packing_granularity():
    k, n = 64, 88  # 11 int32 words of 8 columns
    infos = [
        TensorInfo("model.layers.0.mlp.up_proj.qweight", "I32", (k, n // 8)),
        TensorInfo("model.layers.0.mlp.up_proj.qzeros", "I32", (2, n // 8)),
        TensorInfo("model.layers.0.mlp.up_proj.scales", "F16", (2, n)),
    ]
    config = {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 32}}
    inv = Inventory(infer_safetensors(config, infos), tuple(lay_out(infos)), {"num_hidden_layers": 1})
    with pytest.raises(
        SplitRefusedError, match=r"N=88 per rank 44 is not a multiple of 8 \(4-bit codes per 32-bit word\)"
    ):
        plan(inv, Topology(2), policy="refuse")
    result = _check_decodes(inv, Topology(2), ["model.layers.0.mlp.up_proj.weight"], config, group=32)
    qweight = reads_of(result, "model.layers.0.mlp.up_proj.qweight")
    assert [r.index for r in qweight.values()] == [((0, 64), (0, 6)), ((0, 64), (6, 11))]
    assert [len(r.pieces) for r in qweight.values()] == [64, 64]
    assert {n for _, n in qweight[0].pieces} == {24} and {n for _, n in qweight[1].pieces} == {20}
    with pytest.raises(UnsplittableError, match="holds 11 whole unit"):
        plan(inv, Topology(16))


def test_pieces_lie_inside_their_tensors_and_bytes_add_up():
    shape = Shape(layers=2, heads=4, kv_heads=2, head_dim=32, intermediate=256, vocab=40)
    inv = inventory(shape, "gptq", group=32, files=3, pad=100)
    result = plan(inv, Topology(2, pp=2), max_gap=128)
    check_plan(result, inv)
    assert result.totals.bytes_assigned == sum(r.bytes_assigned for r in result.ranks)
    assert result.totals.checkpoint_bytes == sum(e.end - e.start for e in inv.tensors)
    for rank in result.ranks:
        assert rank.bytes_assigned == sum(read.nbytes for read in rank.reads)
        assert rank.read_amplification == rank.bytes_fetched / rank.bytes_assigned >= 1.0
    assert result.totals.max_read_amplification > 1.0  # 100-byte pads were bridged
