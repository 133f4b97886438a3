"""The driver's float32 reference (parity L4), streamed: one layer's weights decoded at a time.

The reference decoder of every weight (:func:`~shardport.registry.contracts.decode.decode_weight`) feeds
the graph's own layer code at tp = 1, as :func:`~.graph.reference.reference_model` does for a whole
float model, but the checkpoint is loaded as ``pp = layers`` pipeline stages (the placement plan puts
layer ``s`` on stage ``s``, the embedding on the first stage and the final norm and head — the
embedding again when tied — on the last), each through :func:`~shardport.loader.load_rank` (verified
tiles and witness rows), and each weight is decoded only when its stage runs: the embedding's rows of
the prompt's tokens, then one layer, then the final norm and head, each freed before the next
(:func:`~.graph.staged.teacher_forced`). Host memory: one stage's quantized planes, plus the largest of
one layer's float weights, the embedding rows and the head, plus hidden states ``[T + K - 1, hidden]``
— instead of the whole checkpoint quantized and in float32.

The run's generated tokens are known when the reference runs (the ranks have reported), so the
reference is teacher-forced: the same prefill and cached decode steps a greedy ``generate`` runs, fed
the run's tokens; its argmax at each decode position equals the run's token exactly when its own greedy
decode would have chosen it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shardport.registry.contracts.graph import GraphContract
from shardport.registry.contracts.model import LogicalWeight
from shardport.registry.session import Session
from shardport.registry.trust.resolve import Resolved

from .errors import GraphWeightError
from .graph.checkpoint import end_names, float_layer
from .graph.model import Generation
from .graph.reference import shard_layer, single_split
from .graph.staged import row_lookup, teacher_forced
from .graph.weights import RankWeights, float_linear


@dataclass
class FloatLedger:
    """Bytes of decoded float32 weights: alive now (until their arrays are freed), at peak, in total.

    An array counts as alive until the garbage collector frees it (a weak-reference finalizer), so the
    peak measures what the reference actually held, not what it meant to free.
    """

    live: int = 0
    peak: int = 0
    decoded: int = 0

    def track(self, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Count ``array`` alive until it is freed; return it."""
        size = int(array.nbytes)
        self.live += size
        self.decoded += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(array, self._release, size)
        return array

    def _release(self, size: int) -> None:
        self.live -= size


class _Decoded(Mapping[str, torch.Tensor]):
    """One stage's weights, decoded to float32 on each lookup (nothing cached): ``name -> [N, K]``."""

    def __init__(
        self,
        planes: Mapping[str, Mapping[str, Any]],
        weights: Mapping[str, LogicalWeight],
        ledger: FloatLedger,
    ) -> None:
        self.planes, self.weights, self.ledger = planes, weights, ledger

    def rows(self, name: str, rows: Sequence[int]) -> torch.Tensor:
        """Only ``rows`` of weight ``name``, decoded."""
        from shardport.registry.contracts.decode import decode_weight

        if name not in self.planes:
            raise GraphWeightError(f"tensor {name}: the model needs it and the checkpoint has none")
        decoded = decode_weight(self.weights[name], self.planes[name], list(rows))
        return torch.from_numpy(self.ledger.track(np.ascontiguousarray(decoded, dtype=np.float32)))

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.planes:
            raise KeyError(name)
        from shardport.registry.contracts.decode import decode_weight

        decoded = decode_weight(self.weights[name], self.planes[name])
        return torch.from_numpy(self.ledger.track(np.ascontiguousarray(decoded, dtype=np.float32)))

    def __contains__(self, name: object) -> bool:
        return name in self.planes

    def __iter__(self) -> Iterator[str]:
        return iter(self.planes)

    def __len__(self) -> int:
        return len(self.planes)


def _stage_planes(session: Session, resolved: Resolved, layers: int, stage: int) -> dict[str, dict[str, Any]]:
    """Stage ``stage``'s quantized planes at ``tp = 1, pp = layers``: ``weight -> {tensor: array}``."""
    from shardport.loader import load_rank
    from shardport.placement import Topology

    loaded = load_rank(session, resolved, Topology(tp=1, pp=layers), stage)
    planes: dict[str, dict[str, Any]] = {}
    for t in loaded.tensors:
        if t.weight is not None:
            planes.setdefault(t.weight, {})[t.tensor] = t.array
    return planes


def stages(
    session: Session, resolved: Resolved, contract: GraphContract, ids: Sequence[int], ledger: FloatLedger
) -> Iterator[RankWeights]:
    """The reference's stages, each decoded only when the previous one is done.

    The embedding's rows of ``ids``, every layer, then the final norm and the head (the embedding when
    tied); each pipeline stage's quantized planes are loaded once and dropped before the next's.
    """
    weights = {w.name: w for w in resolved.manifest.weights or []}
    embed, norm, head = end_names(contract)
    split, last = single_split(contract), contract.layers - 1
    for stage in range(contract.layers):
        decoded = _Decoded(_stage_planes(session, resolved, contract.layers, stage), weights, ledger)
        if stage == 0:
            held = sorted(set(ids))
            yield RankWeights(layers=(), embed=row_lookup(held, decoded.rows(embed, held)))
        layer = shard_layer(float_layer(contract, decoded, stage), stage, contract, split, 0)
        yield RankWeights(layers=(layer,))
        del layer
        if stage == last:
            if norm not in decoded or (head or embed) not in decoded:
                missing = norm if norm not in decoded else head or embed
                raise GraphWeightError(f"tensor {missing}: the model needs it and the checkpoint has none")
            yield RankWeights(layers=(), norm=decoded[norm], head=float_linear(decoded[head or embed]))
        del decoded  # this stage's quantized planes, before the next stage is loaded


def streamed_reference(
    session: Session,
    resolved: Resolved,
    contract: GraphContract,
    prompt: Sequence[int],
    tokens: Sequence[int],
    ledger: FloatLedger | None = None,
) -> Generation:
    """The float32 reference of a run that generated ``tokens``, one stage's weights in memory at a time.

    Its prompt logits and, at each decode position, its argmax and logits given the prompt and the
    run's tokens before it (:func:`~.graph.staged.teacher_forced`). ``ledger``: counts the decoded
    float bytes (alive, peak).
    """
    ids = [*prompt, *tokens[:-1]]
    weights = stages(session, resolved, contract, ids, ledger or FloatLedger())
    return teacher_forced(contract, weights, prompt, tokens)
