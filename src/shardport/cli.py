"""Entry point of the ``registry`` console script."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``registry``; the registry commands import neither torch nor Ray."""
    from shardport.registry.cli import run

    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
