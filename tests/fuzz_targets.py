"""Every parser of untrusted bytes, with valid seeds, and the mutations the fuzzers apply to them.

Shared by ``tests/reliability/test_fuzz_parsers.py`` (hypothesis, CI-sized) and ``bench/bench_fuzz.py``
(many more inputs). A parser passes an input when it returns an object or raises one of the project's
errors (a :class:`ShardportError`); anything else (KeyError, ValueError, RecursionError, a pydantic
ValidationError escaping, ...) is a bug. Seeds are real objects taken from a store built by
:mod:`tamper_world` (manifest, tile index, signature, tag documents, evidence, producer witness, trust
policy) and containers written by safetensors and gguf-py.
"""

from __future__ import annotations

import json
import random
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from shardport._errors import ShardportError
from shardport.provenance.dsse import Envelope
from shardport.registry.artifact.manifest import Manifest
from shardport.registry.artifact.manifest_check import check_manifest
from shardport.registry.artifact.witness_file import parse_witness
from shardport.registry.evidence import check_evidence
from shardport.registry.formats import BytesSource, parse_gguf_source, parse_safetensors_source
from shardport.registry.formats.shard_index import parse_shard_index
from shardport.registry.store.keys import referrer_key, tag_key
from shardport.registry.tiles.model import TileIndex
from shardport.registry.trust.policy import TrustPolicy
from shardport.registry.trust.signatures import check_envelope, referrers
from shardport.registry.trust.tags import verify_history

NOW = datetime(2026, 12, 5, tzinfo=UTC)


@dataclass(frozen=True)
class Target:
    """One parser: ``parse(raw)`` and the valid inputs mutations start from."""

    name: str
    parse: Callable[[bytes], object]
    seeds: tuple[bytes, ...]
    is_json: bool


def gguf_seed(path: Path) -> bytes:
    """A small GGUF v3 file (metadata of every value kind, quantized and float tensors), by gguf-py."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_custom_alignment(64)
    w.add_uint32("llama.block_count", 1)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_array("llama.small_ints", [1, 2, 3])
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(8)])
    q = quantize(rng.standard_normal((4, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("token_embd.weight", q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("output_norm.weight", rng.standard_normal(64).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


SHARD_INDEX = json.dumps(
    {
        "metadata": {"total_size": 1024, "total_parameters": 256},
        "weight_map": {
            "a.weight": "model-00001-of-00002.safetensors",
            "b.weight": "model-00002-of-00002.safetensors",
        },
    }
).encode()


def targets(world: Any, scratch: Path) -> dict[str, Target]:
    """The parsers, seeded from a built :class:`tamper_world.World` (``scratch``: a folder for the GGUF)."""
    from tamper_world import NAME, TAG

    store, session = world.session.store, world.session
    v2 = world.d.v2
    manifest = world.manifest()
    weights = list(manifest.weights or [])
    tag1, tag2 = store.read(tag_key(NAME, TAG, 1)), store.read(tag_key(NAME, TAG, 2))
    policy = session.policy
    trust = (
        (world.root / "home" / "trust.json").read_bytes()
        if (world.root / "home" / "trust.json").exists()
        else policy.to_bytes()
    )
    blob = store.read_blob

    def manifest_parse(raw: bytes) -> object:
        m = Manifest.from_bytes(raw, source="fuzz manifest")
        check_manifest(m, source="fuzz manifest")
        return m

    def tag_parse(raw: bytes) -> object:
        return verify_history({1: tag1, 2: raw}, repository=NAME, tag=TAG, policy=policy, seen=None, now=NOW)

    signature = world.signature()
    link = referrer_key(NAME, v2, signature)

    def link_parse(raw: bytes) -> object:  # the unsigned link that finds a manifest's signature
        store.put(link, raw)
        try:
            return referrers(session, NAME, v2)
        finally:
            store.put(link, link_seed)

    link_seed = store.read(link)

    return {
        t.name: t
        for t in (
            Target(
                "safetensors header",
                lambda raw: parse_safetensors_source(BytesSource(raw, "fuzz.safetensors")),
                (blob(world.file_digest()), blob(world.witness_digest())),
                False,
            ),
            Target(
                "gguf header",
                lambda raw: parse_gguf_source(BytesSource(raw, "fuzz.gguf")),
                (gguf_seed(scratch / "seed.gguf"),),
                False,
            ),
            Target(
                "shard index",
                lambda raw: parse_shard_index("model.safetensors.index.json", raw),
                (SHARD_INDEX,),
                True,
            ),
            Target("manifest", manifest_parse, (blob(v2), blob(world.d.other)), True),
            Target("tag document", tag_parse, (tag2,), True),
            Target(
                "dsse envelope",
                lambda raw: Envelope.from_bytes(raw, source="fuzz envelope"),
                (blob(world.signature()),),
                True,
            ),
            Target(
                "manifest signature",
                lambda raw: check_envelope(session, raw, NAME, v2, "fuzz signature", TAG),
                (blob(world.signature()),),
                True,
            ),
            Target(
                "trust policy",
                lambda raw: TrustPolicy.parse(raw, source="fuzz trust policy", key_name="fuzz"),
                (trust, policy.keys[0].key.to_pem()),
                True,
            ),
            Target(
                "evidence statement",
                lambda raw: check_evidence(session, raw, NAME, v2, "fuzz evidence"),
                (blob(world.evidence()),),
                True,
            ),
            Target(
                "tile index",
                lambda raw: TileIndex.from_bytes(raw, source="fuzz tile index"),
                (blob(world.tile_index_digest()),),
                True,
            ),
            Target(
                "producer witness",
                lambda raw: parse_witness(raw, weights, "fuzz witness"),
                (blob(world.witness_digest()),),
                False,
            ),
            Target("referrer link", link_parse, (link_seed,), True),
        )
    }


# ---- mutations -----------------------------------------------------------------------------------------

INTERESTING_INTS = (0, 1, 2, 7, 8, 255, 256, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**63 - 1, 2**64 - 1)
INTERESTING_TEXT = (
    b"-1",
    b"0",
    b"9007199254740993",
    b"18446744073709551616",
    b"1e400",
    b"-0.0",
    b"NaN",
    b"Infinity",
    b"9" * 5000,  # past Python's int-from-text digit limit
    b"null",
    b"true",
    b'""',
    b"[]",
    b"{}",
    b'"\\ud800"',  # a lone surrogate
    b'"' + b"x" * 100_000 + b'"',
)
BYTE_OPS = ("flip", "set", "truncate", "extend", "length", "text", "splice", "repeat", "nest", "delete")


def mutate_bytes(data: bytes, ops: list[tuple[int, int, int]], donors: tuple[bytes, ...] = ()) -> bytes:
    """Apply ``(op, position, value)`` mutations: bit flips, byte sets, truncation, extension, length or
    count fields overwritten with interesting (huge) integers, JSON tokens replaced by edge cases,
    splicing from another seed, repeated chunks, deep nesting and deletions."""
    out = bytearray(data)
    for op_code, pos, value in ops:
        op = BYTE_OPS[op_code % len(BYTE_OPS)]
        n = len(out)
        at = pos % (n + 1)
        if op == "flip" and n:
            out[at % n] ^= 1 << (value % 8)
        elif op == "set" and n:
            out[at % n] = (0x00, 0xFF, 0x7F, 0x80, 0x22, 0x5C, 0x7B, 0x5B)[value % 8]
        elif op == "truncate":
            del out[at:]
        elif op == "extend":
            out += bytes([value % 256]) * (1 + value % 64)
        elif op == "length":  # a little-endian u32/u64 (length, count, offset) set to an edge value
            width = 8 if value & 1 else 4
            v = INTERESTING_INTS[(value >> 1) % len(INTERESTING_INTS)] % (1 << (8 * width))
            out[at : at + width] = v.to_bytes(width, "little")
        elif op == "text":  # a JSON number or token replaced by an edge case
            token = INTERESTING_TEXT[value % len(INTERESTING_TEXT)]
            end = at
            while end < n and chr(out[end]) in "0123456789-+.eE":
                end += 1
            out[at:end] = token
        elif op == "splice" and donors:
            donor = donors[value % len(donors)]
            start = (value >> 8) % (len(donor) + 1)
            out[at:at] = donor[start : start + 1 + (value >> 16) % 256]
        elif op == "repeat" and n:
            chunk = out[at : at + 1 + value % 32]
            out[at:at] = chunk * (1 + (value >> 5) % 8)
        elif op == "nest":
            depth = 100 + value % 20_000
            out[at:at] = b"[" * depth + b"]" * depth
        elif op == "delete":
            del out[at : at + 1 + value % 16]
    return bytes(out)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            found += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:8]):
            found += _paths(v, (*prefix, i))
    return found


def _edge_value(rng: random.Random) -> Any:
    choices: list[Callable[[], Any]] = [
        lambda: None,
        lambda: True,
        lambda: -1,
        lambda: 0,
        lambda: 2**53 + 1,
        lambda: 2**64,
        lambda: 10**30,
        lambda: -(2**63) - 1,
        lambda: 1.5,
        lambda: 1e308,
        lambda: "",
        lambda: "sha256:" + "0" * 64,
        lambda: "sha256:../../etc/passwd",
        lambda: "../escape",
        lambda: "x" * rng.choice([1, 64, 10_000]),
        lambda: "\u202e\x00",
        lambda: [],
        lambda: {},
        lambda: [0] * rng.choice([1, 3, 1000]),
        lambda: {"": None},
    ]
    return rng.choice(choices)()


def mutate_json(data: bytes, seed: int) -> bytes:
    """A structural mutation of a JSON seed: a value replaced by an edge case, a key dropped or added,
    a type changed; serialised back (so the document stays JSON and reaches the field checks)."""
    rng = random.Random(seed)
    try:
        doc = json.loads(data)
    except ValueError:
        return data
    for _ in range(1 + seed % 3):
        paths = _paths(doc)
        path = rng.choice(paths)
        if not path:
            doc = _edge_value(rng) if rng.random() < 0.1 else doc
            continue
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        last = path[-1]
        action = rng.random()
        if action < 0.6:
            parent[last] = _edge_value(rng)
        elif action < 0.75 and isinstance(parent, dict):
            del parent[last]
        elif action < 0.9 and isinstance(parent, dict):
            parent[str(rng.choice(["x", "version", "digest", "size", "", last]))] = _edge_value(rng)
        elif isinstance(parent, list):
            parent.append(_edge_value(rng))
        else:
            parent[last] = [parent[last]]
    try:
        return json.dumps(doc, allow_nan=True).encode()
    except (ValueError, RecursionError):
        return data


# ---- running one input ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    accepted: bool
    refused: str | None  # the project error's type name
    bug: str | None  # the escaping exception: "TypeName: message"
    seconds: float
    peak_bytes: int | None


def run_one(target: Target, raw: bytes, *, measure_memory: bool = False) -> Outcome:
    """Parse ``raw``: accepted, refused with a project error, or a bug (any other exception)."""
    if measure_memory:
        tracemalloc.start()
    t0 = time.perf_counter()
    accepted, refused, bug = False, None, None
    try:
        target.parse(raw)
        accepted = True
    except ShardportError as exc:
        refused = type(exc).__name__
    except Exception as exc:
        bug = f"{type(exc).__name__}: {str(exc)[:200]}"
    seconds = time.perf_counter() - t0
    peak = None
    if measure_memory:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return Outcome(accepted, refused, bug, seconds, peak)


def memory_bound(raw: bytes) -> int:
    """The allocation a parser may make for ``raw``: 8 MiB + 64 x its size (no cap-sized buffers)."""
    return 8 * 2**20 + 64 * len(raw)
