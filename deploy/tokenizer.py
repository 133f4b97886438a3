"""The checkpoint's own tokenizer for ``registry up --prompt``, verified against the manifest.

:func:`load_tokenizer` takes the manifest and the bytes the tokenizer record names (a pulled folder,
or a mapping path → bytes: whole files, or for a GGUF one range read of its header ``[0, end)``),
checks each part against the digest recorded at push (:class:`TokenizerDigestError` otherwise), and
builds a :class:`Tokenizer` with the ``tokenizers`` package (imported when a tokenizer is loaded):

* ``tokenizer.json`` (with ``tokenizer_config.json``): loaded as is; its post-processor adds BOS/EOS;
* GGUF ``tokenizer.ggml.model == "gpt2"``: byte-level BPE from ``tokenizer.ggml.tokens`` and
  ``tokenizer.ggml.merges``, the pre-tokenizer split chosen by ``tokenizer.ggml.pre`` (gpt2 / default,
  llama-bpe); control and user-defined tokens (``token_type`` 3, 4) match atomically; BOS is added
  when ``tokenizer.ggml.add_bos_token`` says so;
* GGUF SentencePiece (``tokenizer.ggml.model == "llama"``): converted by transformers' GGUF tokenizer
  mapping (transformers 5 rebuilds it as a byte-fallback BPE from tokens, scores and token types,
  without the ``sentencepiece`` package); refused with :class:`UnsupportedTokenizerError` when
  transformers is not installed;
* a bare ``tokenizer.model`` (no ``tokenizer.json``) is refused: it needs ``sentencepiece``.

``--tokens 1,2,3`` needs no tokenizer at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardport.deploy.errors import (
    NoTokenizerError,
    TokenizerDigestError,
    TokenizerError,
    UnsupportedTokenizerError,
)
from shardport.registry.artifact.hashing import digest_bytes
from shardport.registry.artifact.manifest import Manifest
from shardport.registry.artifact.tokenizer_record import TokenizerPart, TokenizerRecord, parts_digest
from shardport.registry.families.llama import GGUF_ARCHITECTURE_KEY
from shardport.registry.formats.gguf_gate import GGUFArray, GGUFLimits, parse_gguf_metadata
from shardport.registry.formats.notes import Notes
from shardport.registry.formats.source import BytesSource

if TYPE_CHECKING:
    import tokenizers

    from shardport.registry.store.protocol import Store

GGUF_LIMITS = GGUFLimits(max_kept_array_len=1 << 22)
"""Bounds for reading a GGUF tokenizer: every array kept (vocabularies up to 4 Mi tokens)."""

_GPT2_SPLIT = None  # ByteLevel's own regex (GPT-2's)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_SPLITS: Mapping[str, str | None] = {
    "default": _GPT2_SPLIT,
    "gpt2": _GPT2_SPLIT,
    "gpt-2": _GPT2_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
}
"""GGUF ``tokenizer.ggml.pre`` values whose pre-tokenizer split this loader builds."""
_CONTROL, _USER_DEFINED = 3, 4


class Tokenizer:
    """Text ↔ token ids for one verified checkpoint tokenizer."""

    __slots__ = ("_backend", "add_bos", "bos_id", "digest", "eos_id", "source")

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        source: str,
        digest: str,
        bos_id: int | None = None,
        eos_id: int | None = None,
        add_bos: bool = False,
    ) -> None:
        """``backend``: the built tokenizer; ``digest``: the manifest record's; ``add_bos``: prepend BOS."""
        self._backend = backend
        self.source, self.digest = source, digest
        self.bos_id, self.eos_id, self.add_bos = bos_id, eos_id, add_bos

    @property
    def vocab_size(self) -> int:
        """Tokens in the vocabulary, added tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """The prompt's token ids, with the BOS (and other special tokens) the tokenizer adds."""
        ids = list(self._backend.encode(text, add_special_tokens=True).ids)
        if self.add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (special tokens dropped)."""
        return self._backend.decode(list(ids), skip_special_tokens=True)


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise UnsupportedTokenizerError(
            "--prompt needs the 'tokenizers' package (pip install tokenizers); --tokens 1,2,3 needs none"
        ) from exc
    return tokenizers


def _part_bytes(part: TokenizerPart, files: Path | Mapping[str, bytes]) -> bytes:
    """The recorded bytes of ``part`` (``[0, end)`` for a GGUF header) from a folder or a mapping."""
    if isinstance(files, Path):
        path = files / part.path
        try:
            with path.open("rb") as f:
                data = f.read() if part.end is None else f.read(part.end)
        except OSError as exc:
            raise NoTokenizerError(f"tokenizer file {part.path}: cannot read {path}: {exc}") from exc
    else:
        if part.path not in files:
            raise NoTokenizerError(
                f"tokenizer file {part.path}: not among the bytes given ({sorted(files)}); pass it "
                "(for a GGUF, its first gguf_header.end bytes)"
            )
        data = files[part.path] if part.end is None else files[part.path][: part.end]
    return data


def _verified(record: TokenizerRecord, files: Path | Mapping[str, bytes]) -> dict[str, bytes]:
    if parts_digest(record.parts) != record.digest:
        raise TokenizerDigestError(
            f"manifest model.tokenizer: digest {record.digest} does not match its parts "
            f"({parts_digest(record.parts)}); the manifest is malformed"
        )
    out: dict[str, bytes] = {}
    for part in record.parts:
        data = _part_bytes(part, files)
        span = "the whole file" if part.end is None else f"bytes [0, {part.end})"
        if part.end is not None and len(data) != part.end:
            raise TokenizerDigestError(
                f"tokenizer file {part.path}: {span}: expected {part.end} bytes, found {len(data)} "
                "(remedy: pull the file again)"
            )
        found = digest_bytes(data)
        if found != part.digest:
            raise TokenizerDigestError(
                f"tokenizer file {part.path}: {span}: expected sha256 {part.digest} (recorded at push), "
                f"found {found} (remedy: the tokenizer changed after it was signed; pull it again)"
            )
        out[part.path] = data
    return out


TOKENIZER_FILE_MAX = 256 << 20
"""The largest tokenizer file (or GGUF header) :func:`read_tokenizer` reads."""


def read_tokenizer(store: Store, manifest: Manifest) -> dict[str, bytes]:
    """The bytes ``manifest.model.tokenizer`` names, read from the store's blobs (unverified here).

    Whole files for ``tokenizer.json`` and its companions; for a GGUF tokenizer, only the header
    ``[0, end)`` (one ranged read on S3), never the tensor data. Pass the result to
    :func:`load_tokenizer`, which verifies it.
    """
    record = manifest.model.tokenizer
    if record is None:
        return {}
    digests = {f.path: f.digest for f in manifest.files}
    out: dict[str, bytes] = {}
    for part in record.parts:
        digest = digests.get(part.path)
        if digest is None:
            raise NoTokenizerError(f"tokenizer file {part.path}: not among the manifest's files")
        want = TOKENIZER_FILE_MAX if part.end is None else min(part.end, TOKENIZER_FILE_MAX)
        chunks: list[bytes] = []
        size = 0
        with store.open_blob(digest, max_size=want) as stream:
            while size <= want:
                chunk = stream.read(want + 1 - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        data = b"".join(chunks)
        if part.end is None and len(data) > want:
            raise TokenizerError(f"tokenizer file {part.path}: larger than {want} bytes")
        out[part.path] = data[:want]
    return out


def load_tokenizer(manifest: Manifest, files: Path | Mapping[str, bytes]) -> Tokenizer:
    """The checkpoint's tokenizer, every byte verified against ``manifest.model.tokenizer``.

    ``files``: a pulled checkpoint folder, or path → bytes (whole files; for a GGUF tokenizer at least
    the header bytes ``[0, end)`` of the record's part). Raises :class:`NoTokenizerError`,
    :class:`TokenizerDigestError` or :class:`UnsupportedTokenizerError`.
    """
    record = manifest.model.tokenizer
    if record is None:
        raise NoTokenizerError(
            "the manifest records no tokenizer (no tokenizer.json or GGUF tokenizer.ggml.* at push); "
            "pass the prompt as --tokens 1,2,3"
        )
    if record.version > 1 or record.source not in ("tokenizer.json", "gguf", "sentencepiece"):
        raise UnsupportedTokenizerError(
            f"manifest model.tokenizer: version {record.version}, source {record.source!r}: this shardport "
            "reads version 1 (tokenizer.json, gguf, sentencepiece); upgrade shardport, or pass the prompt "
            "as --tokens 1,2,3"
        )
    if record.source == "sentencepiece":
        raise UnsupportedTokenizerError(
            "tokenizer.model (SentencePiece) needs the 'sentencepiece' package, which is not installed; "
            "push the checkpoint with its tokenizer.json, or pass the prompt as --tokens 1,2,3"
        )
    data = _verified(record, files)
    if record.source == "tokenizer.json":
        return _from_json(record, data)
    return _from_gguf(record, data[record.parts[0].path])


def _from_json(record: TokenizerRecord, data: Mapping[str, bytes]) -> Tokenizer:
    tk = _tokenizers()
    try:
        backend = tk.Tokenizer.from_str(data["tokenizer.json"].decode("utf-8"))
    except Exception as exc:  # not UTF-8, or the tokenizers package's plain Exception
        raise TokenizerError(f"tokenizer.json: not a tokenizer the tokenizers package reads: {exc}") from exc
    return Tokenizer(backend, source=record.source, digest=record.digest)


def _array(kv: Mapping[str, object], key: str, kind: type, *, required: bool = True) -> list[Any]:
    value = kv.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, GGUFArray) or value.values is None:
        raise TokenizerError(f"GGUF metadata: {key}: expected an array, found {type(value).__name__}")
    items = list(value.values)
    if not all(isinstance(v, kind) and not isinstance(v, bool) for v in items):
        raise TokenizerError(f"GGUF metadata: {key}: expected {kind.__name__} items, found {value.item_type}")
    return items


def _token_id(kv: Mapping[str, object], key: str, vocab: int) -> int | None:
    value = kv.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab:
        raise TokenizerError(f"GGUF metadata: {key}: expected a token id in 0..{vocab - 1}, found {value!r}")
    return value


def _from_gguf(record: TokenizerRecord, header: bytes) -> Tokenizer:
    path = record.parts[0].path
    meta = parse_gguf_metadata(BytesSource(header, path), GGUF_LIMITS, notes=Notes(strict=False))
    kv = meta.kv
    model = kv.get("tokenizer.ggml.model")
    if model == "llama":
        return _from_gguf_spm(record, path, kv)
    if model != "gpt2":
        raise UnsupportedTokenizerError(
            f"{path}: tokenizer.ggml.model {model!r}: expected 'gpt2' (byte-level BPE) or 'llama' "
            "(SentencePiece); pass the prompt as --tokens 1,2,3"
        )
    pre = kv.get("tokenizer.ggml.pre", "default")
    if not isinstance(pre, str) or pre not in PRE_SPLITS:
        raise UnsupportedTokenizerError(
            f"{path}: tokenizer.ggml.pre {pre!r}: expected one of {sorted(PRE_SPLITS)} (the pre-tokenizer "
            "splits this runtime builds); pass the prompt as --tokens 1,2,3"
        )
    tokens = _array(kv, "tokenizer.ggml.tokens", str)
    merges = _array(kv, "tokenizer.ggml.merges", str)
    types = _array(kv, "tokenizer.ggml.token_type", int, required=False)
    if types and len(types) != len(tokens):
        raise TokenizerError(
            f"{path}: tokenizer.ggml.token_type: expected {len(tokens)} items (one per token), "
            f"found {len(types)}"
        )
    pairs = []
    for i, merge in enumerate(merges):
        left, sep, right = merge.partition(" ")
        if not sep or not left or not right:
            raise TokenizerError(
                f"{path}: tokenizer.ggml.merges[{i}]: expected 'left right', found {merge!r}"
            )
        pairs.append((left, right))
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise TokenizerError(f"{path}: tokenizer.ggml.tokens: {len(tokens) - len(vocab)} duplicate tokens")
    tk = _tokenizers()
    try:
        backend = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=pairs))
    except Exception as exc:  # the tokenizers package raises plain Exception
        raise TokenizerError(f"{path}: the BPE vocabulary and merges do not make a tokenizer: {exc}") from exc
    split = PRE_SPLITS[pre]
    byte_level = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split is None)
    backend.pre_tokenizer = (
        byte_level
        if split is None
        else tk.pre_tokenizers.Sequence(
            [tk.pre_tokenizers.Split(tk.Regex(split), behavior="isolated", invert=False), byte_level]
        )
    )
    backend.decoder = tk.decoders.ByteLevel()
    special = [tk.AddedToken(tokens[i], special=True) for i, t in enumerate(types) if t == _CONTROL]
    user = [tk.AddedToken(tokens[i], special=False) for i, t in enumerate(types) if t == _USER_DEFINED]
    if special:
        backend.add_special_tokens(special)
    if user:
        backend.add_tokens(user)
    add_bos = kv.get("tokenizer.ggml.add_bos_token", False)
    return Tokenizer(
        backend,
        source=record.source,
        digest=record.digest,
        bos_id=_token_id(kv, "tokenizer.ggml.bos_token_id", len(tokens)),
        eos_id=_token_id(kv, "tokenizer.ggml.eos_token_id", len(tokens)),
        add_bos=add_bos is True,
    )


def _from_gguf_spm(record: TokenizerRecord, path: str, kv: Mapping[str, object]) -> Tokenizer:
    """A SentencePiece (``llama``) vocabulary, converted by transformers' GGUF tokenizer mapping.

    transformers (5.x) rebuilds it as a ``tokenizers`` BPE with byte fallback from the tokens, scores
    and token types, without the ``sentencepiece`` package; without transformers it is refused.
    """
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
    except ImportError as exc:
        raise UnsupportedTokenizerError(
            f"{path}: tokenizer.ggml.model 'llama' (SentencePiece): building it needs transformers "
            "(its GGUF tokenizer mapping) or the 'sentencepiece' package, and neither is installed; "
            "pass the prompt as --tokens 1,2,3"
        ) from exc
    tokens = _array(kv, "tokenizer.ggml.tokens", str)
    fields: dict[str, Any] = {"tokenizer_type": "llama", "tokens": tokens}
    for key, name, kind in (
        ("tokenizer.ggml.scores", "scores", float),
        ("tokenizer.ggml.token_type", "token_type", int),
        ("tokenizer.ggml.merges", "merges", str),
    ):
        items = _array(kv, key, kind, required=False)
        if items:
            fields[name] = items
    for key, name in (
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
        ("tokenizer.ggml.unknown_token_id", "unk_token_id"),
        ("tokenizer.ggml.padding_token_id", "pad_token_id"),
    ):
        token = _token_id(kv, key, len(tokens))
        if token is not None:
            fields[name] = token
    if isinstance(kv.get("tokenizer.ggml.add_space_prefix"), bool):
        fields["add_prefix_space"] = kv["tokenizer.ggml.add_space_prefix"]
    try:
        backend, _ = convert_gguf_tokenizer(str(kv.get(GGUF_ARCHITECTURE_KEY, "llama")), fields)
    except Exception as exc:  # a third-party converter: wrapped once, here
        raise TokenizerError(f"{path}: the SentencePiece vocabulary does not convert: {exc}") from exc
    add_bos = kv.get("tokenizer.ggml.add_bos_token", True)  # llama.cpp adds BOS unless told not to
    return Tokenizer(
        backend,
        source=record.source,
        digest=record.digest,
        bos_id=fields.get("bos_token_id"),
        eos_id=fields.get("eos_token_id"),
        add_bos=add_bos is True,
    )
