"""The llama family's vocabulary (llama, mistral, qwen2; mixtral's experts): names, slots, splits, keys.

Pure data and small pure functions; no I/O and no import from the rest of shardport. Sections:

* **Architectures**: :data:`ARCHITECTURES` (config.json ``architectures[0]`` / ``model_type``, GGUF
  ``general.architecture``).
* **Operator slots**: a weight's place in the graph, in the Hugging Face spelling
  (``self_attn.q_proj``): :data:`DENSE_LAYER_SLOTS`, :data:`MOE_EXPERT_SLOTS`, :data:`OPTIONAL_SLOTS`,
  the top slots (:data:`EMBED_SLOT`, :data:`HEAD_SLOT`, :data:`NORM_SLOT`) and :data:`GGUF_SLOTS`
  (GGUF tensor stem → slot).
* **Tensor names**: parsing a name into ``(layer, slot, expert)`` (:func:`parse_hf_name`,
  :func:`parse_gguf_name`) and building the names a graph reads (:func:`layer_stem` by operator,
  :func:`end_names`, :func:`hf_expert_names`, :func:`gguf_expert_stacks`).
* **Split rules**: which operators split along which axis under tensor parallelism
  (:data:`COLUMN_OPS`, :data:`ROW_OPS`, :data:`KV_OPS`, :data:`VOCAB_SLOTS`, :data:`FUSED_OPS`,
  :func:`slot_split`) and the pp stages of the layer-less slots.
* **Parameters**: config.json keys and GGUF metadata keys of each contract field
  (:data:`CONFIG_KEYS`, :data:`GGUF_KEYS`), placement's aliases (:data:`PARAM_ALIASES`,
  :func:`model_param`), and the config.json keys a manifest records (:data:`CONFIG_PARAMS`).

=========================  =============================  ================================  =========
operator (graph's name)    Hugging Face stem              GGUF stem                         tp split
=========================  =============================  ================================  =========
``q``                      ``self_attn.q_proj``           ``attn_q``                        column
``k``, ``v``               ``self_attn.k_proj``/``v_``    ``attn_k``, ``attn_v``            kv heads
``o``                      ``self_attn.o_proj``           ``attn_output``                   row
``gate``, ``up``           ``mlp.gate_proj``/``up_proj``  ``ffn_gate``, ``ffn_up``          column
``down``                   ``mlp.down_proj``              ``ffn_down``                      row
``input_norm``             ``input_layernorm``            ``attn_norm``                     replicate
``post_norm``              ``post_attention_layernorm``   ``ffn_norm``                      replicate
``router``                 ``block_sparse_moe.gate``      ``ffn_gate_inp``                  replicate
experts (mixtral)          ``…experts.<e>.w1/w3/w2``      ``ffn_{gate,up,down}_exps`` [E…]  as above
embedding, head, norm      ``model.embed_tokens``,        ``token_embd``, ``output``,       vocab,
                           ``lm_head``, ``model.norm``    ``output_norm``                   vocab, -
=========================  =============================  ================================  =========
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

# --- architectures ----------------------------------------------------------------------------------

ARCHITECTURES = frozenset(
    {
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "MixtralForCausalLM",
        "llama",
        "mistral",
        "qwen2",
    }
)
"""Architectures whose inventory :mod:`~shardport.registry.contracts.architecture` checks."""

RopePairs = Literal["half", "interleaved"]
"""Which rows rotary embeddings rotate together: ``i`` with ``i + head_dim/2``, or ``2i`` with ``2i+1``."""


@dataclass(frozen=True, slots=True)
class Variant:
    """What the runtime graph must know of one architecture: its rope row pairing, qkv biases, experts."""

    rope_pairs: RopePairs
    qkv_bias: bool = False
    moe: bool | None = None  # None: dense or MoE as the expert count says


#: Architectures the runtime graph implements, as config.json names them.
CONFIG_VARIANTS: dict[str, Variant] = {
    "LlamaForCausalLM": Variant("half"),
    "MistralForCausalLM": Variant("half"),
    "MixtralForCausalLM": Variant("half", moe=True),
    "Qwen2ForCausalLM": Variant("half", qkv_bias=True, moe=False),
    "llama": Variant("half"),
    "mistral": Variant("half"),
    "mixtral": Variant("half", moe=True),
    "qwen2": Variant("half", qkv_bias=True, moe=False),
}
#: The same, as a GGUF's ``general.architecture`` names them (llama.cpp permutes llama's Q/K rows).
GGUF_VARIANTS: dict[str, Variant] = {
    "llama": Variant("interleaved"),
    "qwen2": Variant("half", qkv_bias=True, moe=False),
}

GGUF_ARCHITECTURE_KEY = "general.architecture"
"""The GGUF metadata key naming the architecture (and the prefix of its parameter keys)."""

# --- operator slots ---------------------------------------------------------------------------------

DENSE_LAYER_SLOTS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "input_layernorm",
    "post_attention_layernorm",
)
"""A dense layer's slots: attention (0..3), the MLP (4..6), the two norms (7, 8)."""
ATTENTION_SLOTS = DENSE_LAYER_SLOTS[:4]
MLP_SLOTS = DENSE_LAYER_SLOTS[4:7]
NORM_SLOTS = DENSE_LAYER_SLOTS[7:]
MOE_ROUTER_SLOT = "mlp.gate"
MOE_EXPERT_SLOTS = ("mlp.experts.gate_proj", "mlp.experts.up_proj", "mlp.experts.down_proj")
OPTIONAL_SLOTS = frozenset(
    {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias", "rotary_emb.inv_freq"}
)
"""Slots a checkpoint may hold beyond the required ones (qkv biases, stored rotary frequencies)."""
EMBED_SLOT = "embed_tokens"
HEAD_SLOT = "lm_head"
NORM_SLOT = "norm"
HEAD_SLOTS = frozenset({HEAD_SLOT, EMBED_SLOT})
"""The output head and the embedding it may be tied to."""

#: GGUF tensor stem → Hugging Face operator slot.
GGUF_SLOTS: dict[str, str] = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "token_embd": "embed_tokens",
    "output": "lm_head",
    "output_norm": "norm",
}

# --- tensor names -----------------------------------------------------------------------------------

# Whole-string matches (``fullmatch``); ``[0-9]``, not ``\d`` (which also matches non-ASCII digits).
_HF_LAYER = re.compile(
    r"(?:model\.|transformer\.|language_model\.model\.)?(?:layers|h|blocks)\.([0-9]+)\.(.+)"
)
_HF_TOP = re.compile(r"(?:model\.|transformer\.|language_model\.model\.)?(.+)")
_EXPERT = re.compile(r"(.*?)\.experts\.([0-9]+)\.(.+)")
_GGUF_LAYER = re.compile(r"blk\.([0-9]+)\.(.+)")


def _split_suffix(stem: str) -> tuple[str, str]:
    """Split ``x.q_proj.weight`` into (``x.q_proj``, ``weight``)."""
    head, _, leaf = stem.rpartition(".")
    if leaf in ("weight", "bias") and head:
        return head, leaf
    return stem, ""


def parse_hf_name(name: str) -> tuple[int | None, str, int | None]:
    """``(layer, slot, expert)`` of a Hugging Face weight name; a ``bias`` gets the slot ``<op>.bias``.

    ``model.layers.3.self_attn.q_proj.weight`` → ``(3, "self_attn.q_proj", None)``; experts
    (``mlp.experts.7.down_proj``) give the expert and the slot ``mlp.experts.down_proj``. A name outside
    these patterns keeps its own stem as the slot.
    """
    stem, leaf = _split_suffix(name)
    layer: int | None = None
    match = _HF_LAYER.fullmatch(stem)
    if match is not None:
        layer, rest = int(match.group(1)), match.group(2)
    else:
        top = _HF_TOP.fullmatch(stem)
        rest = top.group(1) if top is not None else stem
    expert: int | None = None
    expert_match = _EXPERT.fullmatch(rest)
    if expert_match is not None:
        rest = f"{expert_match.group(1)}.experts.{expert_match.group(3)}"
        expert = int(expert_match.group(2))
    return layer, (f"{rest}.bias" if leaf == "bias" else rest), expert


def parse_gguf_name(name: str) -> tuple[int | None, str]:
    """``(layer, slot)`` of a GGUF tensor name (``blk.3.attn_q.weight`` → ``(3, "self_attn.q_proj")``)."""
    stem, leaf = _split_suffix(name)
    layer: int | None = None
    match = _GGUF_LAYER.fullmatch(stem)
    if match is not None:
        layer, stem = int(match.group(1)), match.group(2)
    slot = GGUF_SLOTS.get(stem, stem)
    return layer, (f"{slot}.bias" if leaf == "bias" else slot)


#: A decoder layer's weight stems by the graph's operator name, Hugging Face spelling.
HF_STEMS: dict[str, str] = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "input_norm": "input_layernorm",
    "post_norm": "post_attention_layernorm",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
    "router": "block_sparse_moe.gate",
}
#: The same, GGUF spelling.
GGUF_STEMS: dict[str, str] = {
    "q": "attn_q",
    "k": "attn_k",
    "v": "attn_v",
    "o": "attn_output",
    "input_norm": "attn_norm",
    "post_norm": "ffn_norm",
    "gate": "ffn_gate",
    "up": "ffn_up",
    "down": "ffn_down",
    "router": "ffn_gate_inp",
}
MLP_OPS = ("gate", "up", "down")
"""The MLP's operators, in the order the graph takes them (gate, up, down)."""


def layer_prefix(layer: int, gguf: bool) -> str:
    """Layer ``layer``'s name prefix: ``blk.3.`` (GGUF), ``model.layers.3.`` (Hugging Face)."""
    return f"blk.{layer}." if gguf else f"model.layers.{layer}."


def layer_stem(layer: int, op: str, gguf: bool) -> str:
    """Layer ``layer``'s ``op`` stem: ``blk.3.attn_q`` (GGUF), ``model.layers.3.self_attn.q_proj``."""
    return layer_prefix(layer, gguf) + (GGUF_STEMS[op] if gguf else HF_STEMS[op])


def layer_name(layer: int, op: str, gguf: bool, leaf: str = "weight") -> str:
    """A layer weight's full name: :func:`layer_stem` and its ``leaf`` (``weight``, ``bias``)."""
    return f"{layer_stem(layer, op, gguf)}.{leaf}"


HF_EMBED, HF_NORM, HF_HEAD = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"
GGUF_EMBED, GGUF_NORM, GGUF_HEAD = "token_embd.weight", "output_norm.weight", "output.weight"
LOGIT_NAMES = frozenset({GGUF_HEAD, HF_HEAD, GGUF_EMBED, HF_EMBED})
"""The output head's and the embedding's names in both schemes (the weights that compute logits)."""


def end_names(gguf: bool, tied: bool) -> tuple[str, str, str | None]:
    """The embedding's, final norm's and output head's names (head ``None``: tied to the embedding)."""
    if gguf:
        return GGUF_EMBED, GGUF_NORM, None if tied else GGUF_HEAD
    return HF_EMBED, HF_NORM, None if tied else HF_HEAD


def gguf_head_tied(tensor_names: Iterable[str]) -> bool:
    """GGUF has no tie key: a file without ``output.weight`` ties the head to ``token_embd``."""
    return GGUF_HEAD not in set(tensor_names)


def hf_has_head(tensor_names: Iterable[str]) -> bool:
    """Whether a Hugging Face checkpoint stores an output head (``…lm_head.weight``)."""
    return any(name.endswith(HF_HEAD) for name in tensor_names)


def is_hf_embedding(name: str) -> bool:
    """Whether ``name`` is a Hugging Face token embedding (``…embed_tokens.weight``)."""
    return name.endswith(f"{EMBED_SLOT}.weight")


_HF_EXPERT_WEIGHTS = ("w1", "w3", "w2")  # gate, up, down


def hf_router_name(layer: int) -> str:
    """Mixtral's router of layer ``layer``: ``model.layers.<l>.block_sparse_moe.gate.weight``."""
    return layer_name(layer, "router", gguf=False)


def hf_expert_names(layer: int, expert: int) -> tuple[str, str, str]:
    """Mixtral's gate, up and down weights of one expert (``…block_sparse_moe.experts.<e>.w1/w3/w2``)."""
    stem = f"model.layers.{layer}.block_sparse_moe.experts.{expert}"
    gate, up, down = (f"{stem}.{w}.weight" for w in _HF_EXPERT_WEIGHTS)
    return gate, up, down


#: transformers 5's Mixtral decoder layer holds the experts stacked: ``[E, 2 I, H]`` (gate rows, then up
#: rows) and ``[E, H, I]``, under these parameter names.
HF_STACKED_EXPERTS = ("mlp.experts.gate_up_proj", MOE_EXPERT_SLOTS[2])


def gguf_expert_stacks(layer: int) -> tuple[str, str, str]:
    """llama.cpp's stacked ``[E, N, K]`` gate, up and down weights of layer ``layer`` (``ffn_*_exps``)."""
    gate, up, down = (f"blk.{layer}.ffn_{w}_exps.weight" for w in MLP_OPS)
    return gate, up, down


# --- split rules ------------------------------------------------------------------------------------

COLUMN_OPS = {"q_proj": "heads", "gate_proj": "intermediate", "up_proj": "intermediate"} | {
    "w1": "intermediate",
    "w3": "intermediate",
}
"""Column-parallel operators (split along N) and the shared dim they split."""
ROW_OPS = {"o_proj": "heads", "down_proj": "intermediate", "w2": "intermediate"}
"""Row-parallel operators (split along K) and the shared dim they split."""
KV_OPS = ("k_proj", "v_proj")
"""Operators split by kv heads (along N)."""
VOCAB_SLOTS = (EMBED_SLOT, HEAD_SLOT)
"""Slots split by vocabulary rows (along N)."""
FUSED_OPS = ("qkv_proj", "gate_up_proj", "query_key_value", "c_attn")
"""Fused operators: never split."""
VOCAB_SPLIT_KEYS = {EMBED_SLOT: "embed", HEAD_SLOT: HEAD_SLOT}
"""The shared-dim key of each vocabulary slot's split (placement's ``embed`` and ``lm_head``)."""
ATTENTION_PREFIX = ATTENTION_SLOTS[0].rpartition(".")[0]
QUERY_HEADS_SPLIT = f".{ATTENTION_PREFIX}.{COLUMN_OPS['q_proj']}"
"""The suffix of placement's shared-dim key of a layer's query heads (``layers.<l>.self_attn.heads``)."""
KV_HEADS_SPLIT = f".{ATTENTION_PREFIX}.kv"
"""The same of its kv heads (``layers.<l>.self_attn.kv``)."""
VOCAB_SPLITS = tuple(VOCAB_SPLIT_KEYS.values())
"""Placement's shared-dim keys of the vocabulary (``embed``, ``lm_head``)."""
FIRST_STAGE_SLOTS = (EMBED_SLOT,)
"""Layer-less slots only the first pp stage needs."""
LAST_STAGE_SLOTS = (HEAD_SLOT, NORM_SLOT)
"""Layer-less slots only the last pp stage needs."""


def slot_split(slot: str, ndim: int) -> tuple[str, str] | None:
    """``(logical axis, shared dim kind)`` a weight of ``slot`` splits along, or None (replicated).

    Kinds: ``heads``, ``kv``, ``intermediate``, ``vocab``. Same rule as placement's ``slot_rule``.
    """
    bias = slot.endswith(".bias")
    stem = slot.removesuffix(".bias")
    op = stem.rpartition(".")[2]
    if op in FUSED_OPS or stem in FUSED_OPS:
        return None
    if op in KV_OPS and (ndim >= 2 or bias):
        return "N", "kv"
    if op in COLUMN_OPS and (ndim >= 2 or bias):
        return "N", COLUMN_OPS[op]
    if op in ROW_OPS and ndim >= 2 and not bias:
        return "K", ROW_OPS[op]
    if stem in VOCAB_SLOTS and ndim >= 2:
        return "N", "vocab"
    return None


# --- parameters -------------------------------------------------------------------------------------

#: Graph-contract field → config.json key (transformers' ``LlamaConfig`` and its siblings).
CONFIG_KEYS: dict[str, str] = {
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "intermediate": "intermediate_size",
    "vocab": "vocab_size",
    "rope_base": "rope_theta",
    "rope_scaling": "rope_scaling",
    "rope_parameters": "rope_parameters",
    "norm_eps": "rms_norm_eps",
    "tied_embeddings": "tie_word_embeddings",
    "experts": "num_local_experts",
    "experts_per_token": "num_experts_per_tok",
    "context": "max_position_embeddings",
}
#: Graph-contract field → GGUF metadata key, after the ``<arch>.`` prefix (``llama.block_count``).
GGUF_KEYS: dict[str, str] = {
    "layers": "block_count",
    "hidden": "embedding_length",
    "heads": "attention.head_count",
    "kv_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "value_dim": "attention.value_length",
    "rotary_dim": "rope.dimension_count",
    "intermediate": "feed_forward_length",
    "vocab": "vocab_size",
    "rope_base": "rope.freq_base",
    "rope_scaling_type": "rope.scaling.type",
    "rope_scaling_factor": "rope.scaling.factor",
    "norm_eps": "attention.layer_norm_rms_epsilon",
    "experts": "expert_count",
    "experts_per_token": "expert_used_count",
    "context": "context_length",
}
CONTEXT_DEFAULTS = {
    "LlamaForCausalLM": 2048,
    "MistralForCausalLM": 4096 * 32,
    "MixtralForCausalLM": 4096 * 32,
    "Qwen2ForCausalLM": 32768,
    "Qwen2MoeForCausalLM": 32768,
}
"""transformers' configs' ``max_position_embeddings`` defaults: what a checkpoint whose config omits the
key means (a Mistral config without it runs 131,072 positions, not Llama's 2,048)."""
#: config.json's ``rope_scaling`` (or ``rope_parameters``) object: what each key of a scaling holds.
ROPE_SCALING_KEYS: dict[str, str] = {
    "kind": "rope_type",
    "legacy_kind": "type",
    "factor": "factor",
    "low_freq_factor": "low_freq_factor",
    "high_freq_factor": "high_freq_factor",
    "original_max_position": "original_max_position_embeddings",
}
GGUF_ROPE_FREQS = "rope_freqs.weight"
"""llama 3 rope scaling stored as a per-frequency factor tensor (not implemented by the graph)."""


def gguf_key(architecture: str, field: str) -> str:
    """The GGUF metadata key of a contract field: ``llama.attention.head_count``."""
    return f"{architecture}.{GGUF_KEYS[field]}"


PARAM_ALIASES: dict[str, tuple[str, ...]] = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers", "block_count"),
    "num_heads": ("num_attention_heads", "n_head", "attention.head_count"),
    "num_kv_heads": ("num_key_value_heads", "n_head_kv", "attention.head_count_kv"),
    "head_dim": ("head_dim", "attention.key_length"),
    "hidden": ("hidden_size", "n_embd", "embedding_length"),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts", "expert_count"),
}
"""Parameter spellings, Hugging Face config first, then GGUF metadata suffixes (``llama.block_count``)."""


def param_keys(params: Mapping[str, Any], name: str) -> list[str]:
    """The keys of ``params`` that spell ``name`` (:data:`PARAM_ALIASES`), first alias first.

    Per alias: the exact key, else every ``<arch>.<alias>`` key (sorted); the first alias present wins.
    """
    for alias in PARAM_ALIASES[name]:
        keys = [alias] if alias in params else [k for k in sorted(params) if k.endswith("." + alias)]
        if keys:
            return keys
    return []


def model_param(params: Mapping[str, Any], name: str) -> int | None:
    """A positive integer parameter by any of its spellings (:data:`PARAM_ALIASES`), else None."""
    for key in param_keys(params, name)[:1]:
        value = params[key]
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return None


CONFIG_PARAMS = (
    "model_type",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "rope_theta",
    "rope_scaling",
    "rms_norm_eps",
    "tie_word_embeddings",
    "num_local_experts",
    "num_experts_per_tok",
    "max_position_embeddings",
    "head_dim",
    # what the graph contract reads (registry/contracts/graph.py) to refuse what the runtime lacks
    "rope_parameters",
    "sliding_window",
    "use_sliding_window",
    "hidden_act",
    "attention_bias",
    "mlp_bias",
    "norm_topk_prob",
)
"""config.json keys recorded in a manifest's ``model.params`` (a key the config lacks is left out, so
adding one here changes the manifest digest only of checkpoints whose config.json has it)."""
