"""One set of path rules at push and pull: what push refuses, and that whatever it accepts pulls back."""

from __future__ import annotations

import tempfile
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support import Cli, make_checkpoint

from shardport.provenance.keys import SigningKey
from shardport.registry.artifact.paths import check_paths
from shardport.registry.artifact.refs import parse_ref
from shardport.registry.checkpoint.describe import scan
from shardport.registry.errors import UnsafePathError
from shardport.registry.pull import pull
from shardport.registry.push import push
from shardport.registry.session import Session
from shardport.registry.store.protocol import Store
from shardport.registry.trust.policy import TrustPolicy
from shardport.registry.trust.state import TrustState


def stored_files(store: Path) -> list[Path]:
    return [p for p in store.rglob("*") if p.is_file()] if store.exists() else []


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("a\\b.txt", "backslashes"),  # pull refused it before: now push refuses it first
        ("evil\u202etxt.exe", "U+202E"),
        ("tab\there", "U+0009"),
        (unicodedata.normalize("NFD", "modèle.bin"), "not in Unicode NFC"),
    ],
)
def test_push_refuses_a_file_name_pull_would_refuse(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str
) -> None:
    src = make_checkpoint(tmp_path / "src")
    (src / name).write_bytes(b"x")
    cli = Cli(capsys, str(tmp_path / "store"))
    cli.ok("keygen")
    code, out = cli("push", src, "acme/m:v1")
    assert code == 2 and out["error"]["type"] == "UsageError", out
    assert repr(name) in out["error"]["message"] and text in out["error"]["message"]
    assert stored_files(tmp_path / "store") == []  # refused before anything was uploaded


def test_push_refuses_names_differing_only_in_case(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = make_checkpoint(tmp_path / "src")
    (src / "README.md").write_text("a")
    (src / "readme.md").write_text("b")
    cli = Cli(capsys, str(tmp_path / "store"))
    cli.ok("keygen")
    code, out = cli("push", src, "acme/m:v1")
    assert code == 2 and "only in case" in out["error"]["message"], out
    assert stored_files(tmp_path / "store") == []


@pytest.mark.parametrize("ref", ["m/y\n:v1", "m/y:tag\n", "m/y:v1\n"])
def test_trailing_newline_in_name_or_tag_is_refused(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], ref: str
) -> None:
    """``re.match`` with ``$`` let these through and created ``repos/m/y\\n/``."""
    cli = Cli(capsys, str(tmp_path / "store"))
    cli.ok("keygen")
    code, out = cli("push", make_checkpoint(tmp_path / "src"), ref)
    assert code == 2 and out["error"]["type"] == "UsageError", out
    assert stored_files(tmp_path / "store") == []


# Segments: any characters but '/' and the categories the rules always refuse, mapped to NFC; the rules
# then decide ('.', '..', case and Unicode-form collisions, a file that is another's folder...).
_segment = st.text(
    st.characters(blacklist_categories=("Cs", "Cc", "Cf", "Zl", "Zp"), blacklist_characters="/\\"),
    min_size=1,
    max_size=12,
).map(lambda s: unicodedata.normalize("NFC", s))
_path = st.lists(_segment, min_size=1, max_size=3).map("/".join)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(paths=st.lists(_path, min_size=1, max_size=4, unique=True), data=st.data())
def test_accepted_paths_round_trip_through_pull(paths: list[str], data: st.DataObject) -> None:
    """Any set of paths the rules accept is pushed and pulled back to exactly those files."""
    try:
        check_paths(paths, source="generated")
    except UnsafePathError:
        assume(False)
    assume(not any(p.endswith((".safetensors", ".gguf")) for p in paths))  # no container gates here
    contents = {p: data.draw(st.binary(max_size=64), label=p) for p in paths}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        key = SigningKey.generate()
        session = Session(
            store=Store(str(root / "store")),
            policy=TrustPolicy().with_key(key.verifying_key(), "t", ("*",)),
            state=TrustState(root / "state", "test"),
            key=key,
        )
        src = root / "src"
        for p, body in contents.items():
            (src / p).parent.mkdir(parents=True, exist_ok=True)
            (src / p).write_bytes(body)
        push(session, src, "acme/p", "v1")
        pull(session, parse_ref("acme/p:v1"), root / "dest")
        assert sorted(rel for rel, _ in scan(root / "dest")) == sorted(paths)
        for p, body in contents.items():
            assert (root / "dest" / p).read_bytes() == body
