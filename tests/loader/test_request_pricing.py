"""Requests weighed against bytes on S3: a rank's part of every row of a row-major tensor is a few reads.

Without a price on requests, a rank that needs part of every matrix row (a K-split of a GGUF block plane,
an N-split of a GPTQ ``[K/8, N]`` plane) reads each row's piece with its own GET: thousands per rank
from S3. The S3 profile prices a request (``ReadProfile.request_bytes``) so such rows are read as one
range, gaps included and counted, within ``max_amplification``; local plans do not change.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bringup_artifacts import WIDE, gguf_mix, quantized_llama
from llama_artifacts import ok
from loader_artifacts import Artifact, load, publish, rank_slices, write_safetensors

from shardport.loader import load_rank, schedule_reads
from shardport.loader.ranges import priced
from shardport.placement import Topology
from shardport.registry.artifact.refs import parse_ref
from shardport.registry.session import Session
from shardport.registry.store.s3 import S3_PROFILE

PRICE = {"request_bytes": S3_PROFILE.request_bytes, "max_amplification": S3_PROFILE.max_amplification}


@pytest.fixture(scope="module")
def local_art(tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    root = tmp_path_factory.mktemp("pricing")
    path = write_safetensors(root / "ckpt", hidden=128, kv=32, inter=256, vocab=64)
    return publish(path, str(root / "store"), target=8 << 10, minimum=512)


@pytest.mark.parametrize("batch_bytes", [4 << 10, 16 << 10, 64 << 10])
def test_bands_read_whole_are_packed_by_extent_so_a_batch_holds_at_most_batch_bytes(
    local_art: Artifact, batch_bytes: int
) -> None:
    art = local_art
    slices = rank_slices(art, 4, 1, "col")
    args = (slices, art.entries, art.files, art.index)
    unpriced = schedule_reads(*args, batch_bytes=batch_bytes, max_gap=1 << 20, gap_budget=0.02)
    schedule = schedule_reads(*args, batch_bytes=batch_bytes, max_gap=1 << 20, gap_budget=0.02, **PRICE)
    assert schedule.bytes_assigned == unpriced.bytes_assigned
    assert schedule.requests * 10 < unpriced.requests  # a request per row, or a few per tensor
    whole = 0
    for batch in schedule.batches:
        read_whole = [b for b in batch.bands if priced(b, max_gap=1 << 20, **PRICE)]
        whole += len(read_whole)
        assert not set(batch.fetch.row_bands) & {batch.bands.index(b) for b in read_whole}
        if len(batch.bands) > 1:  # a band larger than batch_bytes is a batch of its own
            assert batch.fetch.bytes <= batch_bytes * 1.02
    assert whole > 0
    assert schedule.bytes_fetched <= S3_PROFILE.max_amplification * schedule.bytes_assigned


@pytest.mark.s3
def test_column_splits_from_s3_take_a_few_requests_and_return_the_file_bytes(
    moto_store_url: str, tmp_path: Path
) -> None:
    path = write_safetensors(tmp_path / "ckpt", hidden=128, kv=32, inter=256, vocab=64)
    art = publish(path, moto_store_url, target=8 << 10, minimum=512)
    tensors = {e.name for e in art.entries if len(e.shape) == 2}
    for tp in (2, 4):
        slices = rank_slices(art, tp, 1, "col")
        rows = sum(art.index.tensors[s.tensor].rows for s in slices if s.tensor in tensors)
        unpriced = load(art, slices, request_bytes=0)
        result = load(art, slices)
        for s, got, want in zip(slices, result.arrays, unpriced.arrays, strict=True):
            assert np.array_equal(got, art.expected(s)) and np.array_equal(got, want), s
        ledger = result.ledger
        assert unpriced.ledger.requests >= rows and ledger.requests <= len(slices)
        assert 1.05 < ledger.read_amplification <= tp + 0.05  # the gaps are read, and counted
        assert ledger.bytes_fetched == sum(r.length * r.count for r in ledger.fetched)
    # the node's ranks together: their pieces interleave into whole rows, no gap to price
    union = [s for rank in range(4) for s in rank_slices(art, 4, rank, "col")]
    node = load(art, union)
    assert node.ledger.read_amplification <= 1.05 and node.ledger.requests <= len(union)


def _rank(session: Session, ref: str, tp: int) -> Any:
    return load_rank(session, parse_ref(ref), Topology(tp=tp), 1)


@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.parametrize(("fmt", "tp"), [("gguf", 3), ("gptq", 4)])
def test_load_rank_of_a_row_major_checkpoint_from_seaweedfs_takes_a_request_per_tensor_at_most(
    fmt: str, tp: int, tmp_path: Path, home: Path, seaweed_store_url: str
) -> None:
    """The GGUF mix at hidden 576 (K-split ``attn_output``/``ffn_down`` rows) at tp 3; GPTQ g32 (N-split
    ``[K/8, N]`` planes of q/k/v/gate/up) at tp 4: unpriced, a GET per matrix row of those planes."""
    shape = dataclasses.replace(WIDE, layers=1)
    ck = tmp_path / "ck"
    src = gguf_mix(ck, shape) if fmt == "gguf" else quantized_llama(ck, "gptq", 32, shape)
    local = str(tmp_path / "store")
    ok(local, "keygen")
    for store in (local, seaweed_store_url):
        ok(store, "push", src, "wide/x:v1")
    want = _rank(Session.open(local), "wide/x:v1", tp)
    got = _rank(Session.open(seaweed_store_url), "wide/x:v1", tp)
    assert got.ledger.backend == "s3" and got.digest == want.digest
    assert got.arrays.keys() == want.arrays.keys()
    for name, array in want.arrays.items():  # verified tiles, witness rows checked: the same tensors
        assert got.arrays[name].dtype == array.dtype and np.array_equal(got.arrays[name], array), name
    assert not got.witness.unchecked
    ledger = got.ledger
    assert ledger.requests <= len(got.tensors), (ledger.requests, len(got.tensors))
    assert want.ledger.requests > 10 * len(got.tensors)  # locally a row piece per preadv run
    assert ledger.bytes_assigned == want.ledger.bytes_assigned
    assert 1.05 < ledger.read_amplification <= S3_PROFILE.max_amplification
    assert ledger.bytes_fetched == sum(r.length * r.count for r in ledger.fetched)
