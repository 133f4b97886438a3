"""Pulls through a fault-injecting proxy in front of S3: transient failures absorbed, no wrong byte.

The proxy (tests/faultproxy.py) resets connections, cuts bodies short and answers 500 on a fraction of
the object GETs. Rank pulls, a full pull and ``verify REF`` must all succeed with the source's bytes; a
proxy failing every blob GET must end in a typed error after the bounded attempts; one flipping a byte
of complete bodies must be caught by verification, never retried into acceptance.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from faultproxy import FaultProxy, blob_get
from llama_artifacts import cli, gptq_llama, ok, reassemble
from servers import S3Server
from support import make_checkpoint

from shardport.registry.artifact.manifest import Manifest
from shardport.registry.session import Session

pytestmark = pytest.mark.s3
REF = "acme/llama:q4"


def _pushed(store: str, folder: Path) -> tuple[Path, str, Manifest]:
    src = gptq_llama(folder)
    ok(store, "keygen")
    digest = str(ok(store, "push", src, REF)["digest"])
    return src, digest, Manifest.from_bytes(Session.open(store).store.read_blob(digest))


def test_rank_and_full_pulls_through_faults_succeed_with_the_source_bytes(
    moto_server: S3Server, moto_store_url: str, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = moto_store_url
    src, digest, manifest = _pushed(store, tmp_path / "ck")
    # 30% of object GETs fail; at most 3 times in a row for one request (fewer than the 10 attempts)
    with FaultProxy(moto_server.endpoint, rate=0.3, seed=11, per_request=3) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        retries = 0
        # pipeline ranks read whole tensors (a few ranged GETs each; a column split of these row-major
        # planes is one GET per row, hundreds per pull); the node pull reads whole tile rows
        for round_ in range(4):  # 8 rank pulls
            outs = []
            for rank in range(2):
                dest = tmp_path / f"r{round_}-{rank}"
                res = ok(store, "pull", REF, dest, "--tp", "1", "--pp", "2", "--rank", str(rank))
                assert res["digest"] == digest
                retries += res["ledger"]["retries"]
                outs.append(Path(res["out"]))
            reassemble(manifest, src, outs)  # byte-identical to the source
        node = ok(store, "pull", REF, tmp_path / "node", "--tp", "2", "--ranks", "all")
        retries += node["ledger"]["retries"]
        reassemble(manifest, src, [Path(r["out"]) for r in node["ranks"]])
        full = ok(store, "pull", REF, tmp_path / "full")
        assert full["digest"] == digest
        for f in manifest.files:
            assert (tmp_path / "full" / f.path).read_bytes() == (src / f.path).read_bytes()
        report = ok(store, "verify", REF)
        assert report["ok"] and report["checked_files"] == len(manifest.files)
    assert proxy.faults >= 10 and retries > 0, proxy.counts


def test_every_blob_get_failing_ends_in_a_typed_error_and_a_flipped_byte_is_caught(
    moto_server: S3Server, moto_store_url: str, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = moto_store_url
    src = make_checkpoint(tmp_path / "ck", files=1)
    ok(store, "keygen")
    digest = ok(store, "push", src, REF)["digest"]
    manifest = Manifest.from_bytes(Session.open(store).store.read_blob(digest))
    shard = next(f for f in manifest.files if f.path.endswith(".bin"))

    def shard_get(method: str, path: str, query: str) -> bool:
        return blob_get(method, path, query) and path.endswith(shard.digest.removeprefix("sha256:"))

    for match, what in ((blob_get, "the manifest"), (shard_get, shard.path)):
        with FaultProxy(moto_server.endpoint, rate=1.0, modes=("error", "truncate"), match=match) as proxy:
            monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
            start = time.monotonic()
            code, out = cli(store, "pull", REF, tmp_path / "out")
            assert time.monotonic() - start < 40  # ~3-6 s of backoff
            assert code == 6 and out["error"]["type"] == "StoreError", (what, out)  # unavailable
            assert "failed 10 attempts" in out["error"]["message"], out
            assert set(proxy.seen.values()) == {10}, proxy.seen  # each read tried 10 times, no more
            assert not (tmp_path / "out").exists()
    with FaultProxy(moto_server.endpoint, rate=1.0, modes=("flip",), match=shard_get) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        code, out = cli(store, "pull", REF, tmp_path / "out")
        assert code == 1 and out["error"]["type"] == "DigestMismatchError", out
        assert shard.digest.removeprefix("sha256:") in out["error"]["message"]
        assert list(proxy.seen.values()) == [1]  # a complete body with a wrong byte: not asked for again
