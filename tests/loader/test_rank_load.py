"""The in-memory rank API: ``load_rank`` hands a rank exactly the tensors ``pull_rank`` writes.

For small llama-shaped float, GPTQ, AWQ, compressed-tensors and GGUF checkpoints at tp 2, 3 and 4
(where the planner accepts them), every rank's arrays equal, byte for byte, the tensors of the rank
file ``pull_rank`` writes, with the same names, dtypes, shapes and metadata (and that file is the one
the arrays and metadata make); ``load_ranks`` for a node returns what each ``load_rank`` returns, from
one shared read that fetches each byte once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llama_artifacts import ok, reassemble
from quantized import awq_planes, gptq_planes, pack_along_columns, quantize_minmax
from safetensors import safe_open
from safetensors.numpy import save_file

from shardport.loader import FetchedRange, RankTensors, load_rank, load_ranks, pull_rank, pull_ranks
from shardport.placement import Topology
from shardport.placement.errors import PlacementError
from shardport.registry.artifact.refs import parse_ref
from shardport.registry.output.writers import write_safetensors
from shardport.registry.session import Session
from shardport.registry.trust.resolve import resolve

HIDDEN, INTER, HEADS, VOCAB, GROUP = 384, 768, 12, 96, 32
REF = "acme/tiny:1"
SLOTS = {
    "self_attn.q_proj": (HIDDEN, HIDDEN),
    "self_attn.k_proj": (HIDDEN, HIDDEN),
    "self_attn.v_proj": (HIDDEN, HIDDEN),
    "self_attn.o_proj": (HIDDEN, HIDDEN),
    "mlp.gate_proj": (INTER, HIDDEN),
    "mlp.up_proj": (INTER, HIDDEN),
    "mlp.down_proj": (HIDDEN, INTER),
}
CT_WEIGHTS = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": GROUP}
QUANT: dict[str, dict[str, Any]] = {
    "float": {},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": GROUP, "version": "gemm"},
    "compressed-tensors": {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": CT_WEIGHTS}},
    },
}


def _planes(fmt: str, prefix: str, weight: np.ndarray) -> dict[str, np.ndarray]:
    if fmt == "float":
        return {f"{prefix}.weight": weight.astype(np.float16)}
    case = quantize_minmax(weight, GROUP)
    if fmt == "gptq":
        return gptq_planes(case, prefix)
    if fmt == "awq":
        return awq_planes(case, prefix)
    n, k = weight.shape  # compressed-tensors pack-quantized: codes [N, K] packed along K, scales [N, K/G]
    return {
        f"{prefix}.weight_packed": pack_along_columns(case["q"].T, 4),
        f"{prefix}.weight_scale": np.ascontiguousarray(case["scales"].T),
        f"{prefix}.weight_shape": np.array([n, k], dtype=np.int64),
    }


def tiny_llama(folder: Path, fmt: str) -> Path:
    """A one-layer llama (hidden 384, 12 heads) whose linears are ``fmt`` (float: F16)."""
    rng = np.random.default_rng(3)
    tensors: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.standard_normal((VOCAB, HIDDEN)).astype(np.float16),
        "lm_head.weight": rng.standard_normal((VOCAB, HIDDEN)).astype(np.float16),
        "model.norm.weight": np.ones(HIDDEN, dtype=np.float16),
    }
    for slot, shape in SLOTS.items():
        tensors.update(_planes(fmt, f"model.layers.0.{slot}", rng.standard_normal(shape).astype(np.float32)))
    for norm in ("input_layernorm", "post_attention_layernorm"):
        tensors[f"model.layers.0.{norm}.weight"] = np.ones(HIDDEN, dtype=np.float16)
    folder.mkdir(parents=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(folder / "model.safetensors"))
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 1,
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "vocab_size": VOCAB,
    }
    if QUANT[fmt]:
        config["quantization_config"] = QUANT[fmt]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def tiny_gguf(folder: Path) -> Path:
    """The same llama as a GGUF: Q4_1 linears and token embedding, F32 norms, llama metadata keys."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(4)
    folder.mkdir(parents=True)
    w = gguf.GGUFWriter(str(folder / "model.gguf"), "llama")
    w.add_block_count(1)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    q41 = gguf.GGMLQuantizationType.Q4_1
    stems = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
    linears = {
        "token_embd": (VOCAB, HIDDEN),
        **{f"blk.0.{stem}": SLOTS[s] for stem, s in zip(stems, SLOTS, strict=True)},
    }
    for name, shape in linears.items():
        data = quantize(rng.standard_normal(shape).astype(np.float32), q41)
        w.add_tensor(f"{name}.weight", data, raw_dtype=q41)
    for norm in ("blk.0.attn_norm", "blk.0.ffn_norm", "output_norm"):
        w.add_tensor(f"{norm}.weight", np.ones(HIDDEN, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return folder


def pushed(tmp_path: Path, fmt: str) -> tuple[Session, Path]:
    """``fmt``'s checkpoint pushed as :data:`REF` with small tiles (several per split)."""
    folder = tmp_path / "ck"
    if fmt == "gguf":
        tiny_gguf(folder)
    else:
        tiny_llama(folder, fmt)
    store = str(tmp_path / "store")
    ok(store, "keygen")
    ok(store, "push", folder, REF, "--tile-min", "256", "--tile-size", "8192")
    return Session.open(store), folder


def fetched_once(fetched: tuple[FetchedRange, ...]) -> int:
    """The bytes ``fetched`` covers, each counted once; fails if any byte was fetched twice."""
    assert fetched
    counts: dict[str, np.ndarray] = {}
    for r in fetched:
        end = r.offset + (r.count - 1) * r.stride + r.length
        seen = counts.setdefault(r.file, np.zeros(0, dtype=np.int64))
        if seen.size < end:
            seen = counts[r.file] = np.concatenate([seen, np.zeros(end - seen.size, dtype=np.int64)])
        for k in range(r.count):
            seen[r.offset + k * r.stride : r.offset + k * r.stride + r.length] += 1
    assert all(int(c.max()) <= 1 for c in counts.values()), "a byte was fetched twice"
    return sum(int(c.sum()) for c in counts.values())


def assert_file_is(path: Path, loaded: RankTensors) -> None:
    """The rank file holds exactly ``loaded``'s arrays (names, dtypes, shapes, bytes) and metadata."""
    with safe_open(str(path), "numpy") as f:
        assert f.metadata() == loaded.metadata
        assert list(f.keys()) == sorted(loaded.arrays)
        for piece in loaded.tensors:
            stored = f.get_tensor(piece.name)
            assert stored.dtype == piece.array.dtype and stored.shape == piece.array.shape, piece.name
            assert stored.tobytes() == piece.array.tobytes(), piece.name
            info = json.loads(f.metadata()[f"shardport.slice.{piece.name}"])
            assert info["index"] == [list(r) for r in piece.index] and info["dtype"] == piece.dtype


@pytest.mark.parametrize("fmt", ["float", "gptq", "awq", "compressed-tensors", "gguf"])
def test_load_rank_equals_the_file_pull_rank_writes(fmt: str, tmp_path: Path, home: Path) -> None:
    session, src = pushed(tmp_path, fmt)
    resolved = resolve(session, parse_ref(REF))
    refused: list[int] = []
    for tp in (2, 3, 4):
        topology = Topology(tp=tp)
        try:
            first = load_rank(session, parse_ref(REF), topology, 0)
        except PlacementError:
            refused.append(tp)
            continue
        outs = []
        for rank in range(tp):
            loaded = first if rank == 0 else load_rank(session, resolved, topology, rank)
            assert loaded.rank == rank and loaded.world_size == tp and loaded.digest == resolved.digest
            assert loaded.bytes_assigned == loaded.plan.bytes_assigned > 0
            assert not loaded.witness.unchecked and (fmt == "float" or loaded.witness.weights > 0)
            pulled = pull_rank(session, parse_ref(REF), tmp_path / f"tp{tp}", topology, rank)
            assert pulled.plan_digest == loaded.plan_digest and pulled.tensors == len(loaded.tensors)
            assert pulled.ledger["witness_cells_checked"] == loaded.witness.cells
            assert_file_is(pulled.out, loaded)
            again = tmp_path / f"again-{tp}-{rank}" / pulled.out.name
            again.parent.mkdir()
            write_safetensors(loaded.arrays, again, loaded.metadata)
            assert again.read_bytes() == pulled.out.read_bytes()  # the rank file is the loaded arrays
            plan_file = pulled.out.parent / f"rank-{rank:05d}.plan.json"
            assert json.loads(plan_file.read_text()) == loaded.plan.model_dump(mode="json")
            outs.append(pulled.out)
        reassemble(resolved.manifest, src, outs)  # the ranks' pieces put back are the source bytes
    assert refused == [], (fmt, refused)  # the planner splits each of these at tp 2, 3 and 4


def test_load_ranks_is_each_load_rank_with_one_shared_read(tmp_path: Path, home: Path) -> None:
    session, _ = pushed(tmp_path, "gptq")
    ref, topology = parse_ref(REF), Topology(tp=4)
    node = load_ranks(session, ref, topology, [1, 2, 3])
    assert [r.rank for r in node.ranks] == [1, 2, 3]
    assert fetched_once(node.ledger.fetched) == node.ledger.bytes_fetched  # each byte fetched once
    assert node.ledger.bytes_assigned == sum(r.bytes_assigned for r in node.ranks)
    assert node.ledger.bytes_fetched <= 1.05 * node.ledger.bytes_assigned
    alone_fetched = 0
    for shared in node.ranks:
        alone = load_rank(session, ref, topology, shared.rank)
        assert node.rank(shared.rank) is shared and shared.ledger is node.ledger
        assert shared.metadata == alone.metadata and shared.plan_digest == alone.plan_digest
        assert shared.bytes_assigned == alone.bytes_assigned and shared.witness == alone.witness
        assert [t.name for t in shared.tensors] == [t.name for t in alone.tensors]
        for a, b in zip(shared.tensors, alone.tensors, strict=True):
            assert a.array.dtype == b.array.dtype and a.array.shape == b.array.shape
            assert a.array.tobytes() == b.array.tobytes(), a.name
        alone_fetched += alone.ledger.bytes_fetched
    assert node.ledger.bytes_fetched <= alone_fetched
    # the node's files are the node's arrays
    pulled = pull_ranks(session, ref, tmp_path / "node", topology, [1, 2, 3])
    assert pulled.ledger["bytes_fetched"] == node.ledger.bytes_fetched
    for result, shared in zip(pulled.ranks, node.ranks, strict=True):
        assert_file_is(result.out, shared)
