"""Progress reporting: rich bars on a TTY, silence with ``--json`` or when output is not a terminal."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol


class Reporter(Protocol):
    """Receives progress of long operations."""

    def task(self, description: str, total: int) -> Callable[[int], None]:
        """Start a task measured in bytes; return the function that advances it."""
        ...


class Quiet:
    """Reports nothing."""

    def task(self, description: str, total: int) -> Callable[[int], None]:
        """A no-op advance function."""
        return lambda n: None


class RichReporter:
    """Reports with rich progress bars (thread-safe advance)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.progress = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._lock = threading.Lock()

    def task(self, description: str, total: int) -> Callable[[int], None]:
        """Add a bar; return its advance function."""
        tid = self.progress.add_task(description, total=total)

        def advance(n: int) -> None:
            with self._lock:
                self.progress.advance(tid, n)

        return advance


@contextmanager
def reporter(json_mode: bool) -> Iterator[Reporter]:
    """A rich reporter on an interactive stderr unless ``json_mode``; otherwise quiet."""
    if json_mode or not sys.stderr.isatty():
        yield Quiet()
        return
    rich = RichReporter()
    with rich.progress:
        yield rich
