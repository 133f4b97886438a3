"""Client-side trust: state keyed by a normalised store identity, scopes, validity, corrupt state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import Cli, make_checkpoint

from shardport.registry.session import Session
from shardport.registry.store.keys import tag_key
from shardport.registry.trust.policy import scope_matches
from shardport.registry.trust.state import normalise_endpoint, store_identity

NAME, TAG = "acme/model", "prod"


# ---- store identity ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        (None, "aws"),
        ("", "aws"),
        ("http://127.0.0.1:9000", "http://127.0.0.1:9000"),
        ("http://127.0.0.1:9000/", "http://127.0.0.1:9000"),
        ("HTTP://LocalHost:9000", "http://localhost:9000"),
        ("https://s3.example.com:443/", "https://s3.example.com"),
        ("http://s3.example.com:80", "http://s3.example.com"),
    ],
)
def test_normalise_endpoint(endpoint: str | None, expected: str) -> None:
    assert normalise_endpoint(endpoint) == expected


def test_store_identity_spellings() -> None:
    ep = "http://127.0.0.1:9000"
    spellings = ["s3://b/reg", "s3://b/reg/", "s3://b//reg//", "s3://b/reg///"]
    ids = {store_identity(u, local_root=None, endpoint=e) for u in spellings for e in (ep, ep + "/")}
    assert ids == {"s3://b/reg@http://127.0.0.1:9000"}
    assert store_identity("s3://b/reg", local_root=None, endpoint="http://127.0.0.1:9001") not in ids
    assert store_identity("s3://b/other", local_root=None, endpoint=ep) not in ids
    assert store_identity("/x", local_root="/x", endpoint=None) == "file:///x"


@pytest.mark.s3
def test_rollback_caught_whatever_the_store_url_spelling(
    moto_store_url: str, home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    endpoint = os.environ["AWS_ENDPOINT_URL"]
    cli = Cli(capsys, moto_store_url)
    cli.ok("keygen")
    for v in (1, 2, 3):
        cli.ok("push", make_checkpoint(tmp_path / f"v{v}", seed=v, size=2000), f"{NAME}:{TAG}")
    assert cli.ok("pull", f"{NAME}:{TAG}", tmp_path / "seen")["tag_version"] == 3
    Session.open(moto_store_url).store.delete(tag_key(NAME, TAG, 3))  # the server forgets v3
    spellings: list[tuple[str, list[str]]] = [
        (moto_store_url, []),
        (moto_store_url + "/", []),
        (moto_store_url + "/", ["--s3-endpoint", endpoint]),
        (moto_store_url, ["--s3-endpoint", endpoint + "/"]),
    ]
    for i, (url, extra) in enumerate(spellings):
        code, out = Cli(capsys, url)(*extra, "pull", f"{NAME}:{TAG}", tmp_path / f"d{i}")
        assert code == 1, (url, extra, out)
        assert out["error"]["type"] == "RollbackAttackError", (url, extra, out)
        assert not (tmp_path / f"d{i}").exists()


@pytest.mark.s3
def test_state_written_by_older_releases_still_protects(
    moto_store_url: str, home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(capsys, moto_store_url)
    cli.ok("keygen")
    for v in (1, 2):
        cli.ok("push", make_checkpoint(tmp_path / f"v{v}", seed=v, size=2000), f"{NAME}:{TAG}")
    state = Session.open(moto_store_url).state
    seen = state.get(NAME, TAG)
    assert seen is not None and seen.version == 2
    # What an older release wrote: the same record under the raw URL's id only.
    doc = json.loads(state.path.read_text())
    legacy = next(p for p in state.legacy_paths)
    legacy.write_text(json.dumps({"store": moto_store_url, "tags": doc["tags"]}))
    state.path.unlink()
    Session.open(moto_store_url).store.delete(tag_key(NAME, TAG, 2))
    code, out = cli("pull", f"{NAME}:{TAG}", tmp_path / "d")
    assert code == 1 and out["error"]["type"] == "RollbackAttackError", out


# ---- corrupt client state ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"\xff\xfe",
        b"[]",
        b'{"tags": {"acme/model:prod": {"version": "2", "digest": "sha256:00"}}}',
        b'{"tags": {"acme/model:prod": {"version": 0, "digest": "sha256:' + b"0" * 64 + b'"}}}',
        b'{"tags": {"acme/model:prod": 7}}',
    ],
)
def test_corrupt_state_file_is_a_typed_error(
    content: bytes, home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(tmp_path / "store")
    cli = Cli(capsys, store)
    cli.ok("keygen")
    cli.ok("push", make_checkpoint(tmp_path / "c", size=2000), f"{NAME}:{TAG}")
    state = Session.open(store).state
    state.path.write_bytes(content)
    for args in (("pull", f"{NAME}:{TAG}", tmp_path / "d"), ("log", f"{NAME}:{TAG}")):
        code, out = cli(*args)
        assert code == 1, out
        assert out["error"]["type"] == "StateFileError", out
        assert str(state.path) in out["error"]["message"]
    assert state.path.read_bytes() == content  # never overwritten behind the user's back
    assert not (tmp_path / "d").exists()


# ---- --expires-days ---------------------------------------------------------------------------------
@pytest.mark.parametrize("days", ["nan", "inf", "-inf", "1e9", "1e-7", "0", "-1", "36526"])
def test_bad_validity_refused_before_anything_is_written(
    days: str, home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    cli = Cli(capsys, str(store))
    cli.ok("keygen")
    code, out = cli(
        "push", make_checkpoint(tmp_path / "c", size=2000), f"{NAME}:{TAG}", f"--expires-days={days}"
    )
    assert code == 2, out
    assert out["error"]["type"] == "UsageError" and "--expires-days" in out["error"]["message"]
    assert not (store / "blobs").exists() or not any((store / "blobs").rglob("*"))
    assert not (store / "repos").exists()
    cli.ok("push", make_checkpoint(tmp_path / "c", size=2000), f"{NAME}:{TAG}")
    code, out = cli("tag", f"{NAME}:{TAG}", f"{NAME}:other", f"--expires-days={days}")
    assert code == 2 and out["error"]["type"] == "UsageError", out
    assert cli("log", f"{NAME}:other")[0] == 3


def test_shortest_validity_still_publishes_a_live_head(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(capsys, str(tmp_path / "store"))
    cli.ok("keygen")
    cli.ok("push", make_checkpoint(tmp_path / "c", size=2000), f"{NAME}:{TAG}", "--expires-days", "0.0001")
    cli.ok("pull", f"{NAME}:{TAG}", tmp_path / "d")


@pytest.mark.parametrize("grace", ["nan", "inf", "-1"])
def test_bad_grace_refused(
    grace: str, home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = Cli(capsys, str(tmp_path / "store"))("gc", f"--grace-seconds={grace}")
    assert code == 2 and out["error"]["type"] == "UsageError", out


# ---- scopes -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("scope", "repository", "tag", "allowed"),
    [
        ("*", "m/r/x", "t", True),
        ("*", "m", None, True),
        ("**", "m/r/x", None, True),
        ("m/*", "m/a", None, True),
        ("m/*", "m/r/x", None, False),  # '*' stays within one segment
        ("m/**", "m/r/x", None, True),
        ("m/?", "m/a", None, True),
        ("m/?", "m/ab", None, False),
        ("m/a", "m/a", "prod", True),
        ("m/a", "m/ab", None, False),
        ("m/a:prod", "m/a", "prod", True),
        ("m/a:prod", "m/a", "dev", False),
        ("m/a:prod", "m/a", None, False),  # by digest, no tag: a tag-scoped key does not vouch
        ("m/*:rel-*", "m/a", "rel-1", True),
        ("m/*:rel-*", "m/a/b", "rel-1", False),
        ("m/a.b", "m/axb", None, False),  # '.' is literal
    ],
)
def test_scope_matches(scope: str, repository: str, tag: str | None, allowed: bool) -> None:
    assert scope_matches(scope, repository, tag) is allowed


def test_tag_scoped_key_pushes_what_can_be_pulled(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    cli = Cli(capsys, str(store))
    cli.ok("keygen", "--scope", "m/a:prod")
    pushed = cli.ok("push", make_checkpoint(tmp_path / "c", size=2000), "m/a:prod")
    assert cli.ok("pull", "m/a:prod", tmp_path / "d")["digest"] == pushed["digest"]
    assert cli.ok("verify", "m/a:prod")["ok"]
    assert cli.ok("verify", tmp_path / "d")["ok"]
    code, out = cli("pull", f"m/a@{pushed['digest']}", tmp_path / "e")  # no tag resolved: not vouched for
    assert code == 1 and out["error"]["type"] == "UntrustedSignerError", out
    # A tag outside the key's scope is refused before anything is written.
    before = sorted(p.relative_to(store) for p in store.rglob("*"))
    code, out = cli("push", make_checkpoint(tmp_path / "c2", seed=5, size=2000), "m/a:dev")
    assert code == 1 and out["error"]["type"] == "UntrustedSignerError", out
    assert "nothing was written" in out["error"]["message"]
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == before
    code, out = cli("tag", "m/a:prod", "m/a:dev")
    assert code == 1 and out["error"]["type"] == "UntrustedSignerError", out
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == before


def test_segment_scope_does_not_cross_slash(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    cli = Cli(capsys, str(store))
    cli.ok("keygen", "--scope", "acme/*")
    cli.ok("push", make_checkpoint(tmp_path / "c", size=2000), "acme/llama:prod")
    code, out = cli("push", make_checkpoint(tmp_path / "c", size=2000), "acme/team/llama:prod")
    assert code == 1 and out["error"]["type"] == "UntrustedSignerError", out
    assert not (store / "repos" / "acme" / "team").exists()
