"""Notes: what a gate found in a field no consumer reads, recorded instead of refused.

Every gate asks one question of what it checks: does a consumer depend on it (offsets, extents,
overlaps, dtypes, shapes, ranges — those always refuse), or does it police a field that no loader
reads (a size in an index, an unknown field, informative metadata)? A policing check builds the same
typed error it would raise and hands it to a :class:`Notes` collector: under ``strict`` the collector
raises it (so ``push --strict`` refuses with that error and its exit code), otherwise it keeps a
:class:`Note`. Push records the notes in the manifest (``notes``); ``inspect`` shows them.

A note never names where the checkpoint lay on the pushing machine: file paths are made relative to
the checkpoint root, so the same files give the same notes — and the same manifest digest — anywhere.
"""

from __future__ import annotations

from pathlib import Path, PurePath

from pydantic import BaseModel, ConfigDict

from shardport import ShardportError


class Note(BaseModel):
    """One non-fatal finding: the error ``code`` it would be under ``--strict`` and its parts."""

    model_config = ConfigDict(frozen=True, extra="allow")

    code: str
    file: str | None = None
    tensor: str | None = None
    field: str
    expected: str
    found: str
    message: str


MAX_PER_KIND = 8
"""Notes kept per (code, file); the rest are counted in one summary note, so the manifest stays small
(an unknown field on each of 10,000 tensors is one finding, not 10,000)."""


class Notes:
    """Collects notes in the order the gates run; with ``strict``, raises each error instead.

    ``root``: the checkpoint folder; files under it are recorded by their relative POSIX path.
    """

    __slots__ = ("_items", "_more", "_seen", "root", "strict")

    def __init__(self, *, strict: bool = False, root: str | PurePath | None = None) -> None:
        self.strict = strict
        self.root = Path(root) if root is not None else None
        self._items: list[Note] = []
        self._more: dict[tuple[str, str | None], int] = {}
        self._seen: set[Note] = set()

    @property
    def items(self) -> tuple[Note, ...]:
        """The notes kept so far, then one summary per (code, file) that had more than it kept."""
        more = [
            Note(
                code=code,
                file=file,
                field="notes",
                expected=f"at most {MAX_PER_KIND} recorded",
                found=f"{count} more",
                message=f"{file + ': ' if file else ''}{count} more {code} notes like these (not recorded)",
            )
            for (code, file), count in self._more.items()
            if count
        ]
        return (*self._items, *more)

    def add(self, error: ShardportError) -> None:
        """Record ``error`` as a note, or raise it under ``strict``.

        ``error`` carries ``field``, ``expected`` and ``found`` (and optionally ``file``, ``tensor``
        and ``remedy``), as the container and contract errors do.
        """
        if self.strict:
            raise error
        self.keep(error)

    def keep(self, error: ShardportError) -> None:
        """Record ``error`` as a note whatever ``strict`` says (a finding the user's switch allows)."""
        file = self._relative(getattr(error, "file", None))
        tensor = getattr(error, "tensor", None)
        field, expected, found = (str(getattr(error, k, "")) for k in ("field", "expected", "found"))
        if file:
            where = f"{file}: " + (f"tensor {tensor!r}: " if tensor is not None else "")
        else:
            where = f"{tensor}: " if tensor is not None else ""
        message = f"{where}{field}: expected {expected}, found {found}"
        remedy = getattr(error, "remedy", None)
        if remedy:
            message += f" (remedy: {remedy})"
        note = Note(
            code=type(error).__name__,
            file=file,
            tensor=None if tensor is None else str(tensor),
            field=field,
            expected=expected,
            found=found,
            message=message,
        )
        if note in self._seen:  # a file checked twice (an index's shard, then the shard) notes once
            return
        self._seen.add(note)
        kind = (note.code, note.file)
        if sum(1 for n in self._items if (n.code, n.file) == kind) >= MAX_PER_KIND:
            self._more[kind] = self._more.get(kind, 0) + 1
            return
        self._items.append(note)

    def _relative(self, file: object) -> str | None:
        if file is None:
            return None
        path = Path(str(file))
        if self.root is not None:
            try:
                return path.relative_to(self.root).as_posix()
            except ValueError:
                pass
        return path.name if path.is_absolute() else path.as_posix()


def collector(notes: Notes | None) -> Notes:
    """``notes``, or a strict collector: a gate called without one raises, as it always did."""
    return notes if notes is not None else Notes(strict=True)
