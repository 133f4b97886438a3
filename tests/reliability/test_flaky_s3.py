"""Push, pull, rank pulls and bring-up through a fault-injecting proxy in front of S3 (tests/faultproxy.py).

Unverified bytes written must be 0, whatever the proxy does (connection resets, bodies cut short,
500s, a flipped byte in a complete body): a pull or rank pull either completes with exactly the bytes
an unfaulted pull writes, or fails with a typed error leaving DEST as it was (absent, or an earlier
pull byte for byte) and nothing beside it; a push either completes or fails, and either way every tag
points at complete, verifiable content and fsck is clean. Faults are not capped per request here, so
some commands exhaust their retries and must fail cleanly; the seeds are fixed.
bench/bench_reliability.py runs more rounds on SeaweedFS.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from bringup_artifacts import gptq_tiny
from crashes import fsck, log_in_process
from faultproxy import FaultProxy, object_get
from llama_artifacts import cli, ok
from servers import S3Server
from support import make_checkpoint

pytestmark = pytest.mark.s3
ALL_MODES = ("reset", "truncate", "error", "flip")
TRANSIENT = ("reset", "truncate", "error")
FAILURE_CODES = {1, 6}  # verification failed, store unavailable


def _tree(root: Path) -> dict[str, bytes] | None:
    """Every file under ``root`` by relative path with its bytes (None: ``root`` does not exist)."""
    if not root.exists():
        return None
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _payload(tree: dict[str, bytes] | None) -> dict[str, bytes] | None:
    """The tree less the rank ledger (its retry counts and timings differ from run to run)."""
    return None if tree is None else {k: v for k, v in tree.items() if not k.endswith(".ledger.json")}


def _any_request(method: str, path: str, query: str) -> bool:
    return True


def _through(proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)


def _direct(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)


def pull_rounds(
    server: S3Server,
    store: str,
    ref: str,
    tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    rounds: int,
    seed: int,
    rate: float,
    extra: Callable[[int], list[str]],
) -> dict[str, int]:
    """``rounds`` pulls of ``ref`` (options ``extra(round)``) through a faulting proxy, onto a DEST that
    is new or an earlier complete pull; checks each outcome against an unfaulted pull of the same."""
    outcome = {"completed": 0, "failed_clean": 0, "faults": 0}
    cleans: dict[tuple[str, ...], Path] = {}
    for n in range(rounds):
        opts = extra(n)
        _direct(server, monkeypatch)
        if tuple(opts) not in cleans:
            cleans[tuple(opts)] = tmp / f"clean{n}"
            ok(store, "pull", ref, cleans[tuple(opts)], *opts)
        clean = cleans[tuple(opts)]
        dest = tmp / f"dest{n}"
        if n % 2:  # an earlier complete pull of the same REF is in DEST: a failure must leave it whole
            ok(store, "pull", ref, dest, *opts)
        before, beside = _tree(dest), sorted(p.name for p in tmp.iterdir())
        # odd rounds (DEST holds an earlier pull) may get a flipped byte, which must fail the pull and
        # leave DEST whole; even rounds get transient faults only, which retries absorb
        modes = ALL_MODES if n % 2 else TRANSIENT
        with FaultProxy(server.endpoint, rate=rate, modes=modes, seed=seed + n, match=object_get) as proxy:
            _through(proxy, monkeypatch)
            code, out = cli(store, "pull", ref, dest, *opts)
        outcome["faults"] += proxy.faults
        if code == 0:
            outcome["completed"] += 1
            assert _payload(_tree(dest)) == _payload(_tree(clean)), (n, opts, proxy.counts)
        else:
            outcome["failed_clean"] += 1
            assert code in FAILURE_CODES, (n, opts, out, proxy.counts)
            assert _tree(dest) == before, (n, opts, out)  # not one unverified byte reached DEST
        expected = sorted({*beside, dest.name}) if code == 0 else beside
        assert sorted(p.name for p in tmp.iterdir()) == expected, (n, "a temporary left beside DEST")
    return outcome


def test_pulls_and_rank_pulls_through_every_fault_write_only_verified_bytes(
    moto_server: S3Server, moto_store_url: str, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = moto_store_url
    ok(store, "keygen")
    ok(store, "push", gptq_tiny(tmp_path / "src"), "flaky/q:v1")
    (tmp_path / "pulls").mkdir()
    full = pull_rounds(
        moto_server, store, "flaky/q:v1", tmp_path / "pulls", monkeypatch,
        rounds=3, seed=100, rate=0.35, extra=lambda n: [],
    )  # fmt: skip
    (tmp_path / "ranks").mkdir()
    ranks = pull_rounds(
        moto_server, store, "flaky/q:v1", tmp_path / "ranks", monkeypatch,
        rounds=4, seed=200, rate=0.25, extra=lambda n: ["--tp", "2", "--rank", str(n % 2)],
    )  # fmt: skip
    # the proxy did inject faults, and both outcomes happened: completions despite faults, clean failures
    assert full["faults"] + ranks["faults"] >= 10, (full, ranks)
    assert full["completed"] + ranks["completed"] >= 1, (full, ranks)
    assert full["failed_clean"] + ranks["failed_clean"] >= 1, (full, ranks)


def test_pushes_through_faults_never_tag_incomplete_content(
    moto_server: S3Server, moto_store_url: str, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = moto_store_url
    ok(store, "keygen")
    ok(store, "push", make_checkpoint(tmp_path / "base", seed=1), "flaky/p:v")
    outcomes = {"completed": 0, "failed": 0}
    rounds = (  # (rate, modes, which requests)
        (0.15, TRANSIENT, _any_request),  # PUTs, conditional tag writes, listings, history reads
        (0.15, ALL_MODES, _any_request),
        (1.0, ("flip",), _tag_history_get),  # a lying tag history: the push must fail, tag nothing
    )
    for n, (rate, modes, match) in enumerate(rounds):
        src = make_checkpoint(tmp_path / f"ck{n}", seed=10 + n, size=150_000)
        before = log_in_process(store, "flaky/p:v")
        with FaultProxy(moto_server.endpoint, rate=rate, modes=modes, seed=300 + n, match=match) as proxy:
            _through(proxy, monkeypatch)
            code, out = cli(store, "push", src, "flaky/p:v")
        _direct(moto_server, monkeypatch)
        after = log_in_process(store, "flaky/p:v")
        assert after[: len(before)] == before, (n, before, after)  # history never rewritten
        assert len(after) - len(before) in (0, 1), (n, after)
        if code == 0:
            outcomes["completed"] += 1
            assert after[-1][1] == out["digest"], (n, out, after)
        else:
            outcomes["failed"] += 1
            assert code in {1, 4, 6} and "error" in out, (n, code, out, proxy.counts)
        report = fsck(store)
        assert report["ok"], (n, report, proxy.counts)
        assert ok(store, "verify", "flaky/p:v")["ok"]  # the head is complete, whatever it is
        # re-running the push without faults completes with the digest an unfaulted push gives
        again = ok(store, "push", src, "flaky/p:v")
        assert code != 0 or again["digest"] == out["digest"]
        assert log_in_process(store, "flaky/p:v")[-1][1] == again["digest"]
    # whether the random rounds complete depends on which requests the faults hit (a lost answer to
    # the conditional tag write reads as a lost race, exit 4); the lying history always fails
    assert outcomes["failed"] >= 1 and outcomes["completed"] + outcomes["failed"] == len(rounds), outcomes


def _tag_history_get(method: str, path: str, query: str) -> bool:
    return object_get(method, path, query) and "/tags/" in path


@pytest.mark.slow
def test_bring_up_reading_through_faults(
    moto_server: S3Server, moto_store_url: str, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-process bring-up (the ranks' tile reads are the S3 path Ray ranks use): transient faults are
    absorbed and parity passes; a proxy flipping a byte of every blob body fails it with a typed error."""
    from shardport.deploy.ray_ranks import run_in_process
    from shardport.deploy.up import UpRequest, bring_up
    from shardport.registry.session import Session

    store = moto_store_url
    ok(store, "keygen")
    ok(store, "push", gptq_tiny(tmp_path / "src"), "flaky/up:v1")
    request = UpRequest(ref="flaky/up:v1", tokens=(1, 5, 300, 7), steps=2, store=store, ladder="off")
    with FaultProxy(
        moto_server.endpoint, rate=0.3, modes=("reset", "truncate", "error"), seed=5, per_request=3
    ) as p:
        _through(p, monkeypatch)
        result = bring_up(Session.open(store), request, launcher=run_in_process, store_evidence=False)
    parity = result.predicate["parity"]
    assert not [row for row in parity if row["passed"] is False], parity  # the ladder is off: L0-L3 not run
    assert {row["level"] for row in parity if row["passed"]} >= {"L4", "L5"}, parity
    assert p.faults >= 3, p.counts
    with FaultProxy(moto_server.endpoint, rate=1.0, modes=("flip",), match=_blob_only) as p:
        _through(p, monkeypatch)
        with pytest.raises(Exception) as caught:
            bring_up(Session.open(store), request, launcher=run_in_process, store_evidence=False)
    assert getattr(caught.value, "exit_code", None) == 1, repr(caught.value)  # verification failed
    assert type(caught.value).__name__.endswith("DigestMismatchError"), repr(caught.value)


def _blob_only(method: str, path: str, query: str) -> bool:
    return object_get(method, path, query) and "/blobs/sha256/" in path
