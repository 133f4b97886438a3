"""Errors of the numeric-contract package.

Every error names the tensor (or logical weight), the contract field, what was expected and what was
found, and says what to do about it. All of them are refused input for the CLI (exit code 5, as for
the container gates), except a malformed ``--declare`` spec, which is a usage error (exit code 2), and
a witness mismatch, which means the bytes lied (a verification failure, exit code 1).

Tree::

    VerificationError, RefusedError            (shardport.registry.errors)
    └── ContractError                     (5)  a contract or its planes are not as they must be
        ├── PlaneMissingError                  a plane the contract names is absent (dropped plane)
        ├── PlaneShapeError                    a plane's shape/dtype disagrees with its equation
        │   ├── PlaneRankError                 a plane has the wrong number of dimensions
        │   └── PlaneDtypeError                a plane's dtype is not one its producer writes
        ├── DeclaredPlaneError                 a declaration names a plane the weight does not
        │                                      hold (absent, another weight's, or another role)
        ├── ContractSchemaError                the planes do not make a valid contract (the
        │                                      pydantic error is chained)
        ├── PlaneSizeError                     a plane's byte count disagrees (truncated plane)
        ├── ScaleShapeError                    scale plane is not [N, ceil(K/G)] on its declared axes
        ├── TailGroupError                     the tail group is missing, extra, or not allowed
        ├── ScaleFormatError                   declared scale format does not fit the plane's dtype
        │   └── ScaleNarrowingError            a wider float plane declared as E8M0 (narrowing)
        ├── ScalePlacementError                a scale placement (layout id) this shardport cannot read
        ├── ScaleValueError                    a scale is not finite
        │   ├── ScaleSignError                 a negative scale where the sign domain is positive
        │   └── GlobalScaleError               a per-tensor global scale not one positive finite f32
        ├── CodeRangeError                     a code (or padding bit) outside its element format
        ├── ZeroPointRangeError                an effective zero point outside the code range
        ├── GroupIndexError                    g_idx out of range or groups of the wrong size
        ├── PermutationError                   a permutation plane that is not a bijection
        ├── WitnessMismatchError          (1)  a re-decode disagrees with the decode witness
        ├── ReferenceErrorTooLargeError        decode is much farther from the float reference
        │                                      than the bit width allows (mislabelled contract)
        ├── UnsupportedContractError           a contract this shardport cannot decode
        ├── GraphContractError                 model parameters that do not make a graph contract
        │   ├── UnsupportedArchitectureError   an architecture the runtime graph does not implement
        │   └── UnsupportedOperatorError       an operator it does not implement (rope scaling type,
        │                                      partial rotary, sliding window, per-layer heads)
        └── ContractAmbiguousError             inference cannot decide; the message says what to
                                               declare
    UsageError                                 (shardport.registry.errors)
    └── DeclareSpecError                       a ``--declare`` spec that is not valid
"""

from __future__ import annotations

from typing import Any

from shardport.registry.errors import FieldRefusedError, UsageError, VerificationError


class ContractError(VerificationError, FieldRefusedError):  # type: ignore[misc, unused-ignore]
    """A numeric contract, or the planes it describes, is not as it must be.

    Attributes ``tensor``, ``field``, ``expected`` and ``found`` hold the parts of the message.
    """

    exit_code = 5


class PlaneMissingError(ContractError):
    """A plane named by the contract is not among the tensors (a dropped plane)."""


class PlaneShapeError(ContractError):
    """A plane's physical shape or dtype disagrees with the contract's equation for it."""


class PlaneRankError(PlaneShapeError):
    """A plane has the wrong number of dimensions (e.g. a 1-D ``weight_scale`` where [N, K/G] is due)."""


class PlaneDtypeError(PlaneShapeError):
    """A plane's dtype is not one its producer writes (e.g. a U8 ``weight_packed``; int32 is packed)."""


class DeclaredPlaneError(ContractError):
    """A declaration names a plane the weight does not hold: absent, another weight's, or another role."""


class ContractSchemaError(ContractError):
    """The planes and settings do not make a valid contract (the pydantic ``ValidationError`` is chained)."""


def schema_error(tensor: str, error: Any) -> ContractSchemaError:
    """A :class:`ContractSchemaError` for a pydantic ``ValidationError`` (its first failure); chain it."""
    first = error.errors()[0] if error.errors() else {"loc": (), "msg": str(error)}
    field = ".".join(str(part) for part in first["loc"]) or "contract"
    return ContractSchemaError(tensor, field, "planes and settings that make a valid contract", first["msg"])


class PlaneSizeError(ContractError):
    """A plane's byte count disagrees with its declared dtype and shape (a truncated plane)."""


class ScaleShapeError(ContractError):
    """The scale plane is not [N, ceil(K/G)] on its declared axes (e.g. a scale that only broadcasts)."""


class TailGroupError(ContractError):
    """The last, partial group along K is missing, extra, or present where the tail rule forbids it."""


class ScaleFormatError(ContractError):
    """The declared scale format cannot be stored in the plane's physical dtype."""


class ScaleNarrowingError(ScaleFormatError):
    """A float plane (e.g. fp16) is declared as E8M0 scales: decoding would narrow it silently."""


class ScaleValueError(ContractError):
    """A scale value is NaN or infinite."""


class ScaleSignError(ScaleValueError):
    """A scale is negative although the contract's sign domain is ``positive``."""


class GlobalScaleError(ScaleValueError):
    """A per-tensor global scale (NVFP4) is not one positive, finite binary32."""


class ScalePlacementError(ContractError):
    """A declared scale placement (layout id) is not one this shardport reads; the message lists them."""


class CodeRangeError(ContractError):
    """A code, or a padding bit, lies outside what the element format allows."""


class ZeroPointRangeError(ContractError):
    """An effective zero point (after the convention is applied) lies outside the code range."""


class GroupIndexError(ContractError):
    """A g_idx plane has values out of range, or groups whose member counts disagree with G."""


class PermutationError(ContractError):
    """A permutation plane is not a bijection of its axis."""


class WitnessMismatchError(ContractError):
    """Re-decoding the witness rows does not reproduce the decode witness.

    The witness is signed evidence of what the bytes decode to, so a mismatch means the stored bytes
    (or the files) lied: a verification failure (exit code 1), not refused input.
    """

    exit_code = 1


class ReferenceErrorTooLargeError(ContractError):
    """The decoded rows are farther from the float reference than the bit width can explain."""


class UnsupportedContractError(ContractError):
    """The contract is valid but this shardport has no reference decoder for it."""


class GraphContractError(ContractError):
    """The model parameters do not make a graph contract (missing, not a number, inconsistent)."""


class UnsupportedArchitectureError(GraphContractError):
    """An architecture the runtime graph does not implement."""


class UnsupportedOperatorError(GraphContractError):
    """An operator (or operator variant) the runtime graph does not implement."""


class ContractAmbiguousError(ContractError):
    """The checkpoint does not say enough to infer a contract; the message says what to declare."""


class InventoryMismatchError(ContractError):
    """The checkpoint's tensors do not match its declared architecture (missing or unexpected slots)."""


class TiedAliasError(ContractError):
    """Weights declared tied (shared) hold different bytes."""


class DeclareSpecError(UsageError):  # type: ignore[misc, unused-ignore]
    """A ``--declare`` spec is malformed or produces an invalid contract."""
