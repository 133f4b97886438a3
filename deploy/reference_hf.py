"""The driver's L4 reference run by Hugging Face transformers' own modeling code, one layer at a time.

The graph's float32 reference (:mod:`.reference_stream`) runs the project's own layer code, so a bug in
the graph shared by the ranks and the reference would be invisible to L4. This reference runs each
decoder layer as transformers' own module (``LlamaDecoderLayer``, ``MistralDecoderLayer``,
``Qwen2DecoderLayer``, ``MixtralDecoderLayer``), with its RMSNorm and rotary embedding classes and a
config built from the manifest's :class:`~shardport.registry.contracts.graph.GraphContract`, fed with
the registry's reference-decoded float32 weights, streamed exactly as the graph reference is: each pp
stage of ``pp = layers`` is loaded through the loader, decoded only when it runs and freed before the
next (:func:`~.reference_stream.stage_weights`), so the driver holds at most one float32 layer (or the
head) at a time.

Weights go into the layer module by transformers' own parameter names (``load_state_dict(strict=True,
assign=True)`` into a module built on the meta device: no second copy, and a name missing on either
side is an error). Hugging Face checkpoints already use those names; GGUF names are mapped by
:data:`GGUF_TO_HF`, llama GGUF Q/K rows are put back in Hugging Face order (llama.cpp permutes them for
its interleaved rope, :func:`~.graph.rope.unpermute_gguf_qk`), and Mixtral's per-expert matrices are
stacked as transformers 5 holds them (``experts.gate_up_proj`` ``[E, 2I, H]``, ``experts.down_proj``).

Teacher forcing without a cache: each layer runs once over the whole sequence ``prompt + tokens[:-1]``
under a causal mask. Attention is causal, so position ``T - 1 + j`` sees exactly the prompt and the
run's first ``j`` tokens: its logits are those greedy decode step ``j`` chooses from, and the run's
cached decode steps are compared against a fresh computation (eager attention, float32).

Where transformers is not installed (the ``compare`` extra; ``scripts/demo.sh`` installs none) or has no
modeling code for the architecture, :func:`transformers_classes` says why and the driver falls back to
the graph reference (:func:`~.reference_stream.driver_reference`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from shardport.registry.contracts.graph import GraphContract
from shardport.registry.families.llama import (
    CONFIG_KEYS,
    GGUF_SLOTS,
    GGUF_STEMS,
    HF_STACKED_EXPERTS,
    HF_STEMS,
    MOE_ROUTER_SLOT,
    ROPE_SCALING_KEYS,
    gguf_expert_stacks,
    hf_expert_names,
    layer_prefix,
)

from .errors import GraphWeightError
from .graph.model import Generation

GGUF_TO_HF: dict[str, str] = GGUF_SLOTS
"""GGUF layer tensor stems (``blk.<l>.<stem>.weight|bias``) to transformers' module paths in a layer."""
QK_STEMS = (GGUF_STEMS["q"], GGUF_STEMS["k"])
"""GGUF's rope-permuted stems (llama.cpp stores Q and K rows interleaved)."""


MIN_TRANSFORMERS = (5, 20)
"""The oldest transformers whose layers this drives (stacked Mixtral experts, ``rope_parameters``)."""


@dataclass(frozen=True)
class HfClasses:
    """transformers' modules for one architecture family, and the version that provides them."""

    family: str
    version: str
    config: Any
    layer: Any
    norm: Any
    rotary: Any

    @property
    def source(self) -> dict[str, str]:
        """The parity record's ``reference``: what computed the L4 reference."""
        return {"kind": "transformers", "version": self.version, "class": self.layer.__name__}


def family_of(contract: GraphContract) -> str:
    """Transformers' model family of ``contract``: Mixtral (any MoE), Qwen2, Mistral or Llama."""
    arch = contract.architecture.lower()
    if contract.moe:
        return "Mixtral"
    if arch.startswith("qwen2"):
        return "Qwen2"
    return "Mistral" if arch.startswith("mistral") else "Llama"


def transformers_classes(contract: GraphContract) -> HfClasses | str:
    """Transformers' decoder layer, RMSNorm, rotary embedding and config for ``contract``, or why not."""
    family = family_of(contract)
    try:
        transformers = importlib.import_module("transformers")
        module = importlib.import_module(f"transformers.models.{family.lower()}.modeling_{family.lower()}")
    except ImportError as exc:
        return f"transformers has no {family} modeling code here ({exc}); it comes with the 'compare' extra"
    version = str(transformers.__version__)
    if tuple(int(p) if p.isdigit() else 0 for p in version.split(".")[:2]) < MIN_TRANSFORMERS:
        floor = ".".join(map(str, MIN_TRANSFORMERS))
        return f"transformers {version} is older than {floor} (the 'compare' extra's floor: other layer APIs)"
    names = (f"{family}Config", f"{family}DecoderLayer", f"{family}RMSNorm", f"{family}RotaryEmbedding")
    found = [getattr(module, n, None) for n in names]
    if None in found:
        lacking = [n for n, c in zip(names, found, strict=True) if c is None]
        return f"transformers {version} lacks {', '.join(lacking)} for {contract.architecture}"
    return HfClasses(family, version, *found)


def _rope(contract: GraphContract) -> dict[str, Any]:
    rope: dict[str, Any] = {
        ROPE_SCALING_KEYS["kind"]: "default",
        CONFIG_KEYS["rope_base"]: contract.rope_base,
    }
    s = contract.rope_scaling
    if s is not None:
        rope.update(rope_type=s.kind, factor=s.factor)
        if s.kind == "llama3":
            rope.update(
                low_freq_factor=s.low_freq_factor,
                high_freq_factor=s.high_freq_factor,
                original_max_position_embeddings=s.original_max_position,
            )
    return rope


def _positions(contract: GraphContract, positions: int) -> int:
    """``max_position_embeddings``: the sequence's length, and above llama3's original context.

    The factor times it, as llama 3 configs state (transformers checks that it is larger).
    """
    s = contract.rope_scaling
    if s is not None and s.original_max_position is not None:
        return max(positions, int(s.original_max_position * s.factor))
    return max(positions, 1)


def hf_config(contract: GraphContract, classes: HfClasses, positions: int) -> Any:
    """Transformers' config of ``contract`` (eager attention and experts, no sliding window)."""
    c = contract
    fields: dict[str, Any] = dict(
        vocab_size=c.vocab, hidden_size=c.hidden, intermediate_size=c.intermediate,
        num_hidden_layers=c.layers, num_attention_heads=c.heads, num_key_value_heads=c.kv_heads,
        head_dim=c.head_dim, rms_norm_eps=c.norm_eps, hidden_act="silu", rope_parameters=_rope(c),
        tie_word_embeddings=c.tied_embeddings, max_position_embeddings=_positions(c, positions),
    )  # fmt: skip
    if classes.family == "Mixtral":
        fields.update(num_local_experts=c.experts, num_experts_per_tok=c.experts_per_token)
    if classes.family in ("Mistral", "Mixtral"):
        fields.update(sliding_window=None)
    config = classes.config(**fields)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    for key, want in (
        (CONFIG_KEYS["head_dim"], c.head_dim),
        (CONFIG_KEYS["kv_heads"], c.kv_heads),
        (CONFIG_KEYS["norm_eps"], c.norm_eps),
    ):
        if getattr(config, key, None) != want:
            raise GraphWeightError(
                f"transformers {classes.config.__name__}: {key} {getattr(config, key, None)}, expected {want}"
            )
    return config


class StageTensors(Protocol):
    """One pp stage's weights, decoded to float32 on each lookup (the driver's ``_Decoded``)."""

    def need(self, name: str, rows: Sequence[int] | None = None) -> torch.Tensor:
        """Weight ``name`` (only ``rows`` of it), decoded; a typed error if absent."""

    def release(self, name: str) -> None:
        """Drop ``name``'s quantized planes: it is decoded and not needed again."""

    def __getitem__(self, name: str) -> torch.Tensor: ...
    def __iter__(self) -> Iterator[str]: ...
    def __contains__(self, name: object) -> bool: ...


Track = Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]]


def _hf_qk_order(w: torch.Tensor, heads: int, track: Track) -> torch.Tensor:
    """llama.cpp's permuted Q or K rows (weight ``[N, K]`` or bias ``[N]``) back in Hugging Face order.

    llama.cpp stores ``hf.reshape(heads, 2, d/2, ...).swapaxes(1, 2)``; this is its inverse.
    """
    a = w.numpy()
    half = a.shape[0] // heads // 2
    out = track(np.empty_like(a))
    out[...] = a.reshape(heads, half, 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)
    return torch.from_numpy(out)


def _stacked(
    blocks: Sequence[Sequence[str]], shape: tuple[int, int, int], tensors: StageTensors, track: Track
) -> torch.Tensor:
    """Expert matrices as transformers holds them, ``shape`` = ``[E, rows, K]``, rows block by block.

    A block is one ``[E, N, K]`` tensor (GGUF's ``ffn_*_exps``) or one ``[N, K]`` tensor per expert
    (Hugging Face's ``experts.<e>.w1``); each is decoded, copied in and freed before the next.
    """
    if len(blocks) == 1 and len(blocks[0]) == 1:  # GGUF's down_exps: already [E, H, I], no copy
        whole = tensors[blocks[0][0]]
        tensors.release(blocks[0][0])
        if tuple(whole.shape) != shape:
            raise GraphWeightError(
                f"tensor {blocks[0][0]}: {list(whole.shape)}, transformers expects {list(shape)}"
            )
        return whole
    out, start = track(np.empty(shape, dtype=np.float32)), 0
    for block in blocks:
        rows = 0
        for e, name in enumerate(block):
            w = tensors[name].numpy()
            tensors.release(name)
            rows = w.shape[-2]
            into = out[:, start : start + rows] if len(block) == 1 else out[e, start : start + rows]
            if into.shape != w.shape:
                raise GraphWeightError(
                    f"tensor {name}: {list(w.shape)}, expected {list(into.shape)} for transformers' experts"
                )
            into[...] = w
            del w
        start += rows
    if start != shape[1]:
        raise GraphWeightError(f"experts: {start} rows stacked, transformers expects {shape[1]}")
    return torch.from_numpy(out)


def _expert_blocks(contract: GraphContract, index: int) -> tuple[list[list[str]], list[list[str]]]:
    """The source tensors of transformers' ``experts.gate_up_proj`` (gate, then up) and ``down_proj``."""
    if contract.source == "gguf":
        gate, up, down = gguf_expert_stacks(index)
        return [[gate], [up]], [[down]]
    names = [hf_expert_names(index, e) for e in range(contract.experts)]
    return [[n[0] for n in names], [n[1] for n in names]], [[n[2] for n in names]]


def layer_state(
    contract: GraphContract, tensors: StageTensors, index: int, track: Track
) -> dict[str, torch.Tensor]:
    """Layer ``index``'s float32 weights under transformers' parameter names in its decoder layer module.

    Each weight is decoded once (Q and K first: their reordered copies are made while little else is
    held). A tensor of the layer with no transformers parameter is a :class:`GraphWeightError`.
    """
    c, gguf = contract, contract.source == "gguf"
    prefix = layer_prefix(index, gguf)
    state: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    if c.moe:
        gate_up, down = _expert_blocks(c, index)
        used = {n for blocks in (gate_up, down) for block in blocks for n in block}
        absent = sorted(n for n in used if n not in tensors)
        if absent:
            raise GraphWeightError(f"tensor {absent[0]}: the model needs it and the checkpoint has none")
        state[HF_STACKED_EXPERTS[0]] = _stacked(
            gate_up, (c.experts, 2 * c.intermediate, c.hidden), tensors, track
        )
        state[HF_STACKED_EXPERTS[1]] = _stacked(down, (c.experts, c.hidden, c.intermediate), tensors, track)
    own = [n for n in tensors if n.startswith(prefix) and n not in used]
    for name in sorted(own, key=lambda n: (n[len(prefix) :].split(".")[0] not in QK_STEMS, n)):
        stem, _, leaf = name[len(prefix) :].rpartition(".")
        if gguf and stem not in GGUF_TO_HF:
            raise GraphWeightError(
                f"tensor {name}: transformers' {family_of(c)} layer has no parameter for it"
            )
        path = GGUF_TO_HF[stem] if gguf else (MOE_ROUTER_SLOT if stem == HF_STEMS["router"] else stem)
        w = tensors[name]
        tensors.release(name)  # its quantized planes, while the rest of the layer is decoded
        if gguf and c.rope_pairs == "interleaved" and stem in QK_STEMS:
            w = _hf_qk_order(w, c.heads if stem == QK_STEMS[0] else c.kv_heads, track)
        state[f"{path}.{leaf}"] = w
    return state


def _module(
    make: Callable[[], torch.nn.Module], state: Mapping[str, torch.Tensor], what: str
) -> torch.nn.Module:
    """``make()`` built on the meta device, then given ``state`` as its parameters (no copy, strict)."""
    with torch.device("meta"):
        module = make()
    try:
        module.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise GraphWeightError(f"{what}: the weights do not fit transformers' module: {exc}") from exc
    left = [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    if left:
        raise GraphWeightError(f"{what}: transformers' module has no weights for {left}")
    return module.eval()


def _embed(tensors: StageTensors, name: str, ids: Sequence[int]) -> torch.Tensor:
    """``[1, S, hidden]``: the embedding rows of ``ids`` (only the distinct ones are decoded)."""
    held = sorted(set(ids))
    rows = tensors.need(name, held)
    return rows[torch.searchsorted(torch.tensor(held), torch.tensor(list(ids)))][None]


def _logits(x: torch.Tensor, tensors: StageTensors, head: str, vocab: int, rows: int) -> torch.Tensor:
    """``x @ head.T`` (``[S, vocab]``), the head decoded ``rows`` vocabulary rows at a time.

    Each logit is its own row's dot product, so the result is the same as with the whole head; the
    driver never holds the head (``vocab x hidden`` float32, often larger than a layer) at once.
    """
    out = torch.empty(x.shape[0], vocab)
    for at in range(0, vocab, rows):
        part = tensors.need(head, range(at, min(at + rows, vocab)))
        out[:, at : at + part.shape[0]] = torch.nn.functional.linear(x, part)
        del part
    return out


def hf_teacher_forced(
    contract: GraphContract,
    classes: HfClasses,
    stages: Iterable[StageTensors],
    prompt: Sequence[int],
    tokens: Sequence[int],
    track: Track,
    head_rows: int = 2048,
) -> Generation:
    """Transformers' logits over ``prompt`` and a run's greedy ``tokens``, one pp stage at a time.

    ``stages``: the weights of stage ``s`` = layer ``s`` (the first also holding the embedding, the last
    the final norm and head), each used and dropped before the next is taken. ``track``: counts each
    float copy this makes (the float ledger); ``head_rows``: vocabulary rows of the head decoded at a
    time. Returns the prompt's logits, the argmax at each decode
    position and the logits there (row ``j``: given the prompt and ``tokens[:j]``).
    """
    from .graph.checkpoint import end_names

    if not tokens:
        raise GraphWeightError("transformers reference: no generated tokens to check")
    ids, t = [*prompt, *tokens[:-1]], len(prompt)
    config = hf_config(contract, classes, len(ids))
    positions = torch.arange(len(ids))[None]
    mask = torch.full((len(ids), len(ids)), torch.finfo(torch.float32).min).triu(1)[None, None]
    embed, norm, head = end_names(contract)
    x: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    with torch.no_grad():
        for index, tensors in enumerate(stages):
            if index >= contract.layers:
                raise GraphWeightError(f"transformers reference: a stage {index} after the last layer")
            if x is None:
                x = _embed(tensors, embed, ids)
                if index < contract.layers - 1:
                    tensors.release(embed)  # the last stage holds it again if it is the tied head
                rope = classes.rotary(config)(x, positions)
            state = layer_state(contract, tensors, index, track)
            layer = _module(lambda: classes.layer(config, index), state, f"layer {index}")  # noqa: B023
            del state
            out = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=rope)
            x = out[0] if isinstance(out, tuple) else out
            del layer, out
            if index == contract.layers - 1:
                final = _module(
                    lambda: classes.norm(contract.hidden, eps=contract.norm_eps),
                    {"weight": tensors.need(norm)},
                    "final norm",
                )
                logits = _logits(final(x)[0], tensors, head or embed, contract.vocab, head_rows)
            del tensors  # the stage's quantized planes, before the next stage is loaded
    if logits is None:
        raise GraphWeightError(
            f"transformers reference: {contract.layers} layers, the stages ended before the last"
        )
    rows = logits[t - 1 : t - 1 + len(tokens)]
    return Generation(logits[:t].contiguous(), tuple(int(torch.argmax(r)) for r in rows), rows.contiguous())
