"""Container gates: validate untrusted safetensors and GGUF headers before anything else reads them.

Consumes: a checkpoint file path, or any :class:`ByteSource` (``name``, ``size``, ``read(offset,
length)``), so the same gate runs over a local file or a range-read remote object; for sharded
Hugging Face checkpoints, the path of ``model.safetensors.index.json``.

Produces: frozen records whose byte ranges are proven to lie inside the file without overlap —
:class:`SafetensorsHeader` (tensors as :class:`TensorRecord`), :class:`GGUFHeader` (tensors as
:class:`GGUFTensorRecord`), :class:`ShardedCheckpoint` — or one named
:class:`~shardport.registry.formats.errors.ContainerError` subclass (CLI exit code 5) whose message
names the file, tensor, field, expected and found. Reads are bounded by the caps in
:class:`SafetensorsLimits` / :class:`GGUFLimits`. No torch; the ``gguf`` package is used only
for its table of ggml block sizes.

A check of a field no loader reads (an index's ``total_size``, an unknown tensor-entry field, a GGUF
string value that is not UTF-8) hands its error to the ``notes`` collector when one is given
(:class:`~shardport.registry.formats.notes.Notes`: a note, or the error under ``strict``); without one it
raises.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardport._lazy import lazy_exports

if TYPE_CHECKING:
    from .errors import ContainerError
    from .gguf_gate import GGUFArray, GGUFHeader, GGUFLimits, GGUFTensorRecord, parse_gguf, parse_gguf_source
    from .safetensors_gate import (
        SafetensorsHeader,
        SafetensorsLimits,
        TensorRecord,
        parse_safetensors,
        parse_safetensors_source,
    )
    from .shard_index import ShardedCheckpoint, ShardIndex, validate_sharded_checkpoint
    from .source import ByteSource, BytesSource, FileSource

#: Where each exported name lives; imported on first use (PEP 562), so that a module of this package
#: (the element table, gate notes) can be imported without loading the gates (numpy, gguf).
_HOME = {
    "ContainerError": "errors",
    **dict.fromkeys(
        ("GGUFArray", "GGUFHeader", "GGUFLimits", "GGUFTensorRecord", "parse_gguf", "parse_gguf_source"),
        "gguf_gate",
    ),
    **dict.fromkeys(
        (
            "SafetensorsHeader",
            "SafetensorsLimits",
            "TensorRecord",
            "parse_safetensors",
            "parse_safetensors_source",
        ),
        "safetensors_gate",
    ),
    **dict.fromkeys(("ShardedCheckpoint", "ShardIndex", "validate_sharded_checkpoint"), "shard_index"),
    **dict.fromkeys(("ByteSource", "BytesSource", "FileSource"), "source"),
}

__getattr__ = lazy_exports(__name__, globals(), _HOME)

__all__ = [
    "ByteSource",
    "BytesSource",
    "ContainerError",
    "FileSource",
    "GGUFArray",
    "GGUFHeader",
    "GGUFLimits",
    "GGUFTensorRecord",
    "SafetensorsHeader",
    "SafetensorsLimits",
    "ShardIndex",
    "ShardedCheckpoint",
    "TensorRecord",
    "parse_gguf",
    "parse_gguf_source",
    "parse_safetensors",
    "parse_safetensors_source",
    "validate_sharded_checkpoint",
]
