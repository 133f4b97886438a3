"""A rank keeps only what it runs: after preparation the loaded planes no operator uses are released.

In-process ranks (:class:`~shardport.deploy.rank.Rank`, no Ray): the tiny GGUF mix (Q4_0/Q4_1 repacked
by int4pack, Q8_0/Q4_K/Q6_K and the tied Q8_0 embedding run in place by the GGUF direct kernel, F32
norms), and a ~72 MB Q4_0 checkpoint where the released bytes show in the process's resident memory.
The ranks run bfloat16 operators (int4pack's fast path, so Q4_0/Q4_1 are repacked and their planes
released); in float32 the GGUF direct kernel runs every GGUF plane in place (int4pack's slow path comes
after it), which one test asserts.
"""

from __future__ import annotations

import gc
import os
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bringup_artifacts import gguf_tiny
from llama_artifacts import ok

from shardport.deploy.rank import Rank, RankSpec, _rss
from shardport.deploy.rank_ops import policy_of
from shardport.deploy.release import PlaneRelease, reachable_spans
from shardport.deploy.up_l5 import level5
from shardport.registry.artifact.refs import parse_ref
from shardport.registry.session import Session
from shardport.registry.trust.resolve import resolve

PROMPT = (1, 5, 300, 7)
MB = 1024 * 1024
IN_PLACE = {"cpu.gguf-direct", "cpu.int8pack", "reference"}
"""Kernels whose prepared operator reads the loaded plane itself (int8pack: where the bytes are the codes)."""


def _push(tmp: Path, folder: Path, ref: str) -> tuple[str, str]:
    store = str(tmp / "store")
    ok(store, "keygen")
    ok(store, "push", folder, ref)
    resolved = resolve(Session.open(store), parse_ref(ref))
    return store, f"{resolved.ref.name}@{resolved.digest}"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The tiny GGUF mix pushed to a local store: (store, pinned reference)."""
    tmp = tmp_path_factory.mktemp("release")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHARDPORT_HOME", str(tmp / "home"))
        yield _push(tmp, gguf_tiny(tmp / "gguf"), "llama/gguf:v1")


def _spec(
    pushed: tuple[str, str],
    *,
    tp: int = 1,
    ladder: str = "sample",
    keep: bool = False,
    dtype: str = "bfloat16",
) -> RankSpec:
    store, ref = pushed
    return RankSpec(
        ref=ref, store=store, home=os.environ["SHARDPORT_HOME"], s3_endpoint=None, tp=tp, ep=1, pp=1,
        rank=0, fallback="warn", prompt=PROMPT, steps=2, threads=1, ladder=ladder, keep_planes=keep,
        activations=dtype,
    )  # fmt: skip


def _prepared(spec: RankSpec) -> Rank:
    r = Rank(spec)
    summary = r.prepare()
    assert "failure" not in summary, summary
    return r


def _planes(r: Rank) -> list[dict[str, Any]]:
    """Each loaded tensor as plain data and a weak reference to the array owning its memory."""
    out = []
    for t in r.loaded.tensors:
        owner = t.array
        while isinstance(owner.base, np.ndarray):
            owner = owner.base
        floats = r.ops.floats.get(t.weight or "")
        viewed = floats is not None and np.shares_memory(floats.numpy(), t.array)
        out.append(
            {
                "tensor": t.name,
                "weight": t.weight,
                "bytes": int(t.array.nbytes),
                "owner": weakref.ref(owner),
                "float_view": viewed,
            }
        )
    return out


def _kernels(r: Rank) -> dict[str, set[str]]:
    return {name: {o.kernel.split("@")[0] for o in phases.values()} for name, phases in r.ops.ops.items()}


def test_the_planes_operators_run_in_place_are_kept_and_repacked_ones_released(tiny: tuple[str, str]) -> None:
    r = _prepared(_spec(tiny, keep=True))  # the planes kept, released here by hand
    planes, kernels = _planes(r), _kernels(r)
    assert {"cpu.int4pack", "cpu.gguf-direct"} <= set().union(*kernels.values())
    release = PlaneRelease(r.loaded, r.ops)
    r.loaded = release.metadata
    released = release.measure()
    gc.collect()
    alive = {p["tensor"]: p["owner"]() is not None for p in planes}
    for p in planes:
        used = kernels.get(p["weight"], set())
        expected = bool(used & IN_PLACE) or p["float_view"]
        assert alive[p["tensor"]] == expected, (p["tensor"], used)
    repacked = [p["tensor"] for p in planes if kernels.get(p["weight"]) == {"cpu.int4pack"}]
    direct = [p["tensor"] for p in planes if kernels.get(p["weight"]) == {"cpu.gguf-direct"}]
    assert repacked and direct and "token_embd.weight" in direct  # the tied Q8_0 embedding: in place
    kept = sum(p["bytes"] for p in planes if alive[p["tensor"]])
    assert released.retained == released.shared == kept and released.unused == 0
    assert released.released == sum(p["bytes"] for p in planes) - kept > 0
    assert released.loaded == r.ledger["codes_and_qparams"]
    # the rank still runs on what it kept: prefill, decode and the KV-cache check
    result = r.run(None)
    assert "failure" not in result, result
    cache = result["cache"]
    assert cache["steps"] >= 1 and cache["max_abs_diff"] <= cache["tolerance"] and len(result["tokens"]) == 2
    assert result["witness"]["witness_weights_checked"] > 0  # metadata the report reads is kept


def test_in_float32_every_gguf_plane_runs_in_place_and_nothing_is_repacked(tiny: tuple[str, str]) -> None:
    r = _prepared(_spec(tiny, dtype="float32", keep=True))
    kernels = _kernels(r)
    assert set().union(*kernels.values()) == {"cpu.gguf-direct"}  # Q4_0 and Q4_1 too: no int4pack
    assert {t.transformation for t in r.ops.traces} == {"none"}
    planes = _planes(r)
    release = PlaneRelease(r.loaded, r.ops)
    r.loaded = release.metadata
    released = release.measure()
    gc.collect()
    quantized = [p for p in planes if p["weight"] in kernels]
    assert quantized and all(p["owner"]() is not None for p in quantized)  # every block plane kept
    assert released.unused == 0 and released.shared >= sum(p["bytes"] for p in quantized)
    result = r.run(None)
    assert "failure" not in result, result


def test_a_rank_releases_after_its_ladder_and_its_ledger_says_so(tiny: tuple[str, str]) -> None:
    r = _prepared(_spec(tiny, tp=2))
    assert r.loaded.tensors == () and r.ops.ladders and "release" in r.timeline
    led = r.ledger
    assert led["codes_retained_unused"] == 0 and led["codes_retained"] == led["codes_shared"] > 0
    assert led["codes_released"] == led["codes_and_qparams"] - led["codes_retained"] > 0
    # nothing the operators keep points into a released plane: their spans are the kept planes' or their own
    assert reachable_spans(r.ops)


def test_level5_fails_a_rank_that_keeps_planes_no_operator_uses(tiny: tuple[str, str]) -> None:
    kept = _prepared(_spec(tiny, ladder="off", keep=True))
    clean = _prepared(_spec(tiny, ladder="off"))

    def report(r: Rank) -> dict[str, Any]:
        ledger = {**r.ledger, "host_resident_growth": 0}
        return {"rank": 0, "dispatch": [t.model_dump(mode="json") for t in r.ops.traces],
                "full_dequant_persistent": [], "ledger": ledger}  # fmt: skip

    policy = policy_of("warn")
    assert kept.ledger["codes_retained_unused"] > 0  # measured: the planes are still alive
    bad, good = level5([report(kept)], policy), level5([report(clean)], policy)
    assert good["passed"] and good["resident"]["0"]["passed"]
    assert not bad["passed"] and not bad["resident"]["0"]["passed"] and not bad["unexpected_kernels"]
    assert bad["resident"]["0"]["unused"] == kept.ledger["codes_retained_unused"]
    # a ledger that does not say what it retained counts every loaded byte as kept
    older = report(clean)
    older["ledger"] = {
        k: v for k, v in older["ledger"].items() if not k.startswith("codes_") or k == "codes_and_qparams"
    }
    assert not level5([older], policy)["passed"]


def test_what_a_kept_object_reaches_through_tensors_and_closures_is_shared(tiny: tuple[str, str]) -> None:
    import torch

    r = _prepared(_spec(tiny, ladder="off", keep=True))
    a, b, c = sorted((t for t in r.loaded.tensors if t.array.nbytes > 4096), key=lambda t: t.name)[:3]
    view = b.array.reshape(-1)[16:32]
    keep = {
        "tensor": torch.from_numpy(a.array.reshape(-1)[8:64]),  # a torch view of a plane (int8pack's codes)
        "closure": lambda: view.sum(),  # a plane view captured by a function
        "copy": c.array.copy(),  # a copy: the plane itself is not needed
    }
    sizes = (a.array.nbytes, b.array.nbytes)
    release = PlaneRelease(r.loaded, keep)
    del a, b, c
    r.loaded, r.ops = release.metadata, None  # only ``keep`` is left holding planes
    kept = release.measure()
    assert kept.shared == kept.retained == sum(sizes) and kept.unused == 0


# -- resident memory -------------------------------------------------------------------------------


def _q4_blocks(rng: np.random.Generator, rows: int, cols: int, qtype: str) -> np.ndarray:
    """Random GGUF blocks: random code bytes, small positive f16 scales (all the load path sees)."""
    per, size, scale = {"Q4_0": (32, 18, 0.005), "Q8_0": (32, 34, 0.0003)}[qtype]
    nb = cols // per
    raw = rng.integers(0, 256, size=(rows, nb, size), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.5, size=(rows, nb)) * scale).astype(np.float16)
    raw[:, :, 0:2] = d.view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, nb * size)


def gguf_q4(
    folder: Path, *, layers: int = 12, hidden: int = 1024, inter: int = 2816, vocab: int = 512
) -> Path:
    """A llama GGUF of Q4_0 linears (~6.3 MB a layer at the defaults), a tied Q8_0 embedding, F32 norms."""
    import gguf

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    heads, kv_heads = 16, 4
    head_dim = hidden // heads
    w = gguf.GGUFWriter(str(folder / "model.gguf"), "llama")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(inter)
    w.add_rope_dimension_count(head_dim)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    q4, q8 = gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q8_0
    w.add_tensor("token_embd.weight", _q4_blocks(rng, vocab, hidden, "Q8_0"), raw_dtype=q8)
    kv = kv_heads * head_dim
    shapes = {"attn_q": (hidden, hidden), "attn_k": (kv, hidden), "attn_v": (kv, hidden),
              "attn_output": (hidden, hidden), "ffn_gate": (inter, hidden), "ffn_up": (inter, hidden),
              "ffn_down": (hidden, inter)}  # fmt: skip
    for layer in range(layers):
        w.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        for stem, (n, k) in shapes.items():
            w.add_tensor(f"blk.{layer}.{stem}.weight", _q4_blocks(rng, n, k, "Q4_0"), raw_dtype=q4)
        w.add_tensor(f"blk.{layer}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return folder


def test_a_plane_used_in_place_never_offsets_a_kept_second_copy() -> None:
    """A buffer used through ``torch.frombuffer`` (its array gone) and another kept unused: each counts
    by its own state, so the second copy shows as unused and the used one is not called released."""
    import dataclasses

    import torch

    @dataclasses.dataclass(frozen=True)
    class Loaded:
        array: np.ndarray

    @dataclasses.dataclass(frozen=True)
    class Tensors:
        tensors: tuple[Loaded, ...]
        bytes_assigned: int

    n = 1 << 20
    memory = bytearray(n)
    used, spare = np.frombuffer(memory, dtype=np.uint8), np.ones(n, dtype=np.uint8)
    keep = {"op": torch.frombuffer(memory, dtype=torch.uint8)}  # an operator reading plane A in place
    stray = [spare]  # plane B held by something the rank does not keep: a second copy
    release = PlaneRelease(Tensors((Loaded(used), Loaded(spare)), 2 * n), keep)  # type: ignore[arg-type]
    del used, spare
    ledger = release.measure().ledger()
    assert ledger == {
        "codes_retained": 2 * n,
        "codes_shared": n,
        "codes_released": 0,
        "codes_retained_unused": n,
    }, ledger
    assert stray and keep


@pytest.mark.slow
def test_released_planes_leave_the_resident_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDPORT_HOME", str(tmp_path / "home"))
    pushed = _push(tmp_path, gguf_q4(tmp_path / "gguf"), "llama/q4:v1")
    r = _prepared(_spec(pushed, ladder="off", keep=True))
    loaded = r.ledger["codes_and_qparams"]
    assert loaded > 64 * MB
    before = _rss()
    release = PlaneRelease(r.loaded, r.ops)
    r.loaded = release.metadata
    released = release.measure()
    after = _rss()
    assert released.unused == 0 and released.released > 0.9 * loaded  # every Q4_0 linear repacked
    dropped = before - after
    assert abs(dropped - released.released) <= 0.1 * released.released + 4 * MB, (dropped, released)
