"""``registry up`` refuses what the driver can check alone before anything starts (``up.admit``).

"Before anything starts" is asserted structurally: a :class:`StartingLauncher` that records every start
sees none, and the CLI run in a child process never imports Ray. Sizes come from the pinned manifest
(``deploy.bounds``): world size against heads, kv heads, rows, experts and layers; prompt plus generated
tokens against the context length; token ids against the vocabulary; a text prompt's bytes before it
is tokenized. Also: a malformed reference, a missing signing key, required kernels this shardport lacks,
and ``--trust``/``--allow-unsigned`` reaching the ranks.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from bringup_artifacts import gguf_tiny, gptq_tiny
from llama_artifacts import ok

from shardport.cli.parser import build_parser
from shardport.deploy.bounds import DEFAULT_CONTEXT, PROMPT_BYTES_PER_TOKEN, context_of
from shardport.deploy.errors import GraphLayoutError, RankFailedError, UnsupportedModelError
from shardport.deploy.launch import Started
from shardport.deploy.rank import RankSpec
from shardport.deploy.ray_ranks import run_in_process
from shardport.deploy.up import UpRequest, admit, bring_up, specs_for
from shardport.kernels.catalog import CATALOG_IDS, default_catalog
from shardport.registry.errors import UsageError
from shardport.registry.session import Session

PROMPT = (1, 5, 300, 7)


class _NeverStarted:
    """A launcher that starts before its specs exist and records each start (none is expected)."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def start(self, topology: Any) -> Started:
        world = topology.world_size
        self.log.append(f"start {world}")
        raise AssertionError(f"started {world} ranks for a request the driver should have refused")

    def __call__(self, specs: Sequence[RankSpec]) -> list[dict[str, Any]]:
        self.log.append(f"launch {len(specs)}")
        raise AssertionError("launched a request the driver should have refused")


def _push(tmp: Path, *options: str) -> str:
    store = str(tmp / "store")
    ok(store, "keygen")
    ok(store, "push", gptq_tiny(tmp / "gptq"), "llama/gptq:v1", *options)
    return store


@pytest.fixture
def store(home: Path, tmp_path: Path) -> str:
    """gptq_tiny: 6 heads (3 kv heads), hidden 192, intermediate 768, vocab 397, 2 layers, no context."""
    return _push(tmp_path)


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"ref": "llama/gptq@sha256:zz"}, UsageError, r"digest 'sha256:zz': expected"),
        ({"tokens": (1, 10**6)}, UsageError, r"--tokens \[1000000\]: outside the vocabulary 0\.\.396"),
        ({"tp": 10**6}, GraphLayoutError, r"--tp 1000000: more tensor-parallel ranks than the model's 6"),
        ({"tp": 2 * 10**14}, GraphLayoutError, r"--tp 200000000000000: more tensor-parallel ranks"),
        ({"tp": 4}, GraphLayoutError, r"--tp 4: more than the model's 3 kv heads and not a multiple"),
        ({"ep": 2}, GraphLayoutError, r"--ep 2: LlamaForCausalLM has no experts to spread"),
        ({"pp": 3}, GraphLayoutError, r"--pp 3: more stages than the model's 2 layers"),
        ({"steps": 10**12}, UsageError, rf"more than the model's context of {DEFAULT_CONTEXT} tokens"),
        ({"tokens": (1,) * 2046, "steps": 3}, UsageError, r"2046 prompt tokens \+ --generate 3: 2049"),
        (
            {"tokens": (), "prompt": "x" * (100 * 1024)},
            UsageError,
            r"--prompt: 102400 bytes, more than 65536",
        ),
    ],
)
def test_refused_before_anything_starts(
    store: str, change: dict[str, Any], error: type[Exception], message: str
) -> None:
    launcher = _NeverStarted()
    request = UpRequest(**{"ref": "llama/gptq:v1", "tokens": PROMPT, "store": store, **change})
    with pytest.raises(error, match=message):
        bring_up(Session.open(store), request, launcher=launcher, store_evidence=False)
    assert launcher.log == []


def test_the_largest_request_that_fits_is_admitted(store: str) -> None:
    session = Session.open(store)
    fits = UpRequest(ref="llama/gptq:v1", tokens=(1,) * (DEFAULT_CONTEXT - 4), steps=4, tp=3, store=store)
    admitted = admit(session, fits)
    assert admitted.request.tokens == fits.tokens and admitted.contract.heads == 6


def test_a_missing_signing_key_is_refused_before_anything_starts(store: str, home: Path) -> None:
    shutil.rmtree(home / "keys")
    session = Session.open(store)
    assert session.key is None
    launcher = _NeverStarted()
    request = UpRequest(ref="llama/gptq:v1", tokens=PROMPT, store=store)
    with pytest.raises(UsageError, match=r"needs a signing key: pass --key or run `registry keygen`"):
        bring_up(session, request, launcher=launcher)
    assert launcher.log == []
    admit(session, request, store_evidence=False)  # --no-evidence needs none


def test_required_kernels_this_shardport_lacks_are_refused_before_anything_starts(
    home: Path, tmp_path: Path
) -> None:
    store = _push(tmp_path, "--kernels-required", "cuda.future-int4@3,cpu.int4pack@2")
    launcher = _NeverStarted()
    request = UpRequest(ref="llama/gptq:v1", tokens=PROMPT, store=store)
    with pytest.raises(UnsupportedModelError, match=r"names no kernel this shardport has") as caught:
        bring_up(Session.open(store), request, launcher=launcher, store_evidence=False)
    assert "cpu.int4pack@1" in str(caught.value) and launcher.log == []


def test_a_required_kernel_no_cpu_rank_can_run_is_refused_before_anything_starts(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # only the CUDA int4 kernel is allowed: on this GPU-less host every CPU rank would load its bytes and
    # then refuse them at dispatch; the manifest's runtime layer (pinned at push) says so up front
    store = _push(tmp_path, "--kernels-required", "cuda.int4-tinygemm")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # whatever this host has, its ranks see no GPU
    launcher = _NeverStarted()
    request = UpRequest(ref="llama/gptq:v1", tokens=PROMPT, store=store)
    with pytest.raises(UnsupportedModelError, match=r"no kernel of this shardport admits .* on cpu/float32"):
        bring_up(Session.open(store), request, launcher=launcher, store_evidence=False)
    assert launcher.log == []
    caught = pytest.raises(UnsupportedModelError, match=r"on cpu/bfloat16 with runtime.kernels_required")
    with caught:
        admit(
            Session.open(store),
            UpRequest(ref="llama/gptq:v1", tokens=PROMPT, store=store, activations="bfloat16"),
        )
    # --fallback allow lets the generic kernels in, but the required list still excludes them: each
    # rank's slices are refused from the manifest; --address leaves it to the ranks' dispatch
    allow = UpRequest(ref="llama/gptq:v1", tokens=PROMPT, store=store, fallback="allow")
    with pytest.raises(UnsupportedModelError, match=r"not_required: cpu.int4-direct"):
        admit(Session.open(store), allow)
    admit(Session.open(store), UpRequest(ref="llama/gptq:v1", tokens=PROMPT, store=store, address="h:1"))


def test_the_catalog_ids_the_driver_checks_are_the_catalogs() -> None:
    assert CATALOG_IDS == tuple(f"{k.capability.id}@{k.capability.version}" for k in default_catalog())


def test_the_context_comes_from_the_manifest() -> None:
    assert context_of({"max_position_embeddings": 4096}).tokens == 4096
    gguf = context_of({"llama.context_length": 256, "llama.block_count": 2})
    assert (gguf.tokens, gguf.source) == (256, "llama.context_length")
    assert context_of({}).tokens == DEFAULT_CONTEXT == 2048 and "states no context" in context_of({}).source
    assert context_of({"max_position_embeddings": 0}).tokens == DEFAULT_CONTEXT  # not a usable bound
    assert PROMPT_BYTES_PER_TOKEN * DEFAULT_CONTEXT == 65536
    # a config without the key means its architecture's default, as transformers reads it
    assert (
        context_of({}, "MistralForCausalLM").tokens == 131072
        and "Mistral" in context_of({}, "MistralForCausalLM").source
    )
    assert context_of({}, "Qwen2ForCausalLM").tokens == 32768
    assert (
        context_of({}, "LlamaForCausalLM").tokens == context_of({}, "SomethingElse").tokens == DEFAULT_CONTEXT
    )
    assert context_of({"max_position_embeddings": 4096}, "MistralForCausalLM").tokens == 4096


def test_a_gguf_context_length_bounds_the_sequence(home: Path, tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    ok(store, "keygen")
    ok(store, "push", gguf_tiny(tmp_path / "gguf"), "llama/gguf:v1")  # llama.context_length 256
    launcher = _NeverStarted()
    request = UpRequest(ref="llama/gguf:v1", tokens=(1,) * 250, steps=7, store=store)
    with pytest.raises(UsageError, match=r"context of 256 tokens \(from llama.context_length\)"):
        bring_up(Session.open(store), request, launcher=launcher, store_evidence=False)
    assert launcher.log == []
    admit(Session.open(store), UpRequest(ref="llama/gguf:v1", tokens=(1,) * 250, steps=6, store=store))


def _cli_child(store: str, *args: str) -> tuple[int, dict[str, Any], bool]:
    """``registry up`` in a child process: its exit code, JSON and whether it ever imported Ray."""
    script = (
        "import json, sys\n"
        "from shardport.cli import main\n"
        "code = main(json.loads(sys.argv[1]))\n"
        "print('RAY-IMPORTED' if 'ray' in sys.modules else 'NO-RAY', file=sys.stderr, flush=True)\n"
        "sys.exit(code)\n"
    )
    argv = ["--store", store, "--json", "up", "llama/gptq:v1", *args]
    out = subprocess.run(
        [sys.executable, "-c", script, json.dumps(argv)], capture_output=True, text=True, timeout=120
    )
    marker = out.stderr.strip().rpartition("\n")[2]
    assert marker in ("RAY-IMPORTED", "NO-RAY"), out.stderr
    return out.returncode, json.loads(out.stdout), marker == "RAY-IMPORTED"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("--tokens", "1,2", "--tp", "1000000"), 5, "--tp 1000000"),
        (("--tokens", "1,2", "--generate", "1000000000000"), 2, "--generate 1000000000000"),
        (("--tokens", "1,2", "--logits-out", "/dev/null"), 2, "is a character device"),
    ],
)
def test_the_cli_refuses_without_importing_ray(
    store: str, args: tuple[str, ...], code: int, message: str
) -> None:
    got, doc, ray_imported = _cli_child(store, *args)
    assert (got, ray_imported) == (code, False), doc
    assert message in doc["error"]["message"]


def test_trust_and_allow_unsigned_reach_the_ranks(home: Path, tmp_path: Path) -> None:
    store = _push(tmp_path)
    public = home / "keys" / "default.pub"
    args = build_parser().parse_args(
        [
            "--store",
            store,
            "--trust",
            str(public),
            "--allow-unsigned",
            "up",
            "llama/gptq:v1",
            "--tokens",
            "1,2",
        ]
    )
    from shardport.cli.bringup import request_of

    session = Session.open(store, trust=public, allow_unsigned=True)
    request = request_of(session, args)
    assert (request.trust, request.allow_unsigned) == (str(public.absolute()), True)
    specs = specs_for(request, "llama/gptq@sha256:" + "0" * 64, 2.0)
    assert {(s.trust, s.allow_unsigned) for s in specs} == {(str(public.absolute()), True)}

    # the home's policy no longer trusts the key: only --trust does, on the driver and on every rank
    (home / "trust.json").rename(tmp_path / "trust.json.moved")
    run = UpRequest(ref="llama/gptq:v1", tokens=PROMPT, steps=1, store=store, ladder=False, trust=str(public))
    driver = Session.open(store, trust=public)
    result = bring_up(driver, run, launcher=run_in_process, store_evidence=False)
    assert len(result.generated) == 1
    untrusting = UpRequest(**{**run.__dict__, "trust": None})  # the rank falls back to the home's policy
    with pytest.raises(RankFailedError, match=r"UntrustedSignerError|not list"):
        bring_up(driver, untrusting, launcher=run_in_process, store_evidence=False)


def test_slices_no_kernel_admits_are_refused_from_the_manifest_before_any_read(
    home: Path, tmp_path: Path
) -> None:
    """A manifest without pinned kernels (pushed through the API, not the CLI): 2-bit GPTQ codes, which no
    kernel takes under the default policy, used to be refused by every rank after its whole load; now
    by the driver's admission of each rank's slices, in well under a second, with each slice's reasons."""
    import time

    from shardport.registry.push import push

    store = str(tmp_path / "store")
    ok(store, "keygen")
    push(Session.open(store), gptq_tiny(tmp_path / "gptq2", bits=2), "llama/gptq2", "v1")
    request = UpRequest(ref="llama/gptq2:v1", tokens=PROMPT, steps=2, tp=2, store=store)
    launcher = _NeverStarted()
    t0 = time.perf_counter()
    with pytest.raises(UnsupportedModelError) as caught:
        bring_up(Session.open(store), request, launcher=launcher)
    assert time.perf_counter() - t0 < 1.0 and launcher.log == []
    message = str(caught.value)
    assert "before any byte is read" in message and "more alike: prefill: " in message, message
    assert "(layout: affine:u2:" in message and "full-dequant@1 (policy: full-dequant)" in message, message
    allowed = UpRequest(ref="llama/gptq2:v1", tokens=PROMPT, steps=2, tp=2, store=store, fallback="allow")
    assert admit(Session.open(store), allowed).placed is not None  # the generic kernels take them


def test_a_weight_family_no_kernel_reads_is_refused_by_slice_admission(home: Path, tmp_path: Path) -> None:
    """An ``mx_block`` (MXFP4) weight is accepted at push (it has a reference decoder) but no kernel runs
    it: the slice admission names the weight and the family, from the manifest and the plan alone."""
    from mx_checkpoints import Q, fp4_llama  # a one-layer llama with MXFP4 q_proj and down_proj

    from shardport.deploy.runnable import check_slices
    from shardport.placement import Topology, plan
    from shardport.registry.artifact.manifest import Manifest
    from shardport.registry.store.protocol import Store

    store = str(tmp_path / "store")
    ok(store, "keygen")
    fp4_llama(tmp_path / "fp4", "mxfp4")
    digest = ok(store, "push", tmp_path / "fp4", "m/fp4:1")["digest"]
    manifest = Manifest.from_bytes(Store(store).read_blob(digest))
    with pytest.raises(UnsupportedModelError, match=rf"{Q}.weight.*mx_block"):
        check_slices(manifest, plan(manifest, Topology(tp=1)), "cpu/float32", "warn")
    check_slices(manifest, plan(manifest, Topology(tp=1)), None, "warn")  # device unknown: the ranks decide
