"""The sizes a bring-up may ask for, checked against the pinned manifest before anything starts.

Pure (no torch, no Ray, no I/O): the driver runs these right after resolving the reference (~0.1 s),
before it starts or joins a cluster, so a request the model cannot run is refused in well under a
second instead of after ranks were placed (or never: a world of 10^6 ranks waits on Ray's bundles,
one of 10^14 is never planned).

- **World size** against the model's rows: each tensor-parallel rank holds at least one query head
  (``tp <= heads``), and when ``tp`` exceeds the kv heads it must be a multiple of them (one kv head
  per rank); ``tp`` is at most the intermediate and vocabulary rows it splits; ``ep`` at most the
  experts (and 1 without experts); ``pp`` at most the layers.
- **Sequence length** against the context: prompt tokens + generated tokens <= the model's context
  length (``max_position_embeddings`` in config.json, ``<arch>.context_length`` in a GGUF), or
  :data:`DEFAULT_CONTEXT` when the manifest states none. A text prompt is bounded by bytes before it is
  tokenized: at most :data:`PROMPT_BYTES_PER_TOKEN` bytes per token of that context.
- **Vocabulary**: every prompt token id is below the vocabulary size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardport.registry.artifact.manifest import Manifest
from shardport.registry.contracts.graph import GraphContract
from shardport.registry.errors import UsageError
from shardport.registry.families.llama import CONFIG_KEYS, CONTEXT_DEFAULTS, GGUF_KEYS

from .errors import GraphLayoutError

DEFAULT_CONTEXT = 2048
"""The context length assumed when the manifest states none and its architecture has no default below
(transformers' ``LlamaConfig`` default)."""
ARCHITECTURE_CONTEXT = CONTEXT_DEFAULTS
"""transformers' configs' ``max_position_embeddings`` defaults (the model family's table)."""
PROMPT_BYTES_PER_TOKEN = 32
"""A text prompt may hold at most this many UTF-8 bytes per token of context (checked before the
tokenizer runs: no vocabulary's tokens are that long in practice, so no prompt that fits is refused)."""


@dataclass(frozen=True)
class Context:
    """The model's context length and where it comes from (a manifest key, or the default)."""

    tokens: int
    source: str


def _positive_int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def context_of(params: Mapping[str, Any], architecture: str | None = None) -> Context:
    """The context length the model's parameters state, else its architecture's default, else 2048.

    The defaults: :data:`ARCHITECTURE_CONTEXT`, then :data:`DEFAULT_CONTEXT`.
    """
    stated = _positive_int(params.get(CONFIG_KEYS["context"]))
    if stated is not None:
        return Context(stated, CONFIG_KEYS["context"])
    for key in sorted(params):
        if key.endswith("." + GGUF_KEYS["context"]):
            stated = _positive_int(params[key])
            if stated is not None:
                return Context(stated, key)
    if architecture in ARCHITECTURE_CONTEXT:
        return Context(
            ARCHITECTURE_CONTEXT[architecture],
            f"{architecture}'s default (the manifest states no context length)",
        )
    return Context(DEFAULT_CONTEXT, "the default (the manifest states no context length)")


def context_length(manifest: Manifest) -> Context:
    """:func:`context_of` the manifest's ``model.params`` and architecture."""
    return context_of(manifest.model.params, manifest.model.architecture)


def check_world(contract: GraphContract, tp: int, ep: int, pp: int) -> None:
    """Refuse a topology the model's heads, rows, experts or layers cannot give every rank a share of."""
    heads, kv = contract.heads, contract.kv_heads
    if tp > heads:
        raise GraphLayoutError(
            f"--tp {tp}: more tensor-parallel ranks than the model's {heads} query heads (each rank holds "
            f"at least one); use --tp <= {heads}"
        )
    if tp > kv and tp % kv:
        raise GraphLayoutError(
            f"--tp {tp}: more than the model's {kv} kv heads and not a multiple of them (a rank would need "
            f"parts of two kv heads); use a divisor or a multiple of {kv}"
        )
    for rows, what in ((contract.intermediate, "intermediate"), (contract.vocab, "vocabulary")):
        if tp > rows:
            raise GraphLayoutError(f"--tp {tp}: more ranks than the model's {rows} {what} rows")
    if ep > 1 and not contract.moe:
        raise GraphLayoutError(f"--ep {ep}: {contract.architecture} has no experts to spread")
    if ep > max(contract.experts, 1):
        raise GraphLayoutError(
            f"--ep {ep}: more expert-parallel ranks than the model's {contract.experts} experts; "
            f"use --ep <= {contract.experts}"
        )
    if pp > contract.layers:
        raise GraphLayoutError(f"--pp {pp}: more stages than the model's {contract.layers} layers")


def check_prompt_bytes(prompt: str, context: Context) -> None:
    """Refuse a text prompt too long to fit the context, by bytes, before it is tokenized."""
    size, most = len(prompt.encode("utf-8", "surrogatepass")), PROMPT_BYTES_PER_TOKEN * context.tokens
    if size > most:
        raise UsageError(
            f"--prompt: {size} bytes, more than {most} ({PROMPT_BYTES_PER_TOKEN} bytes per token of the "
            f"model's {context.tokens}-token context, from {context.source}); shorten the prompt"
        )


def check_sequence(tokens: Sequence[int], steps: int, contract: GraphContract, context: Context) -> None:
    """Refuse an empty prompt, a token outside the vocabulary, or prompt + generated past the context."""
    if not tokens:
        raise UsageError("registry up: no prompt (pass --tokens 1,2,3 or a non-empty --prompt)")
    bad = [t for t in tokens if not 0 <= t < contract.vocab]
    if bad:
        shown = ", ".join(map(str, bad[:8])) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        raise UsageError(f"--tokens [{shown}]: outside the vocabulary 0..{contract.vocab - 1}")
    if len(tokens) + steps > context.tokens:
        raise UsageError(
            f"{len(tokens)} prompt tokens + --generate {steps}: {len(tokens) + steps} positions, more than "
            f"the model's context of {context.tokens} tokens (from {context.source}); shorten the prompt or "
            f"generate at most {max(0, context.tokens - len(tokens))}"
        )
