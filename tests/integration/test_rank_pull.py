"""Per-rank pulls end to end: push (tile index) → plan → verified range reads → rank-local files.

For a llama-shaped GPTQ checkpoint and a GGUF Q4_1 one, at tp 2, 4 and 8 (3 with aligned splits):
every rank reads at most 1.05 times its assigned bytes, the ranks' slices put back together reproduce every
tensor byte for byte (so the reference decode of every weight exactly), a flipped byte in a tile a
rank reads is caught by that rank, and one in a tile nobody reads is never touched.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from quantized import gptq_planes, quantize_minmax
from safetensors import safe_open
from safetensors.numpy import save_file

from shardport.cli import main
from shardport.registry.contracts import decode_weight
from shardport.registry.manifest import Manifest
from shardport.registry.session import Session
from shardport.registry.store import blob_key

HIDDEN, INTER, LAYERS, HEADS = 1024, 2048, 2, 8
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "checkpoint_format": "gptq"}


def cli(store: str, *args: str | Path) -> tuple[int, dict[str, Any]]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["--store", store, "--json", *map(str, args)])
    return code, json.loads(buf.getvalue())


def ok(store: str, *args: str | Path) -> dict[str, Any]:
    code, out = cli(store, *args)
    assert code == 0, out
    return out


def gptq_llama(folder: Path) -> Path:
    rng = np.random.default_rng(0)
    tensors: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.standard_normal((256, HIDDEN)).astype(np.float16),
        "lm_head.weight": rng.standard_normal((256, HIDDEN)).astype(np.float16),
        "model.norm.weight": np.ones(HIDDEN, dtype=np.float16),
    }
    shapes = {
        "self_attn.q_proj": (HIDDEN, HIDDEN),
        "self_attn.k_proj": (HIDDEN, HIDDEN),
        "self_attn.v_proj": (HIDDEN, HIDDEN),
        "self_attn.o_proj": (HIDDEN, HIDDEN),
        "mlp.gate_proj": (INTER, HIDDEN),
        "mlp.up_proj": (INTER, HIDDEN),
        "mlp.down_proj": (HIDDEN, INTER),
    }
    for layer in range(LAYERS):
        for slot, (n, k) in shapes.items():
            case = quantize_minmax(rng.standard_normal((n, k)).astype(np.float32), 128)
            tensors.update(gptq_planes(case, f"model.layers.{layer}.{slot}"))
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"model.layers.{layer}.{norm}.weight"] = np.ones(HIDDEN, dtype=np.float16)
    folder.mkdir(parents=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "num_hidden_layers": LAYERS,
                "hidden_size": HIDDEN,
                "intermediate_size": INTER,
                "num_attention_heads": HEADS,
                "num_key_value_heads": HEADS,
                "vocab_size": 256,
                "quantization_config": GPTQ,
            }
        )
    )
    return folder


def gguf_llama(folder: Path) -> Path:
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(1)
    folder.mkdir(parents=True)
    w = gguf.GGUFWriter(str(folder / "model.gguf"), "llama")
    w.add_block_count(LAYERS)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    q41 = gguf.GGMLQuantizationType.Q4_1
    shapes = {
        "attn_q": (HIDDEN, HIDDEN),
        "attn_k": (HIDDEN, HIDDEN),
        "attn_v": (HIDDEN, HIDDEN),
        "attn_output": (HIDDEN, HIDDEN),
        "ffn_gate": (INTER, HIDDEN),
        "ffn_up": (INTER, HIDDEN),
        "ffn_down": (HIDDEN, INTER),
    }
    w.add_tensor(
        "token_embd.weight",
        quantize(rng.standard_normal((256, HIDDEN)).astype(np.float32), q41),
        raw_dtype=q41,
    )
    for layer in range(LAYERS):
        for stem, shape in shapes.items():
            data = quantize(rng.standard_normal(shape).astype(np.float32), q41)
            w.add_tensor(f"blk.{layer}.{stem}.weight", data, raw_dtype=q41)
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{layer}.{norm}.weight", np.ones(HIDDEN, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    w.add_tensor(
        "output.weight", quantize(rng.standard_normal((256, HIDDEN)).astype(np.float32), q41), raw_dtype=q41
    )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return folder


def reassemble(manifest: Manifest, src: Path, outs: list[Path]) -> None:
    """Put every rank's slices back; each tensor must come out byte-identical to the source."""
    entries = {e.name: e for e in manifest.tensors or []}
    images = {n: np.zeros(e.end - e.start, dtype=np.uint8) for n, e in entries.items()}
    covered = {n: np.zeros(e.end - e.start, dtype=bool) for n, e in entries.items()}
    for out in outs:
        with safe_open(str(out), "numpy") as f:
            meta = f.metadata()
            for name in f.keys():
                info = json.loads(meta[f"shardport.slice.{name}"])
                tensor = name.split("@")[0]
                e = entries[tensor]
                data = f.get_tensor(name).view(np.uint8).reshape(-1)
                rows = e.shape[0] if len(e.shape) > 1 else 1
                row_bytes = (e.end - e.start) // rows
                index = info["index"]
                if len(e.shape) > 1:
                    (r0, r1), (c0, c1) = index[0], index[1]
                    block = data.reshape(r1 - r0, -1)
                    view = images[tensor].reshape(rows, row_bytes)
                    cov = covered[tensor].reshape(rows, row_bytes)
                    first = c0 * row_bytes // e.shape[1]  # GGUF: elements -> whole blocks of bytes
                    cols = slice(first, first + block.shape[1])
                    view[r0:r1, cols] = block
                    cov[r0:r1, cols] = True
                else:
                    (c0, c1) = index[0]
                    per = (e.end - e.start) // e.shape[0]
                    images[tensor][c0 * per : c1 * per] = data
                    covered[tensor][c0 * per : c1 * per] = True
    for name, e in entries.items():
        source = np.fromfile(src / e.file, dtype=np.uint8, count=e.end - e.start, offset=e.start)
        assert covered[name].all(), name
        assert np.array_equal(images[name], source), name


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gptq", "gguf"])
def test_rank_pulls_local(kind: str, tmp_path: Path, home: Path) -> None:
    store = str(tmp_path / "store")
    src = gptq_llama(tmp_path / "ck") if kind == "gptq" else gguf_llama(tmp_path / "ck")
    ok(store, "keygen")
    digest = ok(store, "push", src, "acme/llama:q4", "--tile-min", "256", "--tile-size", "16384")["digest"]
    manifest = Manifest.from_bytes(Session.open(store).store.read_blob(digest))
    for tp in (2, 4, 8, 3):
        outs, checked = [], 0
        for rank in range(tp):
            res = ok(
                store, "pull", "acme/llama:q4", tmp_path / f"tp{tp}", "--tp", str(tp), "--rank", str(rank)
            )
            assert res["digest"] == digest
            if tp != 3:
                assert res["read_amplification"] <= 1.05, (tp, rank, res["read_amplification"])
            assert res["ledger"]["peak_staging_bytes"] <= res["ledger"]["staging_bound_bytes"]
            checked += res["ledger"]["witness_rows_checked"]
            outs.append(Path(res["out"]))
        reassemble(manifest, src, outs)
        witness_rows = sum(
            len(w.witness.rows) for w in manifest.weights or [] if w.witness and len(w.shape.extents) == 2
        )
        assert checked >= witness_rows > 0  # every witness row re-decoded by at least one rank
    # the reassembled bytes are the source bytes, so every weight's reference decode is exact
    weights = manifest.weights or []
    assert any(w.contract.family in ("affine_int", "gguf_block") for w in weights)
    w = next(w for w in weights if w.contract.family != "float")
    entries = {e.name: e for e in manifest.tensors or []}
    planes = {
        p.tensor: np.fromfile(
            src / entries[p.tensor].file,
            dtype=np.uint8,
            count=entries[p.tensor].end - entries[p.tensor].start,
            offset=entries[p.tensor].start,
        )
        for p in w.planes
    }
    assert decode_weight(w, planes).shape == tuple(w.shape.extents)


def test_flipped_tile_detected_untouched_tile_ignored(tmp_path: Path, home: Path) -> None:
    store = str(tmp_path / "store")
    src = gptq_llama(tmp_path / "ck")
    ok(store, "keygen")
    digest = ok(store, "push", src, "acme/llama:q4", "--tile-min", "256", "--tile-size", "16384")["digest"]
    session = Session.open(store)
    manifest = Manifest.from_bytes(session.store.read_blob(digest))
    entries = {e.name: e for e in manifest.tensors or []}
    blob = blob_key(manifest.files[[f.path for f in manifest.files].index("model.safetensors")].digest)
    # rank 0 of tp 2 reads the first half of q_proj's output rows (a column split of the packed plane)
    q = entries["model.layers.0.self_attn.q_proj.qweight"]
    row_bytes = (q.end - q.start) // q.shape[0]
    inside = q.start + 10 * row_bytes + 16  # column 4 of row 10: rank 0's half
    outside = q.start + 10 * row_bytes + row_bytes - 16  # last columns of row 10: rank 1's half
    raw = bytearray(session.store.read(blob))
    raw[outside] ^= 0x40
    session.store.put(blob, bytes(raw))
    res = ok(store, "pull", "acme/llama:q4", tmp_path / "r0", "--tp", "2", "--rank", "0")
    fetched = res["ledger"]["fetched"]
    assert not any(
        o + k * stride <= outside < o + k * stride + n
        for f, o, n, stride, count in fetched
        if f == "model.safetensors"
        for k in range(count)
    )
    code, out = cli(store, "pull", "acme/llama:q4", tmp_path / "r1", "--tp", "2", "--rank", "1")
    assert code == 1 and out["error"]["type"] == "TileDigestMismatchError", out
    assert "q_proj.qweight" in out["error"]["message"]
    raw[inside] ^= 0x40
    session.store.put(blob, bytes(raw))
    code, out = cli(store, "pull", "acme/llama:q4", tmp_path / "r0b", "--tp", "2", "--rank", "0")
    assert code == 1 and out["error"]["type"] == "TileDigestMismatchError", out
    assert not (tmp_path / "r0b" / "rank-00000-of-00002.safetensors").exists()


@pytest.mark.slow
@pytest.mark.s3
def test_rank_pulls_seaweedfs(seaweed_store_url: str, tmp_path: Path, home: Path) -> None:
    store = seaweed_store_url
    src = gptq_llama(tmp_path / "ck")
    ok(store, "keygen")
    digest = ok(store, "push", src, "acme/llama:q4", "--tile-min", "256", "--tile-size", "16384")["digest"]
    manifest = Manifest.from_bytes(Session.open(store).store.read_blob(digest))
    for tp in (2, 4, 8):
        outs = []
        for rank in range(tp):
            res = ok(
                store, "pull", "acme/llama:q4", tmp_path / f"tp{tp}", "--tp", str(tp), "--rank", str(rank)
            )
            assert res["read_amplification"] <= 1.05, (tp, rank, res["read_amplification"])
            assert res["requests"] > 0
            outs.append(Path(res["out"]))
        reassemble(manifest, src, outs)


def test_rank_load_refuses_bytes_contradicting_the_witness(tmp_path: Path, home: Path) -> None:
    from shardport.provenance import dsse
    from shardport.provenance.statement import PAYLOAD_TYPE
    from shardport.registry.signatures import SIGNATURE_ARTIFACT, attach, manifest_statement
    from shardport.registry.tagging import move_tag

    store = str(tmp_path / "store")
    src = gptq_llama(tmp_path / "ck")
    ok(store, "keygen")
    digest = ok(store, "push", src, "acme/llama:q4", "--tile-min", "256", "--tile-size", "16384")["digest"]
    session = Session.open(store)
    doc = json.loads(session.store.read_blob(digest))
    w = next(w for w in doc["weights"] if w["name"] == "model.layers.0.self_attn.q_proj.weight")
    w["witness"]["rows"] = [r + 1 for r in w["witness"]["rows"]]  # the witness of other rows
    forged = Manifest.model_validate(doc)
    new = session.store.put_blob(forged.to_bytes())
    assert session.key is not None
    env = dsse.sign(PAYLOAD_TYPE, manifest_statement("acme/llama", new).to_bytes(), [session.key])
    attach(session, "acme/llama", new, session.store.put_blob(env.to_bytes()), SIGNATURE_ARTIFACT)
    move_tag(session, "acme/llama", "q4", new)
    failures = []
    for rank in range(2):
        code, out = cli(store, "pull", "acme/llama:q4", tmp_path / "r", "--tp", "2", "--rank", str(rank))
        if code != 0:
            assert out["error"]["type"] == "WitnessMismatchError", out
            assert not (tmp_path / "r" / f"rank-{rank:05d}-of-00002.safetensors").exists()
            failures.append(rank)
    assert failures
