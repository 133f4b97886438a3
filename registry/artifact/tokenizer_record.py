"""The tokenizer a checkpoint carries, as push records it in the manifest's ``model.tokenizer``.

A :class:`TokenizerRecord` names the bytes that define the tokenizer, each by the digest the manifest
already holds for it, so a consumer verifies exactly what it loads:

* ``source="tokenizer.json"``: the Hugging Face files (``tokenizer.json``, and ``tokenizer_config.json``
  / ``special_tokens_map.json`` when present), each by its file digest (``end`` is None: the whole file);
* ``source="gguf"``: the GGUF file whose ``tokenizer.ggml.*`` keys hold the vocabulary, by its header
  digest (bytes ``[0, end)`` — :mod:`shardport.registry.artifact.gguf_header`), so the tokenizer is
  checked from one range read of the header, without the tensor data;
* ``source="sentencepiece"``: a ``tokenizer.model`` without a ``tokenizer.json`` (recorded; a runtime
  without sentencepiece refuses to load it).

``digest`` is the sha256 of the canonical JSON of ``parts``: one value that changes when any of them
does. Pure: :func:`tokenizer_record` reads no file. A record of a newer ``version`` or an unknown
``source`` parses (and is written back unchanged); the loader refuses it by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import rfc8785
from pydantic import BaseModel, ConfigDict, Field

from shardport.registry.artifact.digests import Digest
from shardport.registry.artifact.hashing import digest_bytes

TokenizerSource = Literal["tokenizer.json", "gguf", "sentencepiece"]
HF_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
"""The Hugging Face tokenizer files recorded, in this order, when present at the checkpoint root."""


class TokenizerPart(BaseModel):
    """One file's bytes the tokenizer is made of: ``[0, end)`` (``end`` None: the whole file)."""

    model_config = ConfigDict(frozen=True, extra="allow")
    path: str
    digest: Digest
    end: int | None = Field(default=None, ge=0)


class TokenizerRecord(BaseModel):
    """The checkpoint's tokenizer: where it lives and the digests of its bytes."""

    model_config = ConfigDict(frozen=True, extra="allow")
    version: int = Field(default=1, ge=1)
    source: str
    parts: tuple[TokenizerPart, ...]
    digest: Digest

    def part(self, path: str) -> TokenizerPart | None:
        """The recorded part for ``path``, or None."""
        return next((p for p in self.parts if p.path == path), None)


def parts_digest(parts: tuple[TokenizerPart, ...]) -> str:
    """The digest of a record's parts (canonical JSON of path, digest and end)."""
    return digest_bytes(rfc8785.dumps([[p.path, p.digest, p.end] for p in parts]))


def make_record(source: TokenizerSource, parts: tuple[TokenizerPart, ...]) -> TokenizerRecord:
    """A record with its combined digest."""
    return TokenizerRecord(source=source, parts=parts, digest=parts_digest(parts))


def tokenizer_record(
    file_digests: Mapping[str, str],
    gguf_headers: Mapping[str, tuple[int, str]],
    gguf_has_tokenizer: bool,
) -> TokenizerRecord | None:
    """The record for a checkpoint, or None when it carries no tokenizer.

    ``file_digests``: every file's path → digest; ``gguf_headers``: each GGUF file's path → (header end,
    header digest); ``gguf_has_tokenizer``: whether the GGUF metadata holds ``tokenizer.ggml.tokens``.
    A ``tokenizer.json`` wins over a GGUF vocabulary (it is what transformers would load); the GGUF
    tokenizer is the first GGUF file's (split GGUFs carry it in the first shard).
    """
    if "tokenizer.json" in file_digests:
        parts = tuple(TokenizerPart(path=p, digest=file_digests[p]) for p in HF_FILES if p in file_digests)
        return make_record("tokenizer.json", parts)
    if gguf_has_tokenizer and gguf_headers:
        path = sorted(gguf_headers)[0]
        end, digest = gguf_headers[path]
        return make_record("gguf", (TokenizerPart(path=path, digest=digest, end=end),))
    if "tokenizer.model" in file_digests:
        parts = tuple(
            TokenizerPart(path=p, digest=file_digests[p])
            for p in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json")
            if p in file_digests
        )
        return make_record("sentencepiece", parts)
    return None
