"""Split rules per slot, GQA, tied weights, pp stages and ep experts, inputs, errors, serialization."""

from __future__ import annotations

import subprocess
import sys

import pytest
from placement_builders import Shape, check_plan, inventory, lay_out, reads_of

import shardport.placement as placement
from shardport.placement import (
    Inventory,
    InventoryError,
    Plan,
    SplitRefusedError,
    Topology,
    TopologyError,
    UnsplittableError,
    UnsupportedSplitError,
    plan,
)
from shardport.registry.artifact.manifest import ContainerInfo, FileEntry, Manifest, ModelInfo
from shardport.registry.contracts import TensorInfo, infer_safetensors

GQA = Shape(layers=1, heads=8, kv_heads=2, head_dim=16, intermediate=64, vocab=32)


def _rows(result: Plan, tensor: str) -> list[tuple[int, int]]:
    return [read.slice.bounds[0] for read in reads_of(result, tensor).values()]


@pytest.mark.parametrize("tp", [4, 8])
def test_gqa_kv_heads_replicated_when_tp_exceeds_them(tp):
    result = plan(inventory(GQA), Topology(tp))
    check_plan(result, inventory(GQA))
    kv = next(s for s in result.splits if s.key == "layers.0.self_attn.kv")
    assert kv.kind == "heads_replicated"
    heads = [r * 2 // tp for r in range(tp)]
    for name in ("k_proj", "v_proj"):
        assert _rows(result, f"model.layers.0.self_attn.{name}.weight") == [
            (h * 16, h * 16 + 16) for h in heads
        ]
    per = 8 // tp
    assert _rows(result, "model.layers.0.self_attn.q_proj.weight") == [
        (r * per * 16, (r + 1) * per * 16) for r in range(tp)
    ]
    o_cols = [
        read.slice.bounds[1] for read in reads_of(result, "model.layers.0.self_attn.o_proj.weight").values()
    ]
    assert o_cols == _rows(result, "model.layers.0.self_attn.q_proj.weight")


def test_gqa_split_by_kv_heads_when_tp_fits():
    result = plan(inventory(GQA), Topology(2))
    assert _rows(result, "model.layers.0.self_attn.k_proj.weight") == [(0, 16), (16, 32)]
    assert _rows(result, "model.layers.0.self_attn.q_proj.weight") == [(0, 64), (64, 128)]
    assert {s.kind for s in result.splits} == {"even"}


def test_gqa_uneven_groups_align_on_query_groups_or_refuse():
    shape = Shape(layers=1, heads=6, kv_heads=3, head_dim=16, intermediate=64, vocab=32)
    with pytest.raises(
        SplitRefusedError,
        match=r"[NK]=96 per rank 48 is not a multiple of query group 2 heads \* head_dim 16",
    ):
        plan(inventory(shape), Topology(2), policy="refuse")
    result = plan(inventory(shape), Topology(2))
    assert _rows(result, "model.layers.0.self_attn.q_proj.weight") == [(0, 64), (64, 96)]
    assert _rows(result, "model.layers.0.self_attn.v_proj.weight") == [(0, 32), (32, 48)]
    with pytest.raises(UnsplittableError, match=r"tp=4 > kv heads=3 and 4 is not a multiple of 3"):
        plan(
            inventory(Shape(layers=1, heads=12, kv_heads=3, head_dim=16, intermediate=64, vocab=32)),
            Topology(4),
        )


def test_slot_rules_column_row_vocab_replicate():
    result = plan(inventory(Shape(layers=1, vocab=30)), Topology(2))
    reads = {read.tensor: read for read in result.ranks[1].reads}
    layer = "model.layers.0"
    expected = {
        f"{layer}.self_attn.q_proj.weight": "column",
        f"{layer}.mlp.gate_proj.weight": "column",
        f"{layer}.mlp.up_proj.weight": "column",
        f"{layer}.self_attn.o_proj.weight": "row",
        f"{layer}.mlp.down_proj.weight": "row",
        f"{layer}.self_attn.k_proj.weight": "kv_heads",
        "model.embed_tokens.weight": "vocab",
        "lm_head.weight": "vocab",
        f"{layer}.input_layernorm.weight": "replicate",
        "model.norm.weight": "replicate",
    }
    assert {name: reads[name].rule for name in expected} == expected
    assert reads[f"{layer}.mlp.down_proj.weight"].slice.bounds == ((0, 128), (128, 256))
    assert reads["lm_head.weight"].slice.bounds == ((15, 30), (0, 128))
    assert reads[f"{layer}.input_layernorm.weight"].pieces == (
        (reads[f"{layer}.input_layernorm.weight"].pieces[0][0], 256),
    )


def test_tied_embedding_serves_first_and_last_stage():
    shape = Shape(layers=2, tied=True)
    result = plan(inventory(shape), Topology(2, pp=2))
    embed = reads_of(result, "model.embed_tokens.weight")
    assert {rank: read.uses for rank, read in embed.items()} == {
        0: ("embed_tokens",),
        1: ("embed_tokens",),
        2: ("lm_head",),
        3: ("lm_head",),
    }
    assert embed[0].slice == embed[2].slice and embed[1].pieces == embed[3].pieces
    single = plan(inventory(shape), Topology(2))
    assert reads_of(single, "model.embed_tokens.weight")[0].uses == ("embed_tokens", "lm_head")


def test_pp_stages_and_ep_experts():
    shape = Shape(layers=5, heads=4, kv_heads=2, experts=3)
    inv = inventory(shape)
    result = plan(inv, Topology(2, ep=3, pp=2))
    check_plan(result, inv)
    assert result.stages == ((0, 3), (3, 5)) and result.expert_blocks == ((0, 1), (1, 2), (2, 3))
    stage_of = {r.rank: r.pp_stage for r in result.ranks}
    assert {stage_of[r] for r in reads_of(result, "model.layers.4.mlp.gate.weight")} == {1}
    assert {stage_of[r] for r in reads_of(result, "model.embed_tokens.weight")} == {0}
    assert {stage_of[r] for r in reads_of(result, "model.norm.weight")} == {1}
    expert = reads_of(result, "model.layers.0.mlp.experts.2.up_proj.weight")
    assert sorted(expert) == [4, 5]  # stage 0, ep rank 2, both tp ranks
    assert len(reads_of(result, "model.layers.0.self_attn.q_proj.weight")) == 6  # replicated over ep


def test_stacked_gguf_experts_split_along_e_then_tp():
    shape = Shape(layers=1, heads=4, kv_heads=2, head_dim=32, intermediate=64, experts=4)
    inv = inventory(shape, "gguf", qtype="Q8_0")
    result = plan(inv, Topology(2, ep=2))
    check_plan(result, inv)
    gate = reads_of(result, "blk.0.ffn_gate_exps.weight")
    assert [read.slice.bounds for read in gate.values()] == [
        ((0, 2), (0, 32), (0, 128)),
        ((0, 2), (32, 64), (0, 128)),
        ((2, 4), (0, 32), (0, 128)),
        ((2, 4), (32, 64), (0, 128)),
    ]
    assert len(gate[0].pieces) == 2  # one slab per expert


def test_manifest_input_and_json_round_trip():
    inv = inventory(Shape(layers=2), "gptq", group=32)
    manifest = Manifest(
        container=ContainerInfo(kind="safetensors"),
        model=ModelInfo(params=dict(inv.params)),
        files=[FileEntry(path="model-00000.safetensors", size=10**9, digest="sha256:" + "0" * 64)],
        tensors=list(inv.tensors),
        weights=list(inv.weights),
    )
    result = plan(manifest, Topology(2, pp=2, dp=2), max_gap=64)
    assert result == plan(inv, Topology(2, pp=2, dp=2), max_gap=64)
    again = Plan.from_json(result.to_json())
    assert again == result and again.digest() == result.digest() and result.digest().startswith("sha256:")
    assert result.rank(5) == result.ranks[1]
    with pytest.raises(TopologyError, match=r"outside 0\.\.7"):
        result.rank(8)
    with pytest.raises(InventoryError, match="no 'weights' section"):
        plan(manifest.model_copy(update={"weights": None}), Topology(1))
    assert plan((inv.weights, inv.tensors, inv.params), Topology(1)).ranks[0].bytes_assigned == sum(
        e.end - e.start for e in inv.tensors
    )


def test_orphan_tensors_are_replicated_whole():
    inv = inventory(Shape(layers=1))
    orphan = inv.tensors[0].model_copy(update={"name": "extra.table", "start": 10**7, "end": 10**7 + 40})
    result = plan(Inventory(inv.weights, (*inv.tensors, orphan), inv.params), Topology(2))
    assert [read.pieces for read in reads_of(result, "extra.table").values()] == [((10**7, 40),)] * 2


def test_topology_errors_exit_2():
    inv = inventory(Shape(layers=2))
    for topo, pattern in [(Topology(1, pp=3), r"pp=3 > 2 layers"), (Topology(1, ep=2), r"ep=2 > 0 experts")]:
        with pytest.raises(TopologyError, match=pattern) as info:
            plan(inv, topo)
        assert info.value.exit_code == 2
    with pytest.raises(TopologyError, match="policy 'even'"):
        plan(inv, Topology(1), policy="even")  # type: ignore[arg-type]
    with pytest.raises(UnsplittableError, match=r"holds 4 whole unit\(s\) of 32 \(head_dim 32"):
        plan(inv, Topology(8))


def test_inventory_errors_name_the_tensor():
    inv = inventory(Shape(layers=1))
    with pytest.raises(
        InventoryError, match=r"plane model.norm.weight \(float\) is not in the tensors section"
    ):
        plan(
            Inventory(
                inv.weights, tuple(e for e in inv.tensors if e.name != "model.norm.weight"), inv.params
            ),
            Topology(1),
        )
    short = tuple(
        e.model_copy(update={"end": e.end - 2}) if e.name == "lm_head.weight" else e for e in inv.tensors
    )
    with pytest.raises(InventoryError, match=r"lm_head.weight: F16 \[96, 128\] is 24576 bytes but its range"):
        plan(Inventory(inv.weights, short, inv.params), Topology(1))
    with pytest.raises(InventoryError, match="num_attention_heads and head_dim"):
        plan(Inventory(inv.weights, inv.tensors, {"num_hidden_layers": 1}), Topology(2))
    two = inventory(Shape(layers=2))
    params = {k: v for k, v in two.params.items() if k != "num_hidden_layers"}
    with pytest.raises(InventoryError, match="bound to layer 1 but the parameters say 1 layers"):
        plan(Inventory(two.weights, two.tensors, {**params, "llama.block_count": 1}), Topology(1))
    with pytest.raises(InventoryError, match=r"num_hidden_layers=0: expected a positive integer"):
        plan(Inventory(two.weights, two.tensors, {**params, "num_hidden_layers": 0}), Topology(1))


def test_fused_projections_refused_under_tp():
    infos = [TensorInfo("model.layers.0.self_attn.qkv_proj.weight", "F16", (96, 32))]
    inv = Inventory(infer_safetensors({}, infos), tuple(lay_out(infos)), {"num_hidden_layers": 1})
    assert plan(inv, Topology(1)).ranks[0].reads[0].rule == "replicate"
    with pytest.raises(UnsupportedSplitError, match=r"fused operator 'self_attn\.qkv_proj'") as info:
        plan(inv, Topology(2))
    assert info.value.exit_code == 5  # refused input, as for the contract gates


def test_exported_names_and_no_torch():
    assert sorted(placement.__all__) == sorted(set(placement.__all__))
    assert all(getattr(placement, name) is not None for name in placement.__all__)
    code = "import sys, shardport.placement; print(sorted({'torch', 'ray'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_weights_grouped_along_n_are_read_whole_and_never_split():
    inv = inventory(
        Shape(layers=1, heads=2, kv_heads=2, head_dim=64, intermediate=128, vocab=16), "awq", group=64
    )
    name = "model.layers.0.mlp.up_proj.weight"
    weights = []
    for w in inv.weights:
        if w.name == name:
            scales = w.contract.scales.model_copy(update={"group_axis": "N"})
            w = w.model_copy(update={"contract": w.contract.model_copy(update={"scales": scales})})
        weights.append(w)
    odd = Inventory(tuple(weights), inv.tensors, inv.params)
    whole = reads_of(plan(odd, Topology(1)), "model.layers.0.mlp.up_proj.qweight")[0]
    assert whole.index == ((0, 128), (0, 16))
    with pytest.raises(
        UnsupportedSplitError, match=r"groups along N; placement splits only weights grouped along K"
    ):
        plan(odd, Topology(2))
