from __future__ import annotations

from pathlib import Path

import pytest

from shardport.registry.artifact.paths import check_paths
from shardport.registry.artifact.refs import Ref, parse_ref, validate_name
from shardport.registry.commands import keygen
from shardport.registry.errors import UnsafePathError, UsageError


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("acme/llama-3-8b-q4:prod", Ref("acme/llama-3-8b-q4", tag="prod")),
        ("a:B_1.x", Ref("a", tag="B_1.x")),
        ("a/b@sha256:" + "0" * 64, Ref("a/b", digest="sha256:" + "0" * 64)),
    ],
)
def test_parse_ok(text: str, ref: Ref) -> None:
    assert parse_ref(text) == ref
    assert str(parse_ref(text)) == text


@pytest.mark.parametrize(
    "text",
    [
        "",
        "a",
        "A/b:t",
        "a//b:t",
        "a/./b:t",
        "a/../b:t",
        "/a:t",
        "a/:t",
        "a:",
        "a:t/x",
        "a@sha256:12",
        "a@md5:" + "0" * 32,
        "a/tags/b:t",
        "-a:t",
        "a:" + "x" * 200,
        "a b:t",
        "m/y\n:t",  # re.match with $ accepted a trailing newline (and created repos/m/y\n/)
        "m/y:tag\n",
        "m/y@sha256:" + "0" * 64 + "\n",
        "m/y@sha256:" + "A" * 64,
        "m/\u0661:t",  # a non-ASCII digit
    ],
)
def test_parse_refused(text: str) -> None:
    with pytest.raises(UsageError):
        parse_ref(text)


def test_require_tag() -> None:
    with pytest.raises(UsageError, match="NAME:TAG"):
        parse_ref("a@sha256:" + "1" * 64, require_tag=True)
    assert validate_name("a.b/c_d-e") == "a.b/c_d-e"


def test_paths_ok() -> None:
    assert [str(p) for p in check_paths(["a", "b/c.safetensors", ".hidden"], source="m")] == [
        "a",
        "b/c.safetensors",
        ".hidden",
    ]


@pytest.mark.parametrize(
    ("paths", "text"),
    [
        (["../x"], "'..'"),
        (["/etc/passwd"], "absolute"),
        (["C:/x"], "absolute"),
        (["a//b"], "empty"),
        (["a/./b"], "'.'"),
        (["a\\b"], "backslash"),
        (["a\nb"], "control"),
        ([""], "empty"),
        (["a", "a"], "twice"),
        (["a", "a/b"], "both a file and the folder"),
        ([".shardport/manifest.json"], "reserved"),
        ([".SHARDPORT/manifest.json"], "reserved"),
        (["evil\u202etxt.exe"], "bidirectional control U\\+202E"),
        (["a\u2066b"], "bidirectional control U\\+2066"),
        (["a\u200bb"], "format character U\\+200B"),
        (["\ufeffa"], "format character U\\+FEFF"),
        (["a\x7fb"], "control character U\\+007F"),
        (["a\x85b"], "control character U\\+0085"),
        (["a\tb"], "control character U\\+0009"),
        (["a\u2028b"], "separator U\\+2028"),
        (["a\udcffb"], "surrogate"),
        (["cafe\u0301.bin"], "not in Unicode NFC"),
        (["Model.bin", "model.bin"], "only in case or Unicode form"),
        (["Straße.bin", "STRASSE.bin"], "only in case or Unicode form"),
        (["A", "a/b"], "both a file and the folder"),
        (["x" * 256], "longer than 255 bytes"),
        (["é" * 128], "longer than 255 bytes"),
        (["/".join(["d" * 200] * 6)], "longer than 1024 bytes"),
    ],
)
def test_paths_refused(paths: list[str], text: str) -> None:
    with pytest.raises(UnsafePathError, match=text):
        check_paths(paths, source="manifest X")
    with pytest.raises(UsageError, match=text):  # the same rules refuse a folder being pushed
        check_paths(paths, source="push X", error=UsageError)


def test_paths_accepted_beyond_ascii() -> None:
    ok = ["café/modèle.bin", "日本語.txt", "a b/c-d_e.f", "e" * 255, "ÿ", "x/" * 300 + "y"]
    assert [str(p) for p in check_paths(ok, source="m")] == ok


def test_key_names_are_whole_matches(home: Path) -> None:
    for bad in ["a\n", "é", "", "a/b", "x" * 65]:
        with pytest.raises(UsageError, match="key name"):
            keygen(bad)
