"""Errors of the kernels package.

Every message names the weight (and rank slice), what was expected and what was found, and what to do.
Torch exceptions are wrapped once, where a kernel is called, with the cause chained.

Tree::

    ShardportError
    └── KernelError                         (1)
        ├── RankWeightError                 (5)  the rank-local planes do not fit the weight's contract
        │                                        (shape, slice start off a group/block boundary, ...)
        ├── NoAdmissibleKernelError         (5)  no candidate kernel is admissible under the policy;
        │   │                                    lists every candidate's refusal
        │   └── FallbackForbiddenError      (5)  the only admissible kernels need a fallback the
        │                                        policy forbids (lists them)
        ├── KernelInputError                (5)  a plane's values would break the kernel (out-of-range
        │                                        code, short scale plane): caught before calling it
        ├── IsaMismatchError                (1)  a prepared packed layout is run under another CPU ISA
        │                                        than the one that packed it
        ├── NotPersistableError             (2)  a prepared (ISA-keyed) layout was asked to be pickled
        ├── ActivationError                 (2)  activations of the wrong shape or dtype for the kernel
        ├── ByteMapError                    (1)  the int4pack byte map learnt from torch's converter is
        │                                        not a bijection, not block-periodic, or disagrees with
        │                                        the converter or the kernel (the map is not used)
        └── ParityError                     (1)  a parity-ladder level failed (codes, decode, witness,
                                                 operator error over tolerance)
"""

from __future__ import annotations

from typing import Any

from shardport import ShardportError


class KernelError(ShardportError):
    """Base of every kernels error."""

    exit_code = 1

    def __init__(self, weight: str, what: str, expected: Any, found: Any, remedy: str | None = None) -> None:
        self.weight, self.what, self.expected, self.found, self.remedy = weight, what, expected, found, remedy
        text = f"{weight}: {what}: expected {expected}, found {found}"
        super().__init__(f"{text}; {remedy}" if remedy else text)


class RankWeightError(KernelError):
    """The planes a rank holds do not fit the weight's contract and slice."""

    exit_code = 5


class NoAdmissibleKernelError(KernelError):
    """No candidate kernel is admissible for a weight; the message lists every candidate's reason."""

    exit_code = 5


class FallbackForbiddenError(NoAdmissibleKernelError):
    """The admissible kernels all need a fallback (generic, full dequant) that the policy forbids."""

    exit_code = 5


class KernelInputError(KernelError):
    """A plane's values would make the kernel read out of bounds or corrupt a neighbour."""

    exit_code = 5


class IsaMismatchError(KernelError):
    """A packed layout prepared under one CPU ISA is run under another (its bytes would be misread)."""


class NotPersistableError(KernelError):
    """A prepared layout is a load-time product keyed by ISA; it is never pickled or written."""

    exit_code = 2


class ActivationError(KernelError):
    """Activations whose shape or dtype the prepared kernel does not take."""

    exit_code = 2


class ByteMapError(KernelError):
    """The byte map learnt from torch's int4pack converter is refused: the codes are read another way."""


class ParityError(KernelError):
    """A parity-ladder level failed: codes changed, decode differs, or the operator error is too large."""
