"""The ledger's range arithmetic: distinct pages touched, merged ranges, overlap queries."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shardport.loader.ledger import FetchedRange, merge_ranges, paged_bytes

PAGE = 64  # small pages keep the byte-by-byte reference cheap; the arithmetic is the same at 4096


def _bytes(r: FetchedRange) -> set[tuple[str, int]]:
    """Every (file, byte) the record reads."""
    runs = r.count if r.stride else 1
    return {(r.file, r.offset + k * r.stride + b) for k in range(runs) for b in range(r.length)}


@st.composite
def records(draw: st.DrawFn) -> FetchedRange:
    file = draw(st.sampled_from(["a.safetensors", "b.gguf"]))
    offset = draw(st.integers(0, 6 * PAGE))
    length = draw(st.integers(0, 2 * PAGE + 3))
    if draw(st.booleans()):
        return FetchedRange(file, offset, length)
    stride = draw(st.integers(max(1, length), 3 * PAGE))
    return FetchedRange(file, offset, length, stride, draw(st.integers(1, 12)))


@settings(max_examples=300, deadline=None)
@given(st.lists(records(), max_size=8))
def test_paged_bytes_counts_each_distinct_page_once(ranges: list[FetchedRange]) -> None:
    touched = set().union(*(_bytes(r) for r in ranges)) if ranges else set()
    pages = {(file, b // PAGE) for file, b in touched}
    assert paged_bytes(tuple(ranges), PAGE) == len(pages) * PAGE


@settings(max_examples=200, deadline=None)
@given(st.lists(records(), max_size=8), st.integers(0, 40 * PAGE), st.integers(1, 3 * PAGE))
def test_merged_ranges_read_the_same_bytes_and_answer_overlaps_alike(
    ranges: list[FetchedRange], offset: int, length: int
) -> None:
    merged = merge_ranges(ranges)
    read = set().union(set(), *(_bytes(r) for r in ranges))
    assert set().union(set(), *(_bytes(r) for r in merged)) == read
    for file in ("a.safetensors", "b.gguf"):
        wanted = {(file, b) for b in range(offset, offset + length)}
        assert any(r.overlaps(file, offset, length) for r in merged) == bool(wanted & read)


def test_a_column_split_ranks_strided_rows_count_one_page_per_row() -> None:
    # 2 KiB of every 8 KiB row over 2^17 rows (a 512 MiB rank's record): one 4 KiB page per row
    rows = 1 << 17
    first = FetchedRange("m.safetensors", 0, 2048, 8192, rows)
    assert paged_bytes((first,)) == rows * 4096
    # the neighbouring rank's 2 KiB share those pages: together, still one page per row
    assert paged_bytes((first, FetchedRange("m.safetensors", 2048, 2048, 8192, rows))) == rows * 4096
    # one byte across a page boundary touches two
    assert paged_bytes((FetchedRange("m.safetensors", 4095, 2),)) == 2 * 4096
