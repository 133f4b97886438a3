"""The reference run stage by stage in one process: only one stage's weights alive at a time.

:func:`teacher_forced` runs a sequence of single-process pipeline stages (each a :class:`RankModel`
over a :class:`RankWeights` at tp = 1: the embedding alone, one layer, the final norm and head alone,
or any mix) over the prompt and a run's generated tokens. A :class:`HandOff` pipe carries each stage's
hidden states to the next; a stage is dropped before the next one is taken from the iterable, so a
caller that yields stages lazily (decoding one layer's weights at a time) bounds its float weights by
the largest stage.

Every stage replays the same schedule a greedy ``generate`` runs: a prefill over the prompt, then one
cached decode step per token but the last, fed the run's tokens (teacher forcing). Each layer sees
exactly the inputs, shapes and cache it would see in :meth:`RankModel.generate` of the whole model on
the same tokens, so the logits are the same floating-point results as the whole-model reference's as
long as the run's tokens are the reference's greedy tokens, and the reference's argmax at each decode
position says whether they are.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

import torch

from shardport.registry.contracts.graph import GraphContract

from ..errors import GraphLayoutError, GraphWeightError
from .collectives import LocalGroup, Mesh
from .layout import single_layout
from .model import Generation, RankModel
from .weights import Lookup, RankWeights


class HandOff:
    """A pipe between consecutive stages run one after another in this process.

    A stage's ``send_next`` calls queue its hidden states; :meth:`advance` makes them the next stage's
    ``recv_prev`` inputs, in order. ``share_last`` is the identity (the caller keeps the last stage's).
    """

    def __init__(self) -> None:
        self.inbox: deque[torch.Tensor] = deque()
        self.outbox: deque[torch.Tensor] = deque()

    def send_next(self, x: torch.Tensor) -> None:
        """Queue ``x`` for the next stage."""
        self.outbox.append(x)

    def recv_prev(self, like: torch.Tensor) -> torch.Tensor:
        """The previous stage's next hidden states (shaped like ``like``)."""
        if not self.inbox:
            raise GraphLayoutError("hand-off: a stage expects hidden states the previous stage did not send")
        x = self.inbox.popleft()
        if x.shape != like.shape or x.dtype != like.dtype:
            raise GraphLayoutError(
                f"hand-off: expected {list(like.shape)} {like.dtype}, found {list(x.shape)} {x.dtype}"
            )
        return x

    def share_last(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` itself (one process)."""
        return x

    def advance(self) -> None:
        """End a stage: what it sent becomes the next stage's input."""
        if self.inbox:
            raise GraphLayoutError(f"hand-off: a stage left {len(self.inbox)} hidden states unread")
        self.inbox, self.outbox = self.outbox, deque()


def row_lookup(ids: Sequence[int], rows: torch.Tensor) -> Lookup:
    """An embedding lookup holding only the rows of ``ids`` (sorted, distinct; ``rows[i]`` is ``ids[i]``'s).

    Asking for any other id is a :class:`GraphWeightError` naming it.
    """
    held = torch.as_tensor(list(ids), dtype=torch.long)
    if rows.shape[0] != held.numel() or bool((held[1:] <= held[:-1]).any()):
        raise GraphWeightError(f"row lookup: {held.numel()} sorted distinct ids for {rows.shape[0]} rows")
    table = rows.to(torch.float32)

    def lookup(wanted: torch.Tensor) -> torch.Tensor:
        at = torch.searchsorted(held, wanted).clamp(max=max(held.numel() - 1, 0))
        missing = held[at] != wanted
        if bool(missing.any()):
            raise GraphWeightError(f"row lookup: ids {wanted[missing].tolist()} are not among the held rows")
        return table[at]

    return lookup


def teacher_forced(
    contract: GraphContract, stages: Iterable[RankWeights], prompt: Sequence[int], tokens: Sequence[int]
) -> Generation:
    """The reference's logits over ``prompt`` and a run's greedy ``tokens``, one stage at a time.

    ``stages``: tp = 1 weights in pipeline order, the first holding the embedding, the last (the first
    with a head) the final norm and the output head. Returns the prompt's logits, the reference's argmax
    at each decode position and its logits there (row ``j``: the logits decode step ``j`` chooses from,
    given the prompt and ``tokens[:j]``).
    """
    if not tokens:
        raise GraphLayoutError("teacher-forced reference: no generated tokens to check")
    chunks = [list(prompt), *([t] for t in tokens[:-1])]
    pipe, logits = HandOff(), list[torch.Tensor]()
    first, done = True, False
    for weights in stages:
        if done:
            raise GraphWeightError("teacher-forced reference: a stage after the one with the output head")
        done = weights.head is not None
        mesh = Mesh(tp=LocalGroup(), stage=LocalGroup(), pipe=pipe, first=first, last=done)
        model = RankModel(contract, single_layout(contract), weights, mesh)
        del weights  # the stage's weights live only in ``model`` now
        cache = model.new_cache()
        for chunk in chunks:
            out = model.forward(chunk, cache)
            if done:
                logits.append(out)
        del model, cache  # free the stage before the next one is made
        pipe.advance()
        first = False
    if not done:
        raise GraphWeightError("teacher-forced reference: no stage held the final norm and output head")
    prompt_logits = logits[0]
    rows = torch.stack([prompt_logits[-1], *(x[-1] for x in logits[1:])])
    chosen = tuple(int(torch.argmax(row)) for row in rows)
    return Generation(prompt_logits, chosen, rows)
