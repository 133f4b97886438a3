"""Errors of the bring-up (``registry up``): each names the rank and what failed there."""

from __future__ import annotations

from shardport import ShardportError


class DeployError(ShardportError):
    """A bring-up failed."""

    exit_code = 1


class ClusterError(DeployError):
    """Ray could not be started or joined, or the cluster cannot place the ranks."""

    exit_code = 6


class RankFailedError(DeployError):
    """A rank failed validation, admission or I/O; the bring-up was aborted with that rank's reason.

    The exit status is the rank's own error's (1 verification, 5 refused input, 6 unavailable, ...).
    """

    def __init__(self, rank: int, stage: str, kind: str, message: str, exit_code: int) -> None:
        super().__init__(f"rank {rank} failed at {stage}: {kind}: {message}")
        self.rank, self.stage, self.kind, self.reason = rank, stage, kind, message
        self.exit_code = exit_code


class RankLostError(DeployError):
    """A rank's process died (its actor was killed or crashed) before it reported."""

    exit_code = 6


class ParityError(DeployError):
    """The bring-up ran but its logits or tokens disagree with the reference beyond the tolerance."""

    exit_code = 1


class UnsupportedModelError(DeployError):
    """The runtime does not implement this architecture or one of its operators (refused at plan time)."""

    exit_code = 5
