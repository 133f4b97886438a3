from __future__ import annotations

import pytest

from shardport.registry.errors import UnsafePathError, UsageError
from shardport.registry.paths import check_paths
from shardport.registry.refs import Ref, parse_ref, validate_name


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
    ],
)
def test_paths_refused(paths: list[str], text: str) -> None:
    with pytest.raises(UnsafePathError, match=text):
        check_paths(paths, source="manifest X")
