"""Errors of the deploy package: the runtime graph and the bring-up (``registry up``).

Tree::

    ShardportError
    └── DeployError                  (1)
        ├── GraphLayoutError         (5)  a rank layout or mesh the graph cannot run (ranges that do not
        │                                 cover the vocabulary, query heads without their kv head)
        ├── GraphWeightError         (5)  a rank's weights do not fit the contract and layout (a missing
        │                                 operator, a linear returning the wrong width)
        ├── UnsupportedModelError    (5)  an architecture or operator the runtime does not implement
        ├── ClusterError             (6)  Ray could not be started or joined, or cannot place the ranks
        │   └── ClusterSettingsError (2)  the environment asks for an embedded head we refuse to start
        │                                 (authentication disabled without SHARDPORT_RAY_AUTH=disabled)
        ├── RankFailedError        (rank's)  a rank failed validation, admission or I/O: its reason
        ├── RankLostError            (6)  a rank's process died (actor killed, node gone) before it
        │                                 reported; ``registry up --retries N`` relaunches on this one only
        ├── ParityError              (1)  logits or tokens disagree with the reference beyond tolerance
        └── TokenizerError           (5)  the checkpoint's tokenizer cannot be loaded (``--prompt``)
            ├── NoTokenizerError     (2)  none recorded, or a file it names was not given
            ├── TokenizerDigestError (1)  its bytes are not those recorded at push
            └── UnsupportedTokenizerError (5)  a kind the installed packages cannot build
"""

from __future__ import annotations

from typing import Any

from shardport import ShardportError


class DeployError(ShardportError):
    """Base of every deploy error."""

    exit_code = 1


class GraphLayoutError(DeployError):
    """A rank layout or mesh the runtime graph cannot run."""

    exit_code = 5


class GraphWeightError(DeployError):
    """A rank's weights do not fit the graph contract and its layout."""

    exit_code = 5


class UnsupportedModelError(DeployError):
    """The runtime does not implement this architecture or one of its operators (refused at plan time)."""

    exit_code = 5


class ClusterError(DeployError):
    """Ray could not be started or joined, or the cluster cannot place the ranks."""

    exit_code = 6


class ClusterSettingsError(ClusterError):
    """The environment asks for an embedded Ray head that would be unsafe (token authentication off)."""

    exit_code = 2


class RankFailedError(DeployError):
    """A rank failed validation, admission or I/O; the bring-up was aborted with that rank's reason.

    The exit status is the rank's own error's (1 verification, 5 refused input, 6 unavailable, ...).
    """

    def __init__(self, rank: int, stage: str, kind: str, message: str, exit_code: int) -> None:
        super().__init__(f"rank {rank} failed at {stage}: {kind}: {message}")
        self.rank, self.stage, self.kind, self.reason = rank, stage, kind, message
        self.exit_code = exit_code


class RankLostError(DeployError):
    """A rank's process died (its actor was killed or crashed, its node went away) before it reported.

    ``rank``: the lost rank (the lowest one when several stopped answering; None when unknown);
    ``stage``: the driver's phase when it was lost (``prepare`` or ``run``); ``node``: the node that went
    away with it (id, address, the ranks it ran), None when the node is still alive; ``attempts``: what
    every attempt of a bring-up with retries did (filled by the retry loop when the last attempt was lost).
    The only failure ``registry up --retries`` relaunches: a validation, admission or I/O failure is a
    :class:`RankFailedError` and aborts at once.
    """

    exit_code = 6

    def __init__(self, message: str, *, rank: int | None = None, stage: str = "") -> None:
        super().__init__(message)
        self.rank, self.stage = rank, stage
        self.node: dict[str, Any] | None = None
        self.attempts: list[dict[str, Any]] = []


class ParityError(DeployError):
    """The bring-up ran but its logits or tokens disagree with the reference beyond the tolerance."""

    exit_code = 1


class TokenizerError(DeployError):
    """The checkpoint's tokenizer cannot be loaded (``--prompt``); ``--tokens 1,2,3`` needs none."""

    exit_code = 5


class NoTokenizerError(TokenizerError):
    """The manifest records no tokenizer, or a file it names was not given."""

    exit_code = 2


class TokenizerDigestError(TokenizerError):
    """The tokenizer bytes are not those the manifest recorded at push (tampered or wrong file)."""

    exit_code = 1


class UnsupportedTokenizerError(TokenizerError):
    """A tokenizer kind this runtime cannot build with the installed packages (the message says which)."""
