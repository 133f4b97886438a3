"""An independent reference for ``registry up``: Hugging Face transformers on the same checkpoint.

Each checkpoint is pushed once (module fixture) and brought up by ``registry up`` on Ray ranks at
tp 2 and tp 3 with ``--logits-out``; transformers' ``LlamaForCausalLM`` runs the same files in float32:

* GGUF (``bringup_artifacts.gguf_tiny``: Q4_0, Q4_1, Q8_0, Q4_K, Q6_K linears, tied Q8_0 embedding,
  GQA, llama.cpp's permuted Q/K): transformers' own GGUF loader,
  ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)``, dequantizes it (with the ``gguf``
  package) and undoes the Q/K permutation; it needs ``accelerate`` (the ``compare`` extra).
* GPTQ (``bringup_artifacts.gptq_tiny``: 4-bit, group 64, g_idx, intermediate 704 = 11 groups):
  transformers loads GPTQ natively only through optimum + gptqmodel, and gptqmodel (7.7) is a source
  distribution that compiles its kernels and needs torch >= 2.14 (we pin 2.13), so this module
  dequantizes the checkpoint itself with :func:`gptq_dequantize`, written from the GPTQ format
  (qweight packs 32/bits codes along K, qzeros stores zero - 1 packed along N, scales [groups, N],
  g_idx maps K to its group) and sharing no code with shardport's decoders, and loads the result into
  ``LlamaForCausalLM``'s state dict (strict).

Both have GQA (6 heads, 3 KV heads: split 2/1 at tp 2) and MLP splits where an even cut would fall
inside a quantization group (GGUF Q4_K/Q6_K at tp 2, GPTQ at tp 2 and 3), which placement moves to
group boundaries (uneven shards; asserted from the dispatch table).

Asserted: top-1 identical at every prompt position, the K greedy tokens identical to transformers'
``generate(do_sample=False)``, and max |Δ logits| within the bring-up's own L4 tolerance. That bound is
the right one: transformers holds the same dequantized weights as the bring-up's float32 reference (up
to float32 rounding of the dequantization, ~1e-7 relative), so the bring-up must be as close to it as
to its own reference; in practice the difference is far smaller (printed with ``-s``).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from bringup_artifacts import INTER, VOCAB, gguf_tiny, gptq_tiny
from llama_artifacts import ok
from safetensors.numpy import load_file

from shardport.cli import main

PROMPT = (1, 5, 300, 7, 396, 42, 211, 3)
STEPS = 4
_K = re.compile(r"K=(\d+):(\d+)")


@dataclass(frozen=True)
class Reference:
    """transformers' float32 result on one checkpoint."""

    logits: np.ndarray  # [T, vocab]
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Pushed:
    store: str
    refs: dict[str, str]
    references: dict[str, Reference]


def gptq_dequantize(planes: dict[str, np.ndarray], prefix: str, bits: int) -> np.ndarray:
    """The float32 weight [N, K] of one GPTQ linear (``checkpoint_format: gptq``, sym or asym)."""
    per = 32 // bits
    mask = np.uint32((1 << bits) - 1)
    qweight = planes[f"{prefix}.qweight"].view(np.uint32)  # [K / per, N]
    qzeros = planes[f"{prefix}.qzeros"].view(np.uint32)  # [groups, N / per]
    scales = planes[f"{prefix}.scales"].astype(np.float32)  # [groups, N]
    shifts = (np.arange(per, dtype=np.uint32) * np.uint32(bits))[None, :, None]
    codes = ((qweight[:, None, :] >> shifts) & mask).reshape(-1, qweight.shape[1])  # lane j = row 8i+j
    zeros = ((qzeros[:, :, None] >> shifts.reshape(1, 1, per)) & mask).reshape(qzeros.shape[0], -1) + 1
    k = codes.shape[0]
    g_idx = planes.get(f"{prefix}.g_idx")
    group = np.arange(k) // (k // scales.shape[0]) if g_idx is None else g_idx.astype(np.int64)
    weight = scales[group] * (codes.astype(np.float32) - zeros[group].astype(np.float32))  # [K, N]
    return np.ascontiguousarray(weight.T)


def _greedy(model: Any) -> Reference:
    with torch.no_grad():
        ids = torch.tensor([PROMPT])
        logits = model(ids).logits[0].float().numpy()
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=STEPS,
            min_new_tokens=STEPS, pad_token_id=0,
        )  # fmt: skip
    return Reference(logits, tuple(int(t) for t in out[0, len(PROMPT) :]))


def transformers_gguf(folder: Path) -> Reference:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file="model.gguf", dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.tie_word_embeddings
    return _greedy(model.eval())


def transformers_gptq(folder: Path) -> Reference:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = json.loads((folder / "config.json").read_text())
    quant = config.pop("quantization_config")
    assert quant["quant_method"] == "gptq" and not quant["desc_act"]
    config.pop("architectures")
    model = LlamaForCausalLM(LlamaConfig(**config)).eval()
    planes = load_file(str(folder / "model.safetensors"))
    state: dict[str, torch.Tensor] = {}
    for name, value in planes.items():
        if name.endswith(".qweight"):
            prefix = name.removesuffix(".qweight")
            state[f"{prefix}.weight"] = torch.from_numpy(gptq_dequantize(planes, prefix, quant["bits"]))
        elif not name.endswith((".qzeros", ".scales", ".g_idx")):
            state[name] = torch.from_numpy(value.astype(np.float32))
    missing, unexpected = model.load_state_dict(state, strict=True)
    assert not missing and not unexpected
    return _greedy(model)


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pushed]:
    """One store holding one GGUF and one GPTQ checkpoint, and transformers' result on each."""
    tmp = tmp_path_factory.mktemp("vs-transformers")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHARDPORT_HOME", str(tmp / "home"))
        mp.delenv("SHARDPORT_STORE", raising=False)
        store = str(tmp / "store")
        ok(store, "keygen")
        gguf, gptq = gguf_tiny(tmp / "gguf"), gptq_tiny(tmp / "gptq", inter=704)
        refs = {"gguf": "llama/gguf:v1", "gptq": "llama/gptq:v1"}
        ok(store, "push", gguf, refs["gguf"])
        ok(store, "push", gptq, refs["gptq"])
        references = {"gguf": transformers_gguf(gguf), "gptq": transformers_gptq(gptq)}
        yield Pushed(store, refs, references)


def test_gptq_dequantizer_matches_the_quantized_values() -> None:
    """The test-local dequantizer recovers the codes' values (else the comparison below proves nothing)."""
    from quantized import gptq_planes, quantize_minmax

    rng = np.random.default_rng(1)
    weight = (rng.standard_normal((48, 192)) * 0.1).astype(np.float32)
    case = quantize_minmax(weight, 64)
    expected = case["scales"].astype(np.float32)[case["g_idx"]] * (case["q"] - case["zeros"][case["g_idx"]])
    got = gptq_dequantize(gptq_planes(case, "w"), "w", 4)
    np.testing.assert_array_equal(got, expected.T)
    assert float(np.abs(got - weight).max()) <= float(case["scales"].max()) * 0.51 + 1e-6


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("tp", [2, 3])
@pytest.mark.parametrize("fmt", ["gguf", "gptq"])
def test_up_agrees_with_transformers(
    pushed: Pushed, fmt: str, tp: int, tmp_path: Path, ray_ranks: Any
) -> None:
    out = tmp_path / "logits.safetensors"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main([
            "--store", pushed.store, "--json", "up", pushed.refs[fmt], "--tp", str(tp),
            "--tokens", ",".join(map(str, PROMPT)), "--generate", str(STEPS),
            "--logits-out", str(out), "--no-evidence",
        ])  # fmt: skip
    doc = json.loads(buf.getvalue())
    assert code == 0, doc
    ref = pushed.references[fmt]
    logits = load_file(str(out))["logits"]
    assert logits.shape == ref.logits.shape == (len(PROMPT), VOCAB)
    diff = float(np.abs(logits - ref.logits).max())
    (l4,) = [row for row in doc["parity"] if row["name"] == "logits max |Δ| vs float32 reference"]
    top2 = np.sort(ref.logits, axis=-1)[:, -2:]
    print(
        f"{fmt} tp={tp}: max|Δ logits| vs transformers {diff:.2e} (L4 vs own reference "
        f"{l4['value']}, tolerance {l4['tolerance']:.2e}); smallest top-1 margin "
        f"{float((top2[:, 1] - top2[:, 0]).min()):.2e}; logit std {float(ref.logits.std()):.3f}; "
        f"greedy {doc['generated']} vs {list(ref.tokens)}"
    )
    assert (logits.argmax(-1) == ref.logits.argmax(-1)).all(), (logits.argmax(-1), ref.logits.argmax(-1))
    assert tuple(doc["generated"]) == ref.tokens
    assert diff <= float(l4["tolerance"]), (diff, l4)
    # The MLP's row-parallel split: on quantization-group boundaries (64 codes in GPTQ, 256-superblocks
    # in GGUF's Q4_K/Q6_K), so uneven where an even split would cut one (every case but GGUF at tp 3).
    down = "model.layers.0.mlp.down_proj" if fmt == "gptq" else "blk.0.ffn_down"
    group, inter = (64, 704) if fmt == "gptq" else (256, INTER)
    cuts = {
        int(c) for r in doc["dispatch"] if r["weight"].startswith(down) for c in _K.findall(r["weight"])[0]
    }
    assert len(cuts) == tp + 1 and all(c % group == 0 for c in cuts), sorted(cuts)
    assert (inter // tp) % group == 0 or len({b - a for a, b in itertools.pairwise(sorted(cuts))}) > 1
