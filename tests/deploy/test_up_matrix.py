"""The bring-up acceptance matrix: formats x topologies x stores, each cell proven the same way.

Cells (each checkpoint pushed once per store for the module; several ranks run as Ray actors, a
single rank in this process — the same rank code, without an actor's start-up):

========================  ==================================  ==================================
checkpoint (builder)      cells here                          elsewhere (tests/deploy/test_up.py)
========================  ==================================  ==================================
GGUF mix, hidden 576      tp 1, tp 4                          -
GGUF mix, hidden 192      SeaweedFS tp 3                      tp 3, tp 2 (tampered tile)
GPTQ g32, hidden 576      tp 1; SeaweedFS tp 4 (tiled)        -
GPTQ g64, hidden 192      -                                   tp 2, pp 2, SeaweedFS tp 2
GPTQ g128, hidden 576     tp 2 (tails on cpu.int4-direct);     -
                          tp 3, 4 refused by design
AWQ g64, hidden 576       tp 2, tp 3                          -
compressed-tensors g64    tp 2                                -
Mixtral GPTQ (4 experts)  ep 2 x tp 2                         ep 2
========================  ==================================  ==================================

Shapes (:data:`bringup_artifacts.WIDE`: hidden 576, 12 heads of 48 over 6 kv heads, intermediate 1536,
vocab 1001) and which splits land inside a quantization group, so the planner moves the split points
to group boundaries (``aligned``) instead of cutting evenly:

- tp 4, GGUF and GPTQ g32: attention K = 576 even would be 144 per rank, inside a Q4_1/Q4_0 block or a
  32-group (144 = 4.5 x 32): split [192, 96, 192, 96] (query groups of 2 heads, 96 = 3 blocks). GGUF
  ``ffn_down`` (Q4_K/Q6_K, K = 1536): 384 per rank is inside a 256-superblock: [512, 256, 512, 256].
- tp 2, GPTQ g128, AWQ g64, compressed-tensors g64: 288 per rank is inside a group (2.25 x 128,
  4.5 x 64): [384, 192]. GPTQ g128 also has a partial last group (576 = 4.5 x 128): rank 1's
  ``o_proj`` slice is one whole group and the 64-column tail.
- tp 3 (AWQ; any group that divides 96): 192 per rank, even (whole groups): no tp 3 split of hidden 576
  crosses a group the planner can still honour. The vocabulary (1001) is uneven at every tp.
- Hidden 192 (3 kv heads): Mixtral at tp 2, attention [128, 64] (96 would cut a 2-head query group);
  GGUF at tp 3, [64, 64, 64], ``ffn_down`` (Q4_K/Q6_K, K = 768) three whole superblocks.

Refused by design (asserted): GPTQ g128 at tp 3 and 4 (576 holds one whole query-group-and-group unit
of 384 and a partial one: three or four ranks cannot each get one). A GPTQ g128 weight whose local K
holds the partial group is not one ``cpu.int4pack`` takes (K a multiple of the group); ``cpu.int4-direct``
runs it from the planes as loaded, so no fallback is needed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from bringup_artifacts import gguf_mix, gguf_tiny, gptq_mixtral, quantized_llama
from llama_artifacts import ok

from shardport.deploy.errors import GraphLayoutError
from shardport.deploy.ray_ranks import run_in_process
from shardport.deploy.up import UpRequest, UpResult, bring_up, ray_launcher
from shardport.registry.artifact.refs import parse_ref
from shardport.registry.evidence import read_evidence
from shardport.registry.session import Session
from shardport.registry.store.s3 import S3_PROFILE
from shardport.registry.trust.resolve import resolve

#: Rows a CPU bring-up may leave ``not applicable`` (each says why): no device memory; a tp > 1 slice no
#: pin covers; kernels that run the stored codes in place compare none.
NOT_APPLICABLE_HERE = {
    "device memory within the ledger",
    "expected kernel on every weight of every rank",
    "codes preserved by every layout",
    "E_quant vs float reference (push --reference)",  # pushed without --reference
}

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PROMPT = (1, 5, 300, 7, 1000)
TINY_PROMPT = (1, 5, 300, 7, 396)
"""For the hidden-192 checkpoints (vocab 397)."""
INT4 = "cpu.int4pack@1"
DIRECT = "cpu.gguf-direct@1"
DIRECT4 = "cpu.int4-direct@1"
GGUF_KERNELS = {  # float32 runs: int4pack's slow path comes after the direct kernel for Q4_0/Q4_1
    "attn_q": DIRECT,  # Q4_0
    "attn_k": DIRECT,  # Q4_0
    "attn_output": DIRECT,  # Q4_1
    "ffn_gate": DIRECT,  # Q4_0
    "attn_v": DIRECT,  # Q8_0
    "ffn_up": DIRECT,  # Q8_0
    "ffn_down": DIRECT,  # Q4_K (layer 0), Q6_K (layer 1)
    "token_embd": DIRECT,  # tied Q8_0: embedding and head
}
ALLOWED = {"none", "repack", "conversion"}
"""Transformation classes the default policy (``--fallback warn``) lets through without a warning."""

Pusher = Callable[..., str]
PACKED = ("--kernels-preferred", "cpu.int4pack")
"""Push options naming int4pack first: its (slow) float32 path is then tried before the direct kernel."""
"""``push(builder name, ref, tiled=False) -> store``: a module fixture's once-only push."""
Kernels = Callable[[str], str]
"""The expected kernel id of a dispatch row's weight (``name[N=a:b, K=c:d]``)."""


def slot(weight: str) -> str:
    """``blk.0.attn_q.weight[...]`` -> ``attn_q``; ``model.layers.0.mlp.up_proj.weight`` -> ``up_proj``."""
    return weight.split("[")[0].removesuffix(".weight").rsplit(".", 1)[-1]


def k_range(weight: str) -> tuple[int, int]:
    found = re.search(r"K=(\d+):(\d+)", weight)
    assert found, weight
    return int(found[1]), int(found[2])


def by_slot(table: dict[str, str]) -> Kernels:
    return lambda weight: table[slot(weight)]


def every(kernel: str) -> Kernels:
    return lambda weight: kernel


@pytest.fixture(scope="module")
def matrix_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One ``$SHARDPORT_HOME`` (one signing key) for the module's stores and bring-ups."""
    root = tmp_path_factory.mktemp("matrix")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHARDPORT_HOME", str(root / "home"))
        mp.delenv("SHARDPORT_STORE", raising=False)
        ok(str(root / "store"), "keygen")
        yield root


@pytest.fixture(scope="module")
def pushed(matrix_home: Path) -> Pusher:
    """Push a checkpoint of the matrix once into the module's local store; returns the store."""
    return _pusher(str(matrix_home / "store"), matrix_home / "src")


@pytest.fixture(scope="module")
def pushed_s3(matrix_home: Path, seaweed_server: Any) -> Iterator[Pusher]:
    """The same, into one SeaweedFS bucket (the AWS_* variables stay set for the module)."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in seaweed_server.env().items():
            mp.setenv(key, value)
        yield _pusher(f"s3://{seaweed_server.new_bucket()}/registry", matrix_home / "src-s3")


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "gguf": gguf_mix,
    "gptq32": lambda p: quantized_llama(p, "gptq", 32),
    "gptq128": lambda p: quantized_llama(p, "gptq", 128),
    "awq": lambda p: quantized_llama(p, "awq", 64),
    "ct": lambda p: quantized_llama(p, "compressed-tensors", 64),
    "moe": gptq_mixtral,
    "gguf-tiny": gguf_tiny,
}


def _pusher(store: str, sources: Path) -> Pusher:
    done: set[str] = set()
    built: dict[str, Path] = {}

    def push(name: str, ref: str, *options: str, tiled: bool = False) -> str:
        """``ref`` pushed with ``options`` (``tiled``: and converted to ``NAME:tiled``, contiguous tiles);
        the store."""
        if ref not in done:
            if name not in built:
                built[name] = BUILDERS[name](sources / name)
            ok(store, "push", built[name], ref, *options)
            done.add(ref)
        if tiled and f"{ref}+tiled" not in done:
            ok(store, "convert", ref, f"{ref.split(':')[0]}:tiled", "--layout", "tiled")
            done.add(f"{ref}+tiled")
        return store

    return push


def up(
    store: str,
    ref: str,
    *,
    tp: int = 1,
    ep: int = 1,
    fallback: Literal["forbid", "warn", "allow"] = "warn",
    tokens: tuple[int, ...] = PROMPT,
) -> UpResult:
    """Bring ``ref`` up; one rank runs in this process (the rank code Ray actors run, without the actor
    start-up: the suite's time goes to the cells that need several ranks)."""
    request = UpRequest(ref=ref, tokens=tokens, steps=3, tp=tp, ep=ep, store=store, fallback=fallback)
    launcher = run_in_process if tp * ep == 1 else ray_launcher(None)
    return bring_up(Session.open(store), request, launcher=launcher)


def assert_cell(
    store: str, ref: str, result: UpResult, kernels: Kernels, *, world: int, allowed: set[str] = ALLOWED
) -> list[dict[str, Any]]:
    """L0-L5 all passed; the expected kernel on every weight of every rank, no fallback beyond the
    policy; the evidence stored, naming this topology, and ``registry verify REF`` passes. Returns the
    dispatch rows."""
    p = result.predicate
    failed = [row for row in p["parity"] if row["status"] == "fail" or row["passed"] is False]
    assert not failed, failed
    idle = {row["name"] for row in p["parity"] if row["status"] != "pass"}
    assert idle <= NOT_APPLICABLE_HERE, idle
    assert {row["level"] for row in p["parity"]} == {"L0", "L1", "L2", "L3", "L4", "L5"}
    assert p["passed"] and p["parity_l4"]["reference_tokens"] == list(result.generated)
    dispatch = p["dispatch"]
    assert {row["rank"] for row in dispatch} == set(range(world))
    wrong = [(r["rank"], r["weight"], r["kernel"]) for r in dispatch if r["kernel"] != kernels(r["weight"])]
    assert not wrong, wrong
    l5 = p["l5"]
    assert not l5["unexpected_kernels"] and not l5["forbidden_fallbacks"], l5
    assert set(l5["fallbacks"]) <= allowed, l5["fallbacks"]
    name = ref.split(":")[0]
    stored = read_evidence(Session.open(store), name, result.digest)
    assert not stored.failures, stored.failures
    mine = [e for e in stored.verified if e.digest == result.evidence]
    assert len(mine) == 1 and mine[0].predicate["passed"], [e.digest for e in stored.verified]
    assert mine[0].predicate["topology"] == p["topology"]
    assert ok(store, "verify", ref)["evidence_verified"] == len(stored.verified)
    return dispatch


def k_ranges(dispatch: list[dict[str, Any]], weight: str) -> list[tuple[int, int]]:
    """The K range of ``weight`` on each rank, in rank order (decode phase)."""
    rows = sorted(
        (r["rank"], k_range(r["weight"]))
        for r in dispatch
        if r["phase"] == "decode" and r["weight"].startswith(weight + "[")
    )
    return [k for _, k in rows]


@pytest.mark.parametrize("tp", [1, 4])
def test_gguf_mix_at_tp(pushed: Pusher, ray_ranks: Any, tp: int) -> None:
    store = pushed("gguf", "wide/gguf:v1")
    dispatch = assert_cell(
        store, "wide/gguf:v1", up(store, "wide/gguf:v1", tp=tp), by_slot(GGUF_KERNELS), world=tp
    )
    embedding = {r["rank"] for r in dispatch if slot(r["weight"]) == "token_embd"}
    assert embedding == set(range(tp))  # the tied Q8_0 embedding is every rank's head
    if tp == 4:  # split points moved to block boundaries (even would be 144 and 384)
        assert k_ranges(dispatch, "blk.0.attn_output.weight") == [
            (0, 192),
            (192, 288),
            (288, 480),
            (480, 576),
        ]
        for layer in (0, 1):  # Q4_K, then Q6_K: 256-superblocks
            assert k_ranges(dispatch, f"blk.{layer}.ffn_down.weight") == [
                (0, 512),
                (512, 768),
                (768, 1280),
                (1280, 1536),
            ]


def test_gptq_at_tp1(pushed: Pusher) -> None:
    store = pushed("gptq32", "wide/gptq:g32")
    # float32: int4pack's float32 path is scalar, so the direct tile kernel runs GPTQ as loaded
    assert_cell(store, "wide/gptq:g32", up(store, "wide/gptq:g32"), every(DIRECT4), world=1)


def test_gptq_with_a_partial_last_group(pushed: Pusher, ray_ranks: Any) -> None:
    """Group 128 over K = 576 (4.5 groups), pushed preferring int4pack: it takes a slice of whole groups
    only; the weights whose local K holds the tail run on cpu.int4-direct (no fallback under the default
    policy), the rest packed."""
    store = pushed("gptq128", "wide/gptq:g128", *PACKED)
    ref = "wide/gptq:g128"

    def expected(weight: str) -> str:
        a, b = k_range(weight)
        return INT4 if (b - a) % 128 == 0 else DIRECT4

    result = up(store, ref, tp=2)
    dispatch = assert_cell(store, ref, result, expected, world=2)
    assert k_ranges(dispatch, "model.layers.0.self_attn.o_proj.weight") == [(0, 384), (384, 576)]
    o_proj = {
        r["rank"]: r["kernel"] for r in dispatch if r["weight"].startswith("model.layers.0.self_attn.o_proj")
    }
    assert o_proj == {0: INT4, 1: DIRECT4}  # rank 1: one whole group and the 64-column tail
    assert {r["kernel"] for r in dispatch if slot(r["weight"]) == "down_proj"} == {INT4}  # 768 = 6 x 128
    assert not result.predicate["l5"]["full_dequant_buffers"]
    measured = result.predicate["l5"]["float_buffers"]
    assert measured["operators"] > 0 and measured["outside_policy"] == measured["within_policy"] == []


def test_gptq_partial_group_refusals(pushed: Pusher) -> None:
    """By design: no tp 3 or 4 split of 576 into whole 384-units."""
    store = pushed("gptq128", "wide/gptq:g128", *PACKED)
    session = Session.open(store)
    for tp in (3, 4):
        request = UpRequest(ref="wide/gptq:g128", tokens=PROMPT, tp=tp, store=store)
        with pytest.raises(  # the topology layer refuses it, naming the plan's reason
            GraphLayoutError,
            match=rf"--tp {tp}: the artifact can be placed at tp in .*K=576 holds 2 whole unit\(s\) of 384 "
            rf".*tp={tp} ranks cannot each get one",
        ):
            bring_up(session, request, launcher=run_in_process)


@pytest.mark.parametrize(("fmt", "tp", "packed"), [("awq", 2, False), ("awq", 3, True), ("ct", 2, False)])
def test_awq_and_compressed_tensors_at_tp(
    pushed: Pusher, ray_ranks: Any, fmt: str, tp: int, packed: bool
) -> None:
    """By default the planes run as loaded (cpu.int4-direct); pushed preferring int4pack, repacked."""
    ref = f"wide/{fmt}:g64" + ("-packed" if packed else "")
    store = pushed(fmt, ref, *(PACKED if packed else ()))
    result = up(store, ref, tp=tp)
    dispatch = assert_cell(store, ref, result, every(INT4 if packed else DIRECT4), world=tp)
    expected = {2: [(0, 384), (384, 576)], 3: [(0, 192), (192, 384), (384, 576)]}[tp]  # 288 would cut a group
    assert k_ranges(dispatch, "model.layers.0.self_attn.o_proj.weight") == expected
    classes = set(result.predicate["l5"]["fallbacks"])
    # the direct kernel uses the bytes as they are; int4pack repacks them
    assert classes == ({"repack"} if packed else {"none"}), classes


def test_mixture_of_experts_at_ep2_tp2(pushed: Pusher, ray_ranks: Any) -> None:
    store = pushed("moe", "tiny/moe:v1")
    result = up(store, "tiny/moe:v1", tp=2, ep=2, tokens=TINY_PROMPT)
    dispatch = assert_cell(store, "tiny/moe:v1", result, every(DIRECT4), world=4)
    owners: dict[str, set[int]] = {}
    for row in dispatch:
        if ".experts." in row["weight"]:
            owners.setdefault(row["weight"].split(".experts.")[1].split(".")[0], set()).add(row["rank"])
    assert owners == {"0": {0, 1}, "1": {0, 1}, "2": {2, 3}, "3": {2, 3}}  # rank = ep_rank * tp + tp_rank
    assert k_ranges(dispatch, "model.layers.0.self_attn.o_proj.weight") == [(0, 128), (128, 192)] * 2


@pytest.mark.s3
@pytest.mark.parametrize("name", ["gguf-tiny", "gptq32"])
def test_up_from_seaweedfs_s3(pushed_s3: Pusher, ray_ranks: Any, name: str) -> None:
    """GGUF mix (hidden 192) at tp 3 as llama.cpp stores it; GPTQ g32 (hidden 576) at tp 4 converted to
    the tiled layout (row-major column pieces are read whole on S3, gaps included, since a request costs
    more: 16 requests a rank for the GGUF mix at hidden 576, 2,318 unpriced, 18 tiled)."""
    tiled = name == "gptq32"
    ref, tp, kernels = {
        "gguf-tiny": ("tiny/gguf:v1", 3, by_slot(GGUF_KERNELS)),
        "gptq32": ("wide/gptq:tiled", 4, every(DIRECT4)),
    }[name]
    store = pushed_s3(name, "wide/gptq:g32" if tiled else ref, tiled=tiled)
    manifest = resolve(Session.open(store), parse_ref(ref)).manifest
    assert {t.layout for t in manifest.tensors or []} == {"shardport-tiled" if tiled else "row_major"}
    result = up(store, ref, tp=tp, tokens=TINY_PROMPT)
    dispatch = assert_cell(store, ref, result, kernels, world=tp)
    amplification = result.predicate["read_amplification"]
    assert set(amplification) == {str(r) for r in range(tp)}
    # row-major GGUF: a rank's K-split of every row is read whole on S3 (requests priced), gaps and all
    bound = 1.05 if tiled else S3_PROFILE.max_amplification + 0.02
    assert all(float(a) <= bound for a in amplification.values()), amplification
    if tp == 4:  # 144 per rank would cut a 32-group
        assert k_ranges(dispatch, "model.layers.1.self_attn.o_proj.weight") == [
            (0, 192),
            (192, 288),
            (288, 480),
            (480, 576),
        ]
