"""How long the driver waits for the ranks at each stage, scaled to the work (pure).

A rank that stops answering (its process stopped, its node frozen, a collective hung) is declared lost
once its stage's time is up, and the bring-up is aborted (or relaunched under ``--retries``). The time
is a floor plus the stage's bytes at a deliberately slow rate, so that a big model on a slow store is
never cut short and a small one is not waited on for ten minutes:

* ``prepare`` (fetch, verify, repack, ladder): ``FLOOR_S`` + the rank's share of the checkpoint at
  ``PREPARE_RATE`` bytes/s;
* ``run`` (join, warm-up, prefill, decode, cache check): ``FLOOR_S`` + the rank's share read once per
  forward (the prompt, every generated token, the cache check's replay) at ``RUN_RATE`` bytes/s.

``registry up --stage-timeout S`` replaces both with ``S`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOOR_S = 120.0
PREPARE_RATE = 4 * 2**20
RUN_RATE = 16 * 2**20
PLACEMENT_S = 120.0
"""How long the placement group may take to schedule (all ranks' resources free at once)."""


@dataclass(frozen=True)
class StageTimeouts:
    """Seconds the driver waits for every rank's answer to ``prepare`` and to ``run``."""

    prepare: float
    run: float

    def of(self, stage: str) -> float:
        """The timeout of ``stage``: ``run``'s for the run, ``prepare``'s for every stage before it.

        The stages before the run: a node's shared read, the preparation, rank 0's rendezvous.
        """
        return self.run if stage == "run" else self.prepare


def stage_timeouts(
    model_bytes: int, world: int, steps: int, *, override: float | None = None
) -> StageTimeouts:
    """The stage timeouts for a model of ``model_bytes`` on ``world`` ranks generating ``steps`` tokens."""
    if override is not None:
        return StageTimeouts(float(override), float(override))
    share = max(0, model_bytes) / max(1, world)
    forwards = 2 * max(1, steps) + 2
    return StageTimeouts(
        prepare=round(FLOOR_S + share / PREPARE_RATE, 1),
        run=round(FLOOR_S + share * forwards / RUN_RATE, 1),
    )
