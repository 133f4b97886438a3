"""Fuzzing every parser of untrusted bytes: each returns an object or raises one of our errors.

Parsers (:mod:`fuzz_targets`): the safetensors and GGUF header gates, the sharded index, the manifest
(with its consistency check), tag documents (through the chain check), DSSE envelopes, manifest
signatures, trust policies, evidence statements, tile indexes, producer witnesses and the unsigned
referrer links that find signatures and evidence. Inputs: valid
seeds taken from a real store, mutated (bit flips, truncation, extension, length and count fields set
to huge values, JSON numbers replaced by edge cases, splicing, deep nesting) and, for the JSON ones,
changed structurally (a field's value replaced, removed, retyped). Any exception that is not a
``ShardportError`` fails the test; so does an input that takes longer than the per-example deadline
or (on a sample, under ``tracemalloc``) allocates more than :func:`fuzz_targets.memory_bound`.
``bench/bench_fuzz.py`` runs the same with many more inputs and reports the figures.

Bugs these found and that are fixed (each with its regression case in :data:`REGRESSIONS`):
RecursionError from deeply nested JSON and ValueError from numbers of more than 4300 digits escaped
from the manifest, DSSE envelope (so tag documents, signatures, evidence), in-toto statement, tile
index (digits only) and trust policy parsers, and (found by review) RecursionError from a referrer
link; cryptography's UnsupportedAlgorithm escaped from a trust policy whose PEM key has an unknown
algorithm.
"""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from pathlib import Path

import pytest
from fuzz_targets import BYTE_OPS, Target, memory_bound, mutate_bytes, mutate_json, run_one, targets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tamper_world import World, build, home_at

PER_PARSER = settings(
    max_examples=300,
    deadline=timedelta(seconds=5),  # no hang: every example within 5 s (the slowest takes < 0.5 s loaded)
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,  # CI runs the same inputs every time; bench/bench_fuzz.py explores
)
NAMES = (
    "safetensors header",
    "gguf header",
    "shard index",
    "manifest",
    "tag document",
    "dsse envelope",
    "manifest signature",
    "trust policy",
    "evidence statement",
    "tile index",
    "producer witness",
    "referrer link",
)


@pytest.fixture(scope="module")
def parsers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Target]:
    root = tmp_path_factory.mktemp("fuzz-world")
    with home_at(root / "home"):
        return targets(World(root, build(root)), root)


def check(target: Target, raw: bytes, *, memory: bool = False) -> None:
    outcome = run_one(target, raw, measure_memory=memory)
    assert outcome.bug is None, f"{target.name}: {outcome.bug} on {raw[:200]!r}"
    if memory:
        assert outcome.peak_bytes is not None and outcome.peak_bytes <= memory_bound(raw), (
            f"{target.name}: {outcome.peak_bytes} bytes allocated for a {len(raw)}-byte input"
        )


def test_every_parser_accepts_its_seeds(parsers: dict[str, Target]) -> None:
    assert set(parsers) == set(NAMES)
    for target in parsers.values():
        for seed in target.seeds:
            outcome = run_one(target, seed)
            assert outcome.accepted, (target.name, outcome)


_ops = st.lists(
    st.tuples(st.integers(0, len(BYTE_OPS) - 1), st.integers(0, 2**32), st.integers(0, 2**64 - 1)),
    min_size=1,
    max_size=4,
)


@pytest.mark.parametrize("name", NAMES)
@PER_PARSER
@given(ops=_ops, pick=st.integers(0, 7))
def test_mutated_seeds(
    parsers: dict[str, Target], name: str, ops: list[tuple[int, int, int]], pick: int
) -> None:
    target = parsers[name]
    check(target, mutate_bytes(target.seeds[pick % len(target.seeds)], ops, target.seeds))


@pytest.mark.parametrize(
    "name", [n for n in NAMES if n not in ("safetensors header", "gguf header", "producer witness")]
)
@PER_PARSER
@given(seed=st.integers(0, 2**32), pick=st.integers(0, 7))
def test_structurally_mutated_json(parsers: dict[str, Target], name: str, seed: int, pick: int) -> None:
    target = parsers[name]
    check(target, mutate_json(target.seeds[pick % len(target.seeds)], seed))


@pytest.mark.parametrize("name", NAMES)
@settings(PER_PARSER, max_examples=100)
@given(raw=st.binary(max_size=512))
def test_arbitrary_bytes(parsers: dict[str, Target], name: str, raw: bytes) -> None:
    check(parsers[name], raw)


@pytest.mark.parametrize("name", NAMES)
@settings(PER_PARSER, max_examples=25)
@given(ops=_ops, pick=st.integers(0, 7))
def test_allocations_stay_within_the_bound(
    parsers: dict[str, Target], name: str, ops: list[tuple[int, int, int]], pick: int
) -> None:
    """Huge counts and lengths allocate nothing of their size: peak <= 8 MiB + 64 x the input."""
    target = parsers[name]
    check(target, mutate_bytes(target.seeds[pick % len(target.seeds)], ops, target.seeds), memory=True)


def _deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


def _envelope(payload: bytes) -> bytes:
    doc = {
        "payloadType": "application/vnd.in-toto+json",
        "payload": base64.b64encode(payload).decode(),
        "signatures": [],
    }
    return json.dumps(doc).encode()


REGRESSIONS: list[tuple[str, bytes, str]] = [
    # (parser, input, the error it must now raise) — each escaped as a bare Python exception before
    ("manifest", _deep(100_000), "VerificationError"),
    ("manifest", b'{"schema_version": ' + b"9" * 5000 + b"}", "VerificationError"),
    ("dsse envelope", _deep(100_000), "EnvelopeFormatError"),
    ("dsse envelope", b'{"payload": ' + b"1" * 5000 + b"}", "EnvelopeFormatError"),
    ("tag document", _deep(100_000), "TagChainError"),
    ("tag document", _envelope(_deep(100_000)), "TagChainError"),
    ("manifest signature", _deep(100_000), "SignatureError"),
    ("manifest signature", _envelope(b"[" * 100_000), "SignatureError"),
    ("evidence statement", _deep(100_000), "SignatureError"),
    ("tile index", b'{"version": ' + b"2" * 5000 + b"}", "TileIndexError"),
    ("tile index", _deep(100_000), "TileIndexError"),
    ("trust policy", _deep(100_000), "UsageError"),
]
ACCEPTED: list[tuple[str, bytes]] = [  # found by review: a malformed link attaches nothing (it raised)
    ("referrer link", _deep(100_000)),
    ("referrer link", b'{"digest": ' + b"7" * 5000 + b"}"),
]


@pytest.mark.parametrize(
    ("name", "raw", "error"), REGRESSIONS, ids=[f"{n}-{k}" for k, (n, _, _) in enumerate(REGRESSIONS)]
)
def test_found_bugs_stay_fixed(parsers: dict[str, Target], name: str, raw: bytes, error: str) -> None:
    outcome = run_one(parsers[name], raw)
    assert outcome.refused == error, outcome


@pytest.mark.parametrize(("name", "raw"), ACCEPTED, ids=[f"{n}-{k}" for k, (n, _) in enumerate(ACCEPTED)])
def test_found_bugs_stay_fixed_where_the_reader_skips(
    parsers: dict[str, Target], name: str, raw: bytes
) -> None:
    outcome = run_one(parsers[name], raw)
    assert outcome.accepted and outcome.bug is None, outcome


def test_a_pem_key_of_an_unknown_algorithm_is_a_key_format_error(parsers: dict[str, Target]) -> None:
    """Found by mutation: one changed byte of the key's algorithm OID raised cryptography's
    UnsupportedAlgorithm out of the trust policy parser."""
    pem = parsers["trust policy"].seeds[1]
    der = base64.b64decode(b"".join(pem.splitlines()[1:-1]))
    oid = der.index(bytes.fromhex("2b6570"))  # 1.3.101.112, Ed25519
    bad_der = der[:oid] + bytes.fromhex("2b656c") + der[oid + 3 :]  # 1.3.101.108: no such key type
    bad = b"-----BEGIN PUBLIC KEY-----\n" + base64.b64encode(bad_der) + b"\n-----END PUBLIC KEY-----\n"
    outcome = run_one(parsers["trust policy"], bad)
    assert outcome.bug is None and outcome.refused == "UsageError", outcome
    doc = {"keys": [{"name": "k", "public_key": bad.decode(), "scopes": ["*"]}]}
    outcome = run_one(parsers["trust policy"], json.dumps(doc).encode())
    assert outcome.bug is None and outcome.refused == "UsageError", outcome


def test_a_small_store_object_is_read_without_allocating_its_cap(tmp_path: Path) -> None:
    """Found by the allocation bound (the referrer-link target): every local read of an object of
    unknown size asked ``read()`` for its cap + 1 bytes, which allocates that much: 16 MiB for each tag
    document, referrer link or lease, 1 GiB for a manifest read without its size."""
    import tracemalloc

    from shardport.registry.store.localfiles import read_bounded

    (tmp_path / "repos").mkdir()
    (tmp_path / "repos" / "link").write_bytes(b'{"artifactType": "x"}')
    for cap in (16 << 20, 1 << 30):
        tracemalloc.start()
        try:
            assert read_bounded(str(tmp_path), "repos/link", cap) == b'{"artifactType": "x"}'
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20, (cap, peak)
