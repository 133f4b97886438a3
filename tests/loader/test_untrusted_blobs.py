"""A local rank read refuses a blob that is not a regular file: no hang, no read of a huge file."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from loader_artifacts import load, publish, rank_slices, write_safetensors

from shardport.registry.errors import StoreObjectError


def _replace(path: Path, kind: str, tmp: Path) -> str:
    path.unlink()
    if kind == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
        return "a symbolic link"
    if kind == "link-to-sparse-file":
        big = tmp / "sparse.bin"
        with open(big, "wb") as fh:
            fh.truncate(64 << 30)
        path.symlink_to(big)
        return "a symbolic link"
    if kind == "named-pipe":
        os.mkfifo(path)
        return "a named pipe"
    path.mkdir()
    return "a folder"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["link-to-dev-zero", "link-to-sparse-file", "named-pipe", "folder"])
def test_rank_reads_refuse_a_blob_that_is_not_a_regular_file(kind: str, tmp_path: Path) -> None:
    art = publish(write_safetensors(tmp_path / "ckpt"), str(tmp_path / "store"), minimum=2 << 10)
    found = _replace(Path(art.store.path(art.blob)), kind, tmp_path)
    slices = rank_slices(art, 2, 1, "col")
    for options in ({}, {"direct_io": False, "page_cache": False}, {"direct_io": True, "page_cache": True}):
        start = time.monotonic()
        with pytest.raises(StoreObjectError) as info:
            load(art, slices, batch_bytes=64 << 10, **options)
        assert time.monotonic() - start < 10
        message = str(info.value)
        assert art.file in message and art.blob in message and found in message, message


def test_a_blob_swapped_for_another_file_between_the_two_opens_is_refused(tmp_path: Path) -> None:
    """The O_DIRECT descriptor must be the same file as the checked one."""
    from shardport.loader.sources import LocalBlobSource

    art = publish(write_safetensors(tmp_path / "ckpt"), str(tmp_path / "store"), minimum=2 << 10)
    source = LocalBlobSource(art.store, {art.file: art.files[0].digest}, direct=True)
    try:
        source._fd(art.file)  # the checked descriptor
        blob = Path(art.store.path(art.blob))
        copy = blob.with_name("copy")
        copy.write_bytes(blob.read_bytes())
        os.replace(copy, blob)  # same name, another file
        with pytest.raises(StoreObjectError, match="replaced"):
            source._direct_fd(art.file)
    finally:
        source.close()
