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

from .errors import UnsupportedModelError
from .graph.stems import layer_stem


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
            if contract.moe and op in ("gate", "up", "down"):
                continue
            stem = layer_stem(layer, op, gguf)
            out[f"{stem}.weight"] = shape
            if contract.qkv_bias and op in ("q", "k", "v"):
                out[f"{stem}.bias"] = (shape[0],)
        if contract.moe and gguf:  # llama.cpp's stacked experts [E, N, K] and the router
            e = contract.experts
            out[f"blk.{layer}.ffn_gate_inp.weight"] = (e, h)
            for w, shape in (("gate", (e, i, h)), ("up", (e, i, h)), ("down", (e, h, i))):
                out[f"blk.{layer}.ffn_{w}_exps.weight"] = shape
        elif contract.moe:
            stem = f"model.layers.{layer}.block_sparse_moe"
            out[f"{stem}.gate.weight"] = (contract.experts, h)
            for e in range(contract.experts):
                for w, shape in (("w1", (i, h)), ("w3", (i, h)), ("w2", (h, i))):
                    out[f"{stem}.experts.{e}.{w}.weight"] = shape
    out["token_embd.weight" if gguf else "model.embed_tokens.weight"] = (contract.vocab, h)
    out["output_norm.weight" if gguf else "model.norm.weight"] = (h,)
    if not contract.tied_embeddings:
        out["output.weight" if gguf else "lm_head.weight"] = (contract.vocab, h)
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
