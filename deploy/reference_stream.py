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

:func:`driver_reference` is what the driver runs: the same stages (:func:`decoded_stages`) fed to
transformers' own decoder layers (:mod:`.reference_hf`), independent of the graph's code, and this
graph reference only where transformers is absent or lacks the architecture (the result says which).
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


DECODE_CHUNK_BYTES = 4 * 2**20
"""Float32 bytes of rows decoded per call: the reference decoders' int64 and float temporaries stay a
few times this, not a few times the weight (a 32000 x 2048 Q8_0 embedding would need ~1 GiB at once).
4 MiB (was 16): at the 170 MiB bring-up benchmark the driver's peak is ~35 MiB lower, as fast."""


class _Decoded(Mapping[str, torch.Tensor]):
    """One stage's weights, decoded to float32 on each lookup (nothing cached): ``name -> [N, K]``.

    A weight is decoded in chunks of rows of at most ``chunk_bytes`` float32 bytes into its result
    (the decoders are row-wise: the same values as one call).
    """

    def __init__(
        self,
        planes: dict[str, dict[str, Any]],
        weights: Mapping[str, LogicalWeight],
        ledger: FloatLedger,
        chunk_bytes: int = DECODE_CHUNK_BYTES,
    ) -> None:
        self.planes, self.weights, self.ledger, self.chunk_bytes = planes, weights, ledger, chunk_bytes

    def _decode(self, name: str, rows: Sequence[int] | None) -> torch.Tensor:
        from shardport.registry.contracts.decode import decode_weight

        weight, planes = self.weights[name], self.planes[name]
        shape = weight.shape
        wanted = range(shape.rows) if rows is None else list(rows)
        step = max(1, self.chunk_bytes // (4 * shape.columns))
        if len(wanted) <= step:
            out = np.ascontiguousarray(decode_weight(weight, planes, rows), dtype=np.float32)
        else:
            out = np.empty((len(wanted), shape.columns), dtype=np.float32)
            for at in range(0, len(wanted), step):
                out[at : at + step] = decode_weight(weight, planes, wanted[at : at + step])
            if rows is None:
                out = out.reshape(shape.extents)
        return torch.from_numpy(self.ledger.track(out))

    def release(self, name: str) -> None:
        """Drop weight ``name``'s quantized planes (decoded, it is not needed again); then it is absent."""
        self.planes.pop(name, None)

    def need(self, name: str, rows: Sequence[int] | None = None) -> torch.Tensor:
        """Weight ``name`` (only ``rows`` of it: ``[len(rows), K]``), decoded; a typed error if absent."""
        if name not in self.planes:
            raise GraphWeightError(f"tensor {name}: the model needs it and the checkpoint has none")
        return self._decode(name, rows)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.planes:
            raise KeyError(name)
        return self._decode(name, None)

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


def decoded_stages(
    session: Session,
    resolved: Resolved,
    contract: GraphContract,
    ledger: FloatLedger,
    chunk_bytes: int = DECODE_CHUNK_BYTES,
) -> Iterator[_Decoded]:
    """Each pipeline stage of ``pp = layers``, its weights decoded on lookup.

    Stage ``s`` holds layer ``s``, the first the embedding too, the last the final norm and head; each
    is loaded only when the previous one is done (drop it before taking the next).
    """
    weights = {w.name: w for w in resolved.manifest.weights or []}
    for stage in range(contract.layers):
        planes = _stage_planes(session, resolved, contract.layers, stage)
        decoded = _Decoded(planes, weights, ledger, chunk_bytes)
        del planes
        yield decoded
        del decoded  # this stage's quantized planes, before the next stage is loaded


def stages(
    session: Session,
    resolved: Resolved,
    contract: GraphContract,
    ids: Sequence[int],
    ledger: FloatLedger,
    chunk_bytes: int = DECODE_CHUNK_BYTES,
) -> Iterator[RankWeights]:
    """The graph reference's stages, each decoded only when the previous one is done.

    The embedding's rows of ``ids``, every layer, then the final norm and the head (the embedding when
    tied); each pipeline stage's quantized planes are loaded once and dropped before the next's.
    """
    embed, norm, head = end_names(contract)
    split, last = single_split(contract), contract.layers - 1
    for stage, decoded in enumerate(decoded_stages(session, resolved, contract, ledger, chunk_bytes)):
        if stage == 0:
            held = sorted(set(ids))
            yield RankWeights(layers=(), embed=row_lookup(held, decoded.need(embed, held)))
        layer = shard_layer(float_layer(contract, decoded, stage), stage, contract, split, 0)
        yield RankWeights(layers=(layer,))
        del layer
        if stage == last:
            yield RankWeights(
                layers=(), norm=decoded.need(norm), head=float_linear(decoded.need(head or embed))
            )
        del decoded


def streamed_reference(
    session: Session,
    resolved: Resolved,
    contract: GraphContract,
    prompt: Sequence[int],
    tokens: Sequence[int],
    ledger: FloatLedger | None = None,
    chunk_bytes: int = DECODE_CHUNK_BYTES,
) -> Generation:
    """The float32 reference of a run that generated ``tokens``, one stage's weights in memory at a time.

    Its prompt logits and, at each decode position, its argmax and logits given the prompt and the
    run's tokens before it (:func:`~.graph.staged.teacher_forced`). ``ledger``: counts the decoded
    float bytes (alive, peak); ``chunk_bytes``: rows decoded per call (:data:`DECODE_CHUNK_BYTES`).
    """
    ids = [*prompt, *tokens[:-1]]
    weights = stages(session, resolved, contract, ids, ledger or FloatLedger(), chunk_bytes)
    return teacher_forced(contract, weights, prompt, tokens)


def driver_reference(
    session: Session,
    resolved: Resolved,
    contract: GraphContract,
    prompt: Sequence[int],
    tokens: Sequence[int],
    ledger: FloatLedger | None = None,
    chunk_bytes: int = DECODE_CHUNK_BYTES,
) -> tuple[Generation, dict[str, str]]:
    """The driver's L4 reference of a run that generated ``tokens``, and what computed it.

    transformers' own decoder layers (:mod:`.reference_hf`), streamed and teacher-forced like the graph
    reference: ``{"kind": "transformers", "version", "class"}``; where transformers is absent or lacks
    the architecture, the graph reference (:func:`streamed_reference`): ``{"kind": "shardport-graph",
    "why"}``.
    """
    from .reference_hf import hf_teacher_forced, transformers_classes

    ledger = ledger or FloatLedger()
    classes = transformers_classes(contract)
    if isinstance(classes, str):
        generation = streamed_reference(session, resolved, contract, prompt, tokens, ledger, chunk_bytes)
        return generation, {"kind": "shardport-graph", "why": classes}
    decoded = decoded_stages(session, resolved, contract, ledger, chunk_bytes)
    rows = max(1, chunk_bytes // (4 * contract.hidden))  # the head's vocabulary rows decoded at a time
    generation = hf_teacher_forced(contract, classes, decoded, prompt, tokens, ledger.track, rows)
    return generation, classes.source
