"""Entry point of the ``registry`` console script.

The registry commands import neither torch nor Ray; commands served by higher layers (a per-rank
``pull --tp``) are plugged in here, where every layer may be imported, and loaded only when used.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardport.registry.session import Session


def parse_ranks(text: str, world_size: int) -> list[int]:
    """``--ranks``: ``all``, ``A-B`` (inclusive) or ``A,B,...`` (ranges allowed inside the list)."""
    from shardport.registry.errors import UsageError

    if text.strip() == "all":
        return list(range(world_size))
    out: list[int] = []
    for part in text.split(","):
        first, sep, last = part.strip().partition("-")
        try:
            a = int(first)
            b = int(last) if sep else a
        except ValueError:
            raise UsageError(f"--ranks {text!r}: expected all, A-B or A,B,... (integers)") from None
        if b < a:
            raise UsageError(f"--ranks {text!r}: range {a}-{b} runs backwards")
        out += range(a, b + 1)
    return out


def _pull_rank(session: Session, args: argparse.Namespace) -> dict[str, Any]:
    from shardport.loader.rank_pull import pull_rank, pull_ranks
    from shardport.placement import Topology
    from shardport.registry.refs import parse_ref

    topology = Topology(tp=args.tp, ep=args.ep, pp=args.pp)
    if args.ranks is not None:
        ranks = parse_ranks(args.ranks, topology.world_size)
        node = pull_ranks(session, parse_ref(args.ref), args.dest, topology, ranks, policy=args.policy)
        return node.to_json()
    result = pull_rank(session, parse_ref(args.ref), args.dest, topology, args.rank, policy=args.policy)
    return result.to_json()


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``registry``."""
    from shardport.registry.cli import run

    return run(argv, extensions={"pull_rank": _pull_rank})


if __name__ == "__main__":
    sys.exit(main())
