"""Errors of the direct GGUF block kernel and the CPU int8 weight-only kernel.

Every error names the weight, the argument or field, what was expected and what was found, and says
what to do about it. They are refused input for the CLI (exit code 5): the planes handed to the
kernel do not match the numeric contract (GGUF type, K) the caller claims, so nothing may run.

Tree::

    RefusedError                               (shardport.registry.errors)
    └── KernelInputError                  (5)  a kernel's operands are not as its contract says
        ├── UnknownGgmlTypeError               a GGUF type this kernel cannot decode
        ├── BlockAlignmentError                K (or a slice start) is not a whole number of blocks
        ├── RowBytesError                      the block plane is not [N, K / block * type_size]
        ├── BlockDtypeError                    the block plane is not a uint8 numpy array
        ├── NonContiguousBlocksError           the block plane is not C-contiguous (a column slice)
        ├── ActivationError                    x is not a [T, K] float32/bfloat16/float16 CPU tensor
        ├── WorkspaceError                     tile_rows is not a positive integer
        └── Int8ContractError                  int8 codes/scales do not fit _weight_int8pack_mm
"""

from __future__ import annotations

from shardport.registry.errors import FieldRefusedError


class KernelInputError(FieldRefusedError):
    """A kernel's operands are not as its contract says.

    Attributes ``tensor``, ``field``, ``expected`` and ``found`` hold the parts of the message.
    """

    exit_code = 5


class UnknownGgmlTypeError(KernelInputError):
    """The GGUF type is not one the kernel decodes (unknown, or no dequantizer exists for it)."""


class BlockAlignmentError(KernelInputError):
    """K (or where the rank's slice starts) is not a whole number of the type's blocks."""


class RowBytesError(KernelInputError):
    """The block plane's shape disagrees with [N, K / block_size * type_size] of the type."""


class BlockDtypeError(KernelInputError):
    """The block plane is not a uint8 numpy array of raw GGUF bytes."""


class NonContiguousBlocksError(KernelInputError):
    """The block plane is not C-contiguous: rows must be whole runs of blocks."""


class ActivationError(KernelInputError):
    """The activation is not a [T, K] float CPU tensor of an accepted dtype."""


class WorkspaceError(KernelInputError):
    """The tile size asked for is not a positive integer."""


class Int8ContractError(KernelInputError):
    """Codes or scales do not fit the int8 weight-only kernel's contract (per-channel scales)."""
