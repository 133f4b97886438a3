"""The graph contract: what a runtime graph needs to know about a model, from GGUF keys or config.json.

:func:`graph_contract` normalises a checkpoint's architecture parameters (the manifest's
``model.architecture`` and ``model.params``) into one frozen :class:`GraphContract`, the same record
for a GGUF file and for a Hugging Face folder. Pure: no I/O. Anything the runtime does not implement
is refused here, at plan time, with a typed error (:mod:`.errors`):
:class:`UnsupportedArchitectureError` for an architecture outside the table below,
:class:`UnsupportedOperatorError` for an operator variant (a rope scaling type, partial rotary,
sliding-window attention, per-layer head counts, biases the graph has no slot for), and
:class:`GraphContractError` for a missing, non-numeric or inconsistent parameter.

=====================================  =====================================  =====================
GGUF key (``<arch>.`` prefix)          config.json                            field
=====================================  =====================================  =====================
``block_count``                        ``num_hidden_layers``                  ``layers``
``embedding_length``                   ``hidden_size``                        ``hidden``
``attention.head_count``               ``num_attention_heads``                ``heads``
``attention.head_count_kv``            ``num_key_value_heads`` (= heads)      ``kv_heads``
``attention.key_length`` (hidden/h)    ``head_dim`` (hidden / heads)          ``head_dim``
``feed_forward_length``                ``intermediate_size``                  ``intermediate``
``vocab_size``, tokens, embedding      ``vocab_size``, embedding              ``vocab``
``rope.freq_base`` (10000)             ``rope_theta`` (10000)                 ``rope_base``
``rope.scaling.type/factor``           ``rope_scaling`` (linear, llama3)      ``rope_scaling``
``attention.layer_norm_rms_epsilon``   ``rms_norm_eps`` (1e-6)                ``norm_eps``
no ``output.weight`` tensor            ``tie_word_embeddings`` (false)        ``tied_embeddings``
``expert_count``/``expert_used_count`` ``num_local_experts``/``..._per_tok``  ``experts``/``top_k``
=====================================  =====================================  =====================

Defaults in parentheses are those of llama.cpp and transformers' ``LlamaConfig``; the contract records
the value used. ``rope_pairs``: which rows rotary embeddings rotate together. Hugging Face llama
weights rotate row ``i`` with row ``i + head_dim/2`` (``half``); llama.cpp's llama converter permutes
the Q and K rows of each head so that adjacent rows ``2i, 2i+1`` pair up (``interleaved``), and a graph
running the GGUF's rows as stored must rotate adjacent pairs (qwen2 GGUFs are not permuted: ``half``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shardport.registry.families.llama import (
    CONFIG_KEYS,
    CONFIG_VARIANTS,
    GGUF_ARCHITECTURE_KEY,
    GGUF_KEYS,
    GGUF_ROPE_FREQS,
    GGUF_VARIANTS,
    ROPE_SCALING_KEYS,
    RopePairs,
    Variant,
    end_names,
    gguf_head_tied,
)

from .errors import GraphContractError, UnsupportedArchitectureError, UnsupportedOperatorError

GraphSource = Literal["config.json", "gguf"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RopeScaling(_Frozen):
    """Rotary frequency scaling: ``linear`` (positions / factor) or ``llama3`` (per-band factors)."""

    kind: Literal["linear", "llama3"]
    factor: float = Field(gt=0)
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _llama3_complete(self) -> RopeScaling:
        if self.kind == "llama3" and None in (
            self.low_freq_factor,
            self.high_freq_factor,
            self.original_max_position,
        ):
            raise ValueError(
                "llama3 rope scaling needs low_freq_factor, high_freq_factor and original_max_position"
            )
        return self


class GraphContract(_Frozen):
    """The architecture parameters of a llama-family decoder (dense or mixture of experts)."""

    version: Literal[1] = 1
    family: Literal["llama"] = "llama"
    architecture: str
    source: GraphSource
    layers: int = Field(ge=1)
    hidden: int = Field(ge=1)
    heads: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=2)
    intermediate: int = Field(ge=1)
    vocab: int = Field(ge=1)
    rope_base: float = Field(gt=0)
    rope_pairs: RopePairs
    rope_scaling: RopeScaling | None = None
    norm_eps: float = Field(gt=0)
    tied_embeddings: bool
    qkv_bias: bool = False
    experts: int = Field(default=0, ge=0)
    experts_per_token: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> GraphContract:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} is odd: rotary embeddings rotate pairs")
        if self.experts and not 1 <= self.experts_per_token <= self.experts:
            raise ValueError(f"experts_per_token {self.experts_per_token} outside 1..{self.experts}")
        if not self.experts and self.experts_per_token:
            raise ValueError(f"experts_per_token {self.experts_per_token} without experts")
        return self

    @property
    def moe(self) -> bool:
        """Whether the MLPs are mixtures of experts."""
        return self.experts > 0

    @property
    def group(self) -> int:
        """Query heads per kv head."""
        return self.heads // self.kv_heads


_Arch = Variant
_CONFIG_ARCHS, _GGUF_ARCHS = CONFIG_VARIANTS, GGUF_VARIANTS
SUPPORTED = tuple(sorted(set(_CONFIG_ARCHS) | {f"gguf:{a}" for a in _GGUF_ARCHS}))
"""Architectures the graph implements (``gguf:<general.architecture>`` for GGUF files)."""


class _Params:
    """Typed reads of one parameter mapping, each failure a :class:`GraphContractError` naming the key."""

    def __init__(self, params: Mapping[str, Any], where: str, prefix: str = "", block: str = "") -> None:
        """``prefix``: part of every key (GGUF ``llama.``); ``block``: a nested object, for messages."""
        self.params, self.where, self.prefix, self.block = params, where, prefix, block

    def key(self, name: str) -> str:
        return self.block + self.prefix + name

    def raw(self, name: str) -> Any:
        value = self.params.get(self.prefix + name)
        if isinstance(value, (list, tuple)):
            raise UnsupportedOperatorError(
                self.where,
                self.key(name),
                "one value for every layer",
                f"a list of {len(value)}",
                "per-layer head counts or sizes are not implemented by the runtime graph",
            )
        return value

    def int(self, name: str, default: int | None = None, *, minimum: int = 1) -> int:
        value = self.raw(name)
        if value is None:
            if default is None:
                raise GraphContractError(
                    self.where, self.key(name), "an integer", "nothing", "the model parameters must state it"
                )
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise GraphContractError(self.where, self.key(name), f"an integer >= {minimum}", repr(value)[:80])
        return value

    def float(self, name: str, default: float | None = None) -> float:
        value = self.raw(name)
        if value is None:
            if default is None:
                raise GraphContractError(
                    self.where,
                    self.key(name),
                    "a positive number",
                    "nothing",
                    "the model parameters must state it",
                )
            return default
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise GraphContractError(self.where, self.key(name), "a positive finite number", repr(value)[:80])
        return float(value)


def _refuse_scaling(where: str, field: str, kind: object) -> UnsupportedOperatorError:
    return UnsupportedOperatorError(
        where,
        field,
        "rope scaling none, 'linear' or 'llama3'",
        repr(kind)[:80],
        "the runtime graph does not implement this rotary scaling (deploy.graph.rope)",
    )


def _config_scaling(p: _Params, block: object) -> RopeScaling | None:
    if block is None:
        return None
    if not isinstance(block, Mapping):
        raise GraphContractError(p.where, CONFIG_KEYS["rope_scaling"], "an object or null", repr(block)[:80])
    r = ROPE_SCALING_KEYS
    kind = block.get(r["kind"], block.get(r["legacy_kind"]))
    if kind in (None, "default"):
        return None
    scaled = _Params(block, p.where, block=CONFIG_KEYS["rope_scaling"] + ".")
    if kind == "linear":
        return RopeScaling(kind="linear", factor=scaled.float(r["factor"]))
    if kind == "llama3":
        return RopeScaling(
            kind="llama3",
            factor=scaled.float(r["factor"]),
            low_freq_factor=scaled.float(r["low_freq_factor"]),
            high_freq_factor=scaled.float(r["high_freq_factor"]),
            original_max_position=scaled.int(r["original_max_position"]),
        )
    raise _refuse_scaling(p.where, f"{CONFIG_KEYS['rope_scaling']}.{r['kind']}", kind)


def _shape(shapes: Mapping[str, Sequence[int]] | None, *names: str) -> tuple[int, ...] | None:
    for name in names:
        if shapes is not None and name in shapes:
            return tuple(shapes[name])
    return None


def _check_embedding(where: str, name: str, shape: tuple[int, ...] | None, vocab: int, hidden: int) -> None:
    if shape is not None and shape != (vocab, hidden):
        raise GraphContractError(
            where,
            f"tensor {name}",
            f"[vocab {vocab}, hidden {hidden}]",
            list(shape),
            "the parameters and the embedding disagree; fix the parameters",
        )


C, G = CONFIG_KEYS, GGUF_KEYS  # the llama family's parameter spellings


def _from_config(
    architecture: str, arch: _Arch, params: Mapping[str, Any], shapes: Mapping[str, Sequence[int]] | None
) -> GraphContract:
    where = "config.json"
    p = _Params(params, where)
    for key, ok in (
        ("hidden_act", ("silu", None)),
        ("attention_bias", (False, None)),
        ("mlp_bias", (False, None)),
    ):
        if params.get(key) not in ok:
            raise UnsupportedOperatorError(
                where, key, ok[0], repr(params.get(key))[:80], "the runtime graph does not implement it"
            )
    if params.get("sliding_window") is not None and params.get("use_sliding_window", True):
        raise UnsupportedOperatorError(
            where,
            "sliding_window",
            "null (full causal attention)",
            repr(params["sliding_window"])[:40],
            "sliding-window attention is not implemented by the runtime graph",
        )
    hidden, heads = p.int(C["hidden"]), p.int(C["heads"])
    head_dim = p.int(C["head_dim"], hidden // heads if hidden % heads == 0 else None)
    rope = params.get(C["rope_parameters"])
    rope_block = rope if isinstance(rope, Mapping) else params.get(C["rope_scaling"])
    base_params = _Params(rope, where, block=C["rope_parameters"] + ".") if isinstance(rope, Mapping) else p
    base = base_params.float(C["rope_base"], 10000.0)
    experts = p.int(C["experts"], None if arch.moe else 0, minimum=0)
    if arch.moe is False and experts:
        raise UnsupportedOperatorError(
            where, C["experts"], 0, experts, f"{architecture} has no experts"
        )
    embed_name = end_names(gguf=False, tied=True)[0]
    embed = _shape(shapes, embed_name)
    vocab = p.int(C["vocab"], embed[0] if embed else None)
    _check_embedding(where, embed_name, embed, vocab, hidden)
    tied = params.get(C["tied_embeddings"], False)
    if not isinstance(tied, bool):
        raise GraphContractError(where, C["tied_embeddings"], "true or false", repr(tied)[:80])
    return _contract(
        where,
        architecture=architecture,
        source="config.json",
        layers=p.int(C["layers"]),
        hidden=hidden,
        heads=heads,
        kv_heads=p.int(C["kv_heads"], heads),
        head_dim=head_dim,
        intermediate=p.int(C["intermediate"]),
        vocab=vocab,
        rope_base=base,
        rope_pairs=arch.rope_pairs,
        rope_scaling=_config_scaling(p, rope_block),
        norm_eps=p.float(C["norm_eps"], 1e-6),
        tied_embeddings=tied,
        qkv_bias=arch.qkv_bias,
        experts=experts,
        experts_per_token=p.int(C["experts_per_token"], 2 if experts else 0, minimum=0) if experts else 0,
    )


def _from_gguf(
    architecture: str,
    arch: _Arch,
    params: Mapping[str, Any],
    shapes: Mapping[str, Sequence[int]] | None,
    vocab_size: int | None,
) -> GraphContract:
    where = "GGUF metadata"
    p = _Params(params, where, architecture + ".")
    if shapes is None:
        raise GraphContractError(
            where,
            "tensors",
            "the GGUF's tensor shapes",
            "nothing",
            "tied embeddings and the vocabulary are read from the tensor list: pass tensor_shapes",
        )
    hidden, heads = p.int(G["hidden"]), p.int(G["heads"])
    head_dim = p.int(G["head_dim"], hidden // heads if hidden % heads == 0 else None)
    if p.int(G["value_dim"], head_dim) != head_dim:
        raise UnsupportedOperatorError(
            where,
            p.key(G["value_dim"]),
            head_dim,
            p.raw(G["value_dim"]),
            "different key and value head sizes are not implemented",
        )
    if p.int(G["rotary_dim"], head_dim) != head_dim:
        raise UnsupportedOperatorError(
            where,
            p.key(G["rotary_dim"]),
            f"head_dim {head_dim}",
            p.raw(G["rotary_dim"]),
            "partial rotary embeddings are not implemented by the runtime graph",
        )
    if GGUF_ROPE_FREQS in shapes:
        raise UnsupportedOperatorError(
            where,
            f"tensor {GGUF_ROPE_FREQS}",
            "no per-frequency rope factors",
            f"a {GGUF_ROPE_FREQS.removesuffix('.weight')} tensor",
            "llama 3 rope scaling stored as a frequency-factor tensor is not implemented",
        )
    kind = p.raw(G["rope_scaling_type"])
    scaling: RopeScaling | None = None
    if kind == "linear":
        scaling = RopeScaling(kind="linear", factor=p.float(G["rope_scaling_factor"]))
    elif kind not in (None, "none"):
        raise _refuse_scaling(where, p.key(G["rope_scaling_type"]), kind)
    experts = p.int(G["experts"], 0, minimum=0)
    if arch.moe is False and experts:
        raise UnsupportedOperatorError(
            where, p.key(G["experts"]), 0, experts, f"{architecture} has no experts"
        )
    embed_name = end_names(gguf=True, tied=True)[0]
    embed = _shape(shapes, embed_name)
    vocab = p.int(G["vocab"], vocab_size or (embed[0] if embed else None))
    _check_embedding(where, embed_name, embed, vocab, hidden)
    return _contract(
        where,
        architecture=architecture,
        source="gguf",
        layers=p.int(G["layers"]),
        hidden=hidden,
        heads=heads,
        kv_heads=p.int(G["kv_heads"], heads),
        head_dim=head_dim,
        intermediate=p.int(G["intermediate"]),
        vocab=vocab,
        rope_base=p.float(G["rope_base"], 10000.0),
        rope_pairs=arch.rope_pairs,
        rope_scaling=scaling,
        norm_eps=p.float(G["norm_eps"]),
        tied_embeddings=gguf_head_tied(shapes),
        qkv_bias=arch.qkv_bias,
        experts=experts,
        experts_per_token=p.int(G["experts_per_token"]) if experts else 0,
    )


def _contract(where: str, **fields: Any) -> GraphContract:
    try:
        return GraphContract(**fields)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        errors = getattr(exc, "errors", None)
        first = errors()[0] if callable(errors) else {"loc": (), "msg": str(exc)}
        field = ".".join(str(x) for x in first["loc"]) or "parameters"
        raise GraphContractError(where, field, "consistent architecture parameters", first["msg"]) from exc


def graph_contract(
    architecture: str | None,
    params: Mapping[str, Any],
    *,
    tensor_shapes: Mapping[str, Sequence[int]] | None = None,
    vocab_size: int | None = None,
) -> GraphContract:
    """The graph contract of a model from its manifest ``model`` section.

    ``architecture``: config.json's ``architectures[0]`` (or ``model_type``), or a GGUF file's
    ``general.architecture``. ``params``: config.json's keys, or the GGUF's ``<arch>.*`` scalars (the
    source is GGUF when any key carries that prefix). ``tensor_shapes``: tensor name → row-major shape;
    needed for GGUF (tied embeddings = no ``output.weight``; the vocabulary from ``token_embd.weight``
    when no ``vocab_size`` key says it), and used to cross-check the embedding otherwise.
    ``vocab_size``: the tokenizer's token count, where the GGUF carries one and no ``vocab_size`` key.
    """
    if architecture is None:
        raise UnsupportedArchitectureError(
            "model",
            "architecture",
            f"one of {list(SUPPORTED)}",
            "none",
            f"the checkpoint names no architecture (config.json architectures, GGUF {GGUF_ARCHITECTURE_KEY})",
        )
    gguf = any(isinstance(k, str) and k.startswith(architecture + ".") for k in params)
    table = _GGUF_ARCHS if gguf else _CONFIG_ARCHS
    arch = table.get(architecture)
    if arch is None:
        raise UnsupportedArchitectureError(
            "GGUF metadata" if gguf else "config.json",
            "architecture",
            f"one of {sorted(table)}",
            repr(architecture)[:80],
            "the runtime graph implements the llama family only (llama, mistral, mixtral, qwen2)",
        )
    if gguf:
        return _from_gguf(architecture, arch, params, tensor_shapes, vocab_size)
    return _from_config(architecture, arch, params, tensor_shapes)
