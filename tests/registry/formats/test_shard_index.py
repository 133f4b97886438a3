"""The sharded-checkpoint gate: model.safetensors.index.json against its shards."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from shardport.registry.formats import ContainerError, validate_sharded_checkpoint
from shardport.registry.formats import errors as E
from shardport.registry.formats.notes import Notes
from shardport.registry.formats.shard_index import check_shards, parse_shard_index

SHARD1, SHARD2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
TENSORS = {
    SHARD1: {"embed.weight": np.ones((4, 8), np.float16), "layers.0.q.weight": np.ones((8, 8), np.float32)},
    SHARD2: {"layers.0.k.weight": np.ones((2, 8), np.float32), "lm_head.weight": np.ones((4, 8), np.float16)},
}
TOTAL = sum(a.nbytes for shard in TENSORS.values() for a in shard.values())


def build(
    root: Path,
    *,
    index: dict[str, object] | None = None,
    extra: dict[str, dict[str, np.ndarray]] | None = None,
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    shards = {k: dict(v) for k, v in TENSORS.items()}
    for file, more in (extra or {}).items():
        shards.setdefault(file, {}).update(more)
    for file, tensors in shards.items():
        save_file(tensors, str(root / file))
    if index is None:
        index = {
            "metadata": {"total_size": TOTAL, "total_parameters": TOTAL // 3},
            "weight_map": {t: f for f, ts in TENSORS.items() for t in ts},
        }
    path = root / "model.safetensors.index.json"
    path.write_text(json.dumps(index))
    return path


def default_index() -> dict[str, object]:
    return {"metadata": {"total_size": TOTAL}, "weight_map": {t: f for f, ts in TENSORS.items() for t in ts}}


def test_valid_sharded_checkpoint(tmp_path: Path) -> None:
    result = validate_sharded_checkpoint(build(tmp_path))
    assert result.tensor_bytes == TOTAL == result.index.total_size
    assert [Path(h.path).name for h in result.shards] == [SHARD1, SHARD2]
    assert result.index.shard_files == (SHARD1, SHARD2)
    assert result.index.total_parameters == TOTAL // 3
    assert {t.name for h in result.shards for t in h.tensors} == set(result.index.weight_map)


def _with(mutate: Callable[[dict[str, object]], None]) -> dict[str, object]:
    index = default_index()
    mutate(index)
    return index


def _wm(index: dict[str, object]) -> dict[str, str]:
    wm = index["weight_map"]
    assert isinstance(wm, dict)
    return wm


IndexCase = tuple[
    str, dict[str, object], dict[str, dict[str, np.ndarray]] | None, type[ContainerError], str | None
]
CASES: list[IndexCase] = [
    (
        "total-size-is-file-sizes",
        _with(lambda i: i.update(metadata={"total_size": TOTAL + 2 * 8 + 300})),
        None,
        E.TotalSizeMismatchError,
        None,
    ),
    (
        "total-size-not-int",
        _with(lambda i: i.update(metadata={"total_size": "big"})),
        None,
        E.ShardIndexError,
        None,
    ),
    (
        "missing-shard",
        _with(lambda i: _wm(i).update({"extra.weight": "model-00003-of-00003.safetensors"})),
        None,
        E.ShardMissingError,
        None,
    ),
    (
        "tensor-not-in-its-shard",
        _with(lambda i: _wm(i).update({"ghost.weight": SHARD1})),
        None,
        E.ShardMembershipError,
        "ghost.weight",
    ),
    (
        "tensor-not-in-index",
        _with(lambda i: _wm(i).pop("lm_head.weight")),
        None,
        E.ShardMembershipError,
        "lm_head.weight",
    ),
    (
        "tensor-in-two-shards",
        default_index(),
        {SHARD2: {"embed.weight": np.ones((4, 8), np.float16)}},
        E.ShardMembershipError,
        "embed.weight",
    ),
    (
        "wrong-shard",
        _with(lambda i: _wm(i).update({"embed.weight": SHARD2})),
        None,
        E.ShardMembershipError,
        "embed.weight",
    ),
    (
        "path-traversal",
        _with(lambda i: _wm(i).update({"embed.weight": "../" + SHARD1})),
        None,
        E.ShardIndexError,
        "embed.weight",
    ),
    (
        "absolute-path",
        _with(lambda i: _wm(i).update({"embed.weight": "/etc/passwd"})),
        None,
        E.ShardIndexError,
        "embed.weight",
    ),
    (
        "shard-name-not-string",
        _with(lambda i: _wm(i).update({"embed.weight": 3})),
        None,
        E.ShardIndexError,
        "embed.weight",
    ),
    ("no-weight-map", {"metadata": {}}, None, E.ShardIndexError, None),
    ("empty-weight-map", {"weight_map": {}}, None, E.ShardIndexError, None),
    ("metadata-not-object", _with(lambda i: i.update(metadata=[1])), None, E.ShardIndexError, None),
]


@pytest.mark.parametrize(
    ("index", "extra", "err", "tensor"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_hostile_index(
    tmp_path: Path,
    index: dict[str, object],
    extra: dict[str, dict[str, np.ndarray]] | None,
    err: type[ContainerError],
    tensor: str | None,
) -> None:
    path = build(tmp_path, index=index, extra=extra)
    with pytest.raises(err) as info:
        validate_sharded_checkpoint(path)
    assert "model.safetensors.index.json" in str(info.value)
    if tensor is not None:
        assert info.value.tensor == tensor and repr(tensor) in str(info.value)


@pytest.mark.parametrize(
    ("metadata", "field"),
    [
        ({"total_size": TOTAL + 2 * 8 + 300}, "metadata.total_size"),  # the sum of file sizes
        ({"total_size": "big"}, "metadata.total_size"),
        ({"total_size": TOTAL, "total_parameters": -3}, "metadata.total_parameters"),
    ],
)
def test_index_totals_are_noted_not_refused_with_a_collector(
    tmp_path: Path, metadata: dict[str, object], field: str
) -> None:
    path = build(tmp_path, index=_with(lambda i: i.update(metadata=metadata)))
    notes = Notes(root=tmp_path)
    assert validate_sharded_checkpoint(path, notes=notes).tensor_bytes == TOTAL
    [note] = notes.items
    assert (note.file, note.field) == ("model.safetensors.index.json", field)
    assert str(tmp_path) not in note.message  # relative to the checkpoint: no host path in a manifest
    assert "check_total_size" not in note.message
    with pytest.raises((E.TotalSizeMismatchError, E.ShardIndexError)) as info:
        validate_sharded_checkpoint(path, notes=Notes(strict=True))
    assert type(info.value).__name__ == note.code


def test_absent_total_size_is_recorded_as_none(tmp_path: Path) -> None:
    path = build(tmp_path, index={"weight_map": default_index()["weight_map"]})
    assert validate_sharded_checkpoint(path).index.total_size is None


def test_duplicate_key_in_index(tmp_path: Path) -> None:
    path = build(tmp_path)
    text = path.read_text()
    path.write_text(text[:-1] + ', "weight_map": {}}')
    with pytest.raises(E.DuplicateKeyError, match="weight_map"):
        validate_sharded_checkpoint(path)


def test_symlink_escaping_the_directory(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    build(outside)
    root = tmp_path / "ckpt"
    path = build(root)
    (root / SHARD2).unlink()
    (root / SHARD2).symlink_to(outside / SHARD2)
    with pytest.raises(E.ShardIndexError, match="resolves to"):
        validate_sharded_checkpoint(path)


def test_hostile_shard_propagates_its_error(tmp_path: Path) -> None:
    path = build(tmp_path)
    with (tmp_path / SHARD2).open("ab") as f:
        f.write(b"\0")
    with pytest.raises(E.TrailingBytesError, match=SHARD2):
        validate_sharded_checkpoint(path)


def test_index_size_cap(tmp_path: Path) -> None:
    with pytest.raises(E.ShardIndexError, match="expected at most 16 bytes"):
        validate_sharded_checkpoint(build(tmp_path), max_index_bytes=16)


def test_pure_steps_need_no_files(tmp_path: Path) -> None:
    path = build(tmp_path)
    index = parse_shard_index("mem://index.json", path.read_bytes())
    assert index.shard_files == (SHARD1, SHARD2)
    with pytest.raises(E.ShardMissingError, match=r"mem://index\.json"):
        check_shards(index, {})
