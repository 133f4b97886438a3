"""The staged writer: safetensors bytes as the library writes them, never through a link, all or nothing."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save

from shardport.registry.errors import UsageError
from shardport.registry.output.writers import StagedFiles, safetensors_layout, write_safetensors

DTYPES = ["bool", "<u1", "<i1", "<i2", ">u2", "<f2", "<i4", ">u4", "<f4", ">f8", "<i8", "<u8"]

arrays_strategy = st.dictionaries(
    st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=6).filter(
        lambda k: k != "__metadata__"
    ),
    st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 5), max_size=3), st.integers(0, 2**32 - 1)),
    max_size=6,
)


def _build(spec: dict[str, tuple[str, list[int], int]]) -> dict[str, np.ndarray]:
    out = {}
    for name, (dtype, shape, seed) in spec.items():
        raw = np.random.default_rng(seed).integers(0, 256, int(np.prod(shape)) * np.dtype(dtype).itemsize)
        array = np.frombuffer(raw.astype(np.uint8).tobytes(), dtype=dtype).reshape(shape)
        out[name] = array if dtype != "bool" else np.asarray(array.view(np.uint8) % 2 == 1)
    return out


@settings(max_examples=60, deadline=None)
@given(arrays_strategy, st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=1))
def test_layout_is_byte_for_byte_the_librarys(
    spec: dict[str, tuple[str, list[int], int]],
    meta: dict[str, str],
) -> None:
    """(At most one metadata entry: the library writes its metadata in hash order.)"""
    arrays = _build(spec)
    header, data = safetensors_layout(arrays, meta)
    little = {k: a.astype(a.dtype.newbyteorder("<")) for k, a in arrays.items()}  # 0-d stays 0-d
    assert header + b"".join(raw.tobytes() for _, _, raw in data) == save(little, meta or None)


def test_written_file_reads_back(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "strided": rng.standard_normal((6, 8)).astype(np.float32)[:, ::2],  # not contiguous
        "big_endian": np.arange(5, dtype=">u2"),
        "scalar": np.array(7, dtype=np.int64),
        "empty": np.zeros((0, 3), dtype=np.float16),
    }
    out = tmp_path / "sub" / "x.safetensors"
    write_safetensors(arrays, out, {"k": "v"})
    back = load_file(out)
    assert set(back) == set(arrays)
    for name, array in arrays.items():
        assert back[name].shape == array.shape and np.array_equal(back[name], array), name
    assert sorted(os.listdir(out.parent)) == ["x.safetensors"]


def test_link_at_the_final_name_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "a.json").write_text("old a")
    (folder / "b.json").symlink_to(victim)
    with StagedFiles(folder) as staged:
        staged.write_text("a.json", "new a")
        staged.write_text("b.json", "new b")
        with pytest.raises(UsageError, match=r"b\.json: is a symbolic link"):
            staged.publish()
    assert victim.read_bytes() == b"precious"
    assert (folder / "a.json").read_text() == "old a"  # nothing published
    assert sorted(os.listdir(folder)) == ["a.json", "b.json"]  # no temporary file left


def test_failure_discards_everything_and_the_folder_made_for_it(tmp_path: Path) -> None:
    folder = tmp_path / "new"
    with pytest.raises(RuntimeError), StagedFiles(folder) as staged:
        staged.write_text("a.json", "a")
        assert len(os.listdir(folder)) == 1
        raise RuntimeError("the pull failed")
    assert not folder.exists()
    with StagedFiles(folder) as staged:  # a published file replaces a regular file of that name
        staged.write_text("a.json", "one")
        staged.publish()
    with StagedFiles(folder) as staged:
        staged.write_text("a.json", "two")
        staged.publish()
    assert os.listdir(folder) == ["a.json"] and (folder / "a.json").read_text() == "two"


def test_read_back_names_the_first_difference(tmp_path: Path) -> None:
    """The read-back compare (chunked, not mapped) finds a changed byte in the tensor that holds it."""
    from shardport.registry.output.writers import _first_difference

    arrays = {"a": np.arange(12, dtype=np.float32), "b": np.arange(3 << 20, dtype=np.uint8)}
    header, data = safetensors_layout(arrays, None)
    path = tmp_path / "x.safetensors"
    path.write_bytes(header + b"".join(raw.tobytes() for _, _, raw in data))
    assert _first_difference(str(path), header, data) is None
    last = data[-1][0]
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        old = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(b"\x00" if old == b"\xff" else b"\xff")
    assert _first_difference(str(path), header, data) == f"tensor {last}"
    with open(path, "r+b") as f:
        f.truncate(len(header) + 5)
    assert _first_difference(str(path), header, data) == f"the file's size {len(header) + 5}"


def test_a_write_the_file_system_refuses_is_a_usage_error_and_leaves_nothing(tmp_path: Path) -> None:
    """A full disk or a quota (here: RLIMIT_FSIZE, which root cannot bypass) during a durable write."""
    import subprocess
    import sys
    import textwrap

    child = textwrap.dedent(
        f"""
        import resource, signal
        from pathlib import Path
        from shardport.registry.errors import UsageError
        from shardport.registry.output.writers import write_file
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
        try:
            write_file(Path({str(tmp_path / "out.bin")!r}), b"x" * 5000, durable=True)
        except UsageError as exc:
            print("refused:", exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "out.bin: could not write it (File too large)" in done.stdout
    assert os.listdir(tmp_path) == []  # no staged part left, nothing published


def test_a_durable_write_never_makes_its_folder(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    with pytest.raises(UsageError, match=r"the folder is gone"):
        StagedFiles(gone, durable=True)
    assert not gone.exists()
    from shardport.registry.output.writers import write_file

    with pytest.raises(UsageError, match=r"the folder is gone"):
        write_file(gone / "report.html", b"<html>", durable=True)
    assert not gone.exists()
