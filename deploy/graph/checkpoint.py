"""A :class:`~.reference.FloatModel` from named float tensors: Hugging Face or GGUF names.

Hugging Face llama/mistral/qwen2 (``model.layers.<l>.self_attn.q_proj.weight`` …), Mixtral experts
(``block_sparse_moe.gate`` and ``experts.<e>.w1/w2/w3``), or GGUF (``blk.<l>.attn_q.weight`` …,
stacked ``ffn_{gate,up,down}_exps`` ``[E, N, K]``): the names of
:mod:`shardport.registry.families.llama`. Tensors are row-major ``[N, K]`` as the manifest records
them (GGUF ``ne`` reversed). GGUF Q/K rows stay in the file's order; the contract's ``rope_pairs``
says how the graph pairs them. A name the model needs and ``tensors`` lacks is a
:class:`GraphWeightError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from shardport.registry.contracts.graph import GraphContract
from shardport.registry.families import llama

from ..errors import GraphWeightError
from .reference import FloatLayer, FloatMlp, FloatModel


class _Names:
    def __init__(self, contract: GraphContract, tensors: Mapping[str, torch.Tensor]) -> None:
        self.gguf = contract.source == "gguf"
        self.tensors = tensors

    def get(self, name: str, optional: bool = False) -> torch.Tensor | None:
        if name in self.tensors:
            return self.tensors[name].to(torch.float32)
        if optional:
            return None
        raise GraphWeightError(f"tensor {name}: the model needs it and the checkpoint has none")

    def need(self, name: str) -> torch.Tensor:
        out = self.get(name)
        assert out is not None
        return out

    def layer(self, index: int, op: str, leaf: str = "weight", optional: bool = False) -> torch.Tensor | None:
        return self.get(llama.layer_name(index, op, self.gguf, leaf), optional)

    def experts(self, index: int, count: int) -> tuple[FloatMlp, ...]:
        if self.gguf:
            g, u, d = (self.need(name) for name in llama.gguf_expert_stacks(index))
            return tuple(FloatMlp(g[e], u[e], d[e]) for e in range(count))
        return tuple(
            FloatMlp(*(self.need(name) for name in llama.hf_expert_names(index, e))) for e in range(count)
        )


def float_layer(contract: GraphContract, tensors: Mapping[str, torch.Tensor], index: int) -> FloatLayer:
    """Layer ``index`` of the float model of ``contract``: only its own tensors are looked up."""
    n = _Names(contract, tensors)
    q, k, v, o = (n.layer(index, op) for op in ("q", "k", "v", "o"))
    assert q is not None and k is not None and v is not None and o is not None
    norms = n.layer(index, "input_norm"), n.layer(index, "post_norm")
    assert norms[0] is not None and norms[1] is not None
    bias = {
        f"{op}_bias": n.layer(index, op, "bias", optional=not contract.qkv_bias) for op in ("q", "k", "v")
    }
    if contract.moe:
        router = n.layer(index, "router")
        experts, mlp = n.experts(index, contract.experts), None
    else:
        gate, up, down = (n.layer(index, op) for op in llama.MLP_OPS)
        assert gate is not None and up is not None and down is not None
        router, experts, mlp = None, (), FloatMlp(gate, up, down)
    return FloatLayer(q, k, v, o, norms[0], norms[1], mlp, router, experts, **bias)


def end_names(contract: GraphContract) -> tuple[str, str, str | None]:
    """The embedding's, final norm's and output head's tensor names (head ``None``: tied embeddings)."""
    return llama.end_names(contract.source == "gguf", contract.tied_embeddings)


def float_model(contract: GraphContract, tensors: Mapping[str, torch.Tensor]) -> FloatModel:
    """The float model of ``contract`` from ``tensors`` (dequantized or float checkpoint tensors)."""
    n = _Names(contract, tensors)
    layers = tuple(float_layer(contract, tensors, i) for i in range(contract.layers))
    embed, norm, head = end_names(contract)
    return FloatModel(contract, n.need(embed), layers, n.need(norm), None if head is None else n.need(head))
