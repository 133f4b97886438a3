"""Errors of the container gates: one named error per way an untrusted file can be malformed.

Every error carries the CLI exit code 5 (refused input) and names the file, the tensor (when there is
one), the field, what was expected and what was found, plus a remedy where one exists. The parts are
also kept as attributes (``file``, ``tensor``, ``field``, ``expected``, ``found``, ``remedy``) so that
callers can render them without parsing the message.

Tree::

    RefusedError                           (shardport.registry.errors)
    └── ContainerError                     (5)  any container parse failure
        ├── ContainerReadError                  the bytes could not be read (cause chained)
        ├── TruncatedFileError                  the file ends inside a header structure
        ├── HeaderTooLargeError                 the header exceeds the configured cap
        ├── HeaderLengthError                   safetensors: header length does not fit the file
        ├── HeaderEncodingError                 header, key or name is not UTF-8
        ├── HeaderJSONError                     safetensors: not JSON (or NaN, or nested too deep)
        ├── HeaderNotObjectError                safetensors: the JSON is not an object
        ├── DuplicateKeyError                   repeated JSON key, GGUF key or tensor name
        ├── TensorEntryError                    a tensor entry lacks a field or has a wrong type
        ├── MetadataTypeError                   safetensors ``__metadata__`` is not str → str
        ├── UnknownDtypeError                   safetensors dtype outside the allow-list
        ├── ShapeOverflowError                  a shape's element or byte count exceeds the bound
        ├── TensorSizeMismatchError             shape x dtype size ≠ the offset interval
        ├── TensorOutOfBoundsError              a tensor's bytes lie (partly) outside the data
        ├── TensorOverlapError                  two tensors share bytes
        ├── TensorGapError                      safetensors: bytes between tensors belong to none
        ├── TrailingBytesError                  safetensors: bytes after the last tensor
        ├── BadMagicError                       GGUF: the file does not start with ``GGUF``
        ├── UnsupportedVersionError             GGUF: version other than 2 or 3
        ├── CountLimitError                     GGUF: tensor or KV count beyond cap or file
        ├── StringLengthError                   GGUF: a string longer than cap or file
        ├── ArrayLengthError                    GGUF: an array longer than the file can hold
        ├── ValueTypeError                      GGUF: unknown KV value type or nesting too deep
        ├── AlignmentError                      GGUF: ``general.alignment`` unusable
        ├── MisalignedTensorError               GGUF: a tensor offset is not aligned
        ├── DimensionError                      GGUF: n_dims outside 1..4
        ├── UnknownGGMLTypeError                GGUF: ggml type number not in the table
        ├── BlockSizeError                      GGUF: ne0 not a multiple of the block size
        ├── TensorLayoutError                   GGUF: offsets do not follow the padding recurrence
        ├── QuantizationVersionError            GGUF: ``general.quantization_version`` not one ggml defines
        ├── ShardIndexError                     HF index JSON malformed or unsafe
        ├── ShardMissingError                   a shard named by the index does not exist
        ├── ShardMembershipError                tensor in no shard, two shards, or the wrong one
        ├── TotalSizeMismatchError              index ``total_size`` ≠ sum of tensor bytes
        └── NonFiniteValueError                 a float tensor holds NaN or ±inf (a note only under
                                                ``--allow-nonfinite``, and never for a quantized plane)
"""

from __future__ import annotations

from functools import partial

from shardport.registry.errors import RefusedError


# mypy cannot follow the editable install's package-dir mapping, so RefusedError may type as Any.
class ContainerError(RefusedError):  # type: ignore[misc, unused-ignore]
    """A checkpoint container (safetensors, GGUF, sharded index) is malformed or hostile."""

    exit_code = 5

    def __init__(
        self,
        file: str,
        *,
        field: str,
        expected: str,
        found: str,
        tensor: str | None = None,
        remedy: str | None = None,
    ) -> None:
        self.file = file
        self.tensor = tensor
        self.field = field
        self.expected = expected
        self.found = found
        self.remedy = remedy
        where = f"{file}: tensor {tensor!r}: " if tensor is not None else f"{file}: "
        message = f"{where}{field}: expected {expected}, found {found}"
        if remedy:
            message += f" (remedy: {remedy})"
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        """Pickle with the keyword fields (the default would pass only the message)."""
        rebuild = partial(
            type(self),
            self.file,
            field=self.field,
            expected=self.expected,
            found=self.found,
            tensor=self.tensor,
            remedy=self.remedy,
        )
        return (rebuild, ())


class ContainerReadError(ContainerError):
    """The bytes of the container could not be read (the ``OSError`` is chained)."""


class TruncatedFileError(ContainerError):
    """The file ends before a header structure that it declares."""


class HeaderTooLargeError(ContainerError):
    """The header is larger than the configured cap (a cap keeps a hostile file from exhausting memory)."""


class HeaderLengthError(ContainerError):
    """The safetensors header length prefix does not fit inside the file."""


class HeaderEncodingError(ContainerError):
    """A header, key or tensor name is not valid UTF-8."""


class HeaderJSONError(ContainerError):
    """The safetensors header is not valid JSON (NaN/Infinity and excessive nesting count as invalid)."""


class HeaderNotObjectError(ContainerError):
    """The safetensors header JSON is valid but not an object."""


class DuplicateKeyError(ContainerError):
    """A JSON key, GGUF metadata key or tensor name occurs twice."""


class TensorEntryError(ContainerError):
    """A tensor entry lacks a field, has an unknown field, or a field has the wrong type or range."""


class MetadataTypeError(ContainerError):
    """The safetensors ``__metadata__`` entry is not an object mapping strings to strings."""


class UnknownDtypeError(ContainerError):
    """A safetensors dtype is not on the allow-list."""


class ShapeOverflowError(ContainerError):
    """A shape's element count or byte size exceeds the bound (2**62) used for overflow safety."""


class TensorSizeMismatchError(ContainerError):
    """A tensor's shape x dtype size does not equal the length of its offset interval."""


class TensorOutOfBoundsError(ContainerError):
    """A tensor's bytes lie (partly) outside the data region of the file."""


class TensorOverlapError(ContainerError):
    """Two tensors claim the same bytes."""


class TensorGapError(ContainerError):
    """Bytes between two safetensors tensors belong to no tensor."""


class TrailingBytesError(ContainerError):
    """Bytes after the last safetensors tensor belong to no tensor."""


class BadMagicError(ContainerError):
    """The file does not start with the GGUF magic."""


class UnsupportedVersionError(ContainerError):
    """The GGUF version is not 2 or 3 (or the file is big-endian)."""


class CountLimitError(ContainerError):
    """A GGUF tensor or KV count exceeds its cap or what the file could hold."""


class StringLengthError(ContainerError):
    """A GGUF string is longer than its cap or than the bytes that remain."""


class ArrayLengthError(ContainerError):
    """A GGUF array is longer than the bytes that remain could hold."""


class ValueTypeError(ContainerError):
    """A GGUF KV value type is unknown, or arrays are nested deeper than the cap."""


class AlignmentError(ContainerError):
    """``general.alignment`` is not a nonzero power of two stored as UINT32."""


class MisalignedTensorError(ContainerError):
    """A GGUF tensor offset is not a multiple of the alignment."""


class DimensionError(ContainerError):
    """A GGUF tensor has a number of dimensions outside 1..4."""


class UnknownGGMLTypeError(ContainerError):
    """A GGUF tensor has a ggml type number that is not in the known table."""


class BlockSizeError(ContainerError):
    """A GGUF tensor's first dimension (ne0) is not a multiple of its type's block size."""


class TensorLayoutError(ContainerError):
    """GGUF tensor offsets do not follow the padding recurrence (each = previous end, padded)."""


class QuantizationVersionError(ContainerError):
    """GGUF: ``general.quantization_version`` is not a UINT32 version the gguf package defines (2).

    Version 1 files (llama.cpp before May 2023) lay out Q4_0/Q4_1/Q8_0 blocks differently; a decoder
    for version 2 would read them wrong, so they are refused rather than misread.
    """


class ShardIndexError(ContainerError):
    """A ``model.safetensors.index.json`` is not a well-formed, safe index."""


class ShardMissingError(ContainerError):
    """A shard that the index names does not exist."""


class ShardMembershipError(ContainerError):
    """A tensor is in no shard, in two shards, or not in the shard the index names."""


class TotalSizeMismatchError(ContainerError):
    """The index ``metadata.total_size`` is not the sum of the tensors' data bytes."""


class NonFiniteValueError(ContainerError):
    """A float tensor (F64/F32/F16/BF16/F8, or a GGUF F32/F16/BF16/F64 tensor) holds NaN or ±inf.

    ``found`` names the first non-finite element by its flat (row-major) index and counts the rest.
    """
