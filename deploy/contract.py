"""The graph contract of a verified manifest, and the strict check of its inventory against it.

The contract comes from the manifest's ``model`` section: the one recorded at push (``model.graph``),
else re-derived from the model's architecture, parameters and tensor shapes
(:func:`~shardport.registry.checkpoint.model_graph.graph_of`). :func:`check_inventory` refuses, at plan
time, a checkpoint whose weights do not match the architecture: a weight the graph needs and the
manifest lacks, one of the wrong shape, or one the graph would silently ignore.
"""

from __future__ import annotations

from shardport.registry.artifact.manifest import Manifest
from shardport.registry.checkpoint.model_graph import graph_of
from shardport.registry.contracts.graph import GraphContract
from shardport.registry.families import llama

from .errors import UnsupportedModelError


def contract_of(manifest: Manifest) -> GraphContract:
    """The manifest's graph contract (recorded at push, or re-derived: :func:`graph_of`)."""
    return graph_of(manifest)


def expected_weights(contract: GraphContract) -> dict[str, tuple[int, ...]]:
    """Every weight the graph reads, with its logical shape (``[N, K]``, ``[hidden]``, ``[E, N, K]``)."""
    gguf = contract.source == "gguf"
    d, h, i = contract.head_dim, contract.hidden, contract.intermediate
    shapes = {
        "q": (contract.heads * d, h),
        "k": (contract.kv_heads * d, h),
        "v": (contract.kv_heads * d, h),
        "o": (h, contract.heads * d),
        "gate": (i, h),
        "up": (i, h),
        "down": (h, i),
        "input_norm": (h,),
        "post_norm": (h,),
    }
    out: dict[str, tuple[int, ...]] = {}
    for layer in range(contract.layers):
        for op, shape in shapes.items():
            if contract.moe and op in llama.MLP_OPS:
                continue
            stem = llama.layer_stem(layer, op, gguf)
            out[f"{stem}.weight"] = shape
            if contract.qkv_bias and op in ("q", "k", "v"):
                out[f"{stem}.bias"] = (shape[0],)
        if contract.moe and gguf:  # llama.cpp's stacked experts [E, N, K] and the router
            e = contract.experts
            out[llama.layer_name(layer, "router", gguf)] = (e, h)
            stacked = ((e, i, h), (e, i, h), (e, h, i))
            out.update(zip(llama.gguf_expert_stacks(layer), stacked, strict=True))
        elif contract.moe:
            out[llama.hf_router_name(layer)] = (contract.experts, h)
            for e in range(contract.experts):
                out.update(zip(llama.hf_expert_names(layer, e), ((i, h), (i, h), (h, i)), strict=True))
    embed, norm, head = llama.end_names(gguf, contract.tied_embeddings)
    out[embed] = (contract.vocab, h)
    out[norm] = (h,)
    if head is not None:
        out[head] = (contract.vocab, h)
    return out


def check_inventory(contract: GraphContract, manifest: Manifest) -> None:
    """Refuse unless the manifest's weights are exactly those the graph reads, at their shapes."""
    found = {w.name: tuple(w.shape.extents) for w in manifest.weights or []}
    want = expected_weights(contract)
    missing = sorted(set(want) - set(found))
    wrong = sorted(
        f"{n}: expected {list(want[n])}, found {list(found[n])}"
        for n in want
        if n in found and found[n] != want[n]
    )
    extra = sorted(set(found) - set(want))
    if missing or wrong or extra:
        parts = []
        if missing:
            parts.append(f"missing {missing[:6]}{' …' if len(missing) > 6 else ''}")
        if wrong:
            parts.append(f"wrong shape {wrong[:6]}")
        if extra:
            parts.append(f"not read by the {contract.architecture} graph {extra[:6]}")
        raise UnsupportedModelError(
            f"inventory vs architecture {contract.architecture} ({contract.layers} layers, hidden "
            f"{contract.hidden}): " + "; ".join(parts)
        )
