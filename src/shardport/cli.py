"""Entry point of the ``registry`` console script.

The registry commands import neither torch nor Ray; commands served by higher layers (a per-rank
``pull --tp``) are plugged in here, where every layer may be imported, and loaded only when used.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardport.registry.session import Session


_RANKS = re.compile(r"([0-9]+)(?:-([0-9]+))?", re.ASCII)


def parse_ranks(text: str, world_size: int) -> list[int]:
    """``--ranks``: ``all``, ``A-B`` (inclusive) or ``A,B,...`` (ranges allowed inside the list).

    Each item is checked against ``0 .. world_size - 1`` before anything is expanded; a rank named twice
    is an error that names it.
    """
    from shardport.registry.errors import UsageError

    if text.strip() == "all":
        return list(range(world_size))
    out: list[int] = []
    seen: set[int] = set()
    for part in text.split(","):
        item = part.strip()
        match = _RANKS.fullmatch(item)
        if match is None:
            raise UsageError(
                f"--ranks {text!r}: {item!r} is not a rank (expected all, A-B or A,B,... integers)"
            )
        a = int(match.group(1))
        b = int(match.group(2)) if match.group(2) is not None else a
        if b < a:
            raise UsageError(f"--ranks {text!r}: range {item} runs backwards")
        if b >= world_size:
            raise UsageError(
                f"--ranks {text!r}: {item} is outside 0..{world_size - 1} (world size {world_size})"
            )
        for rank in range(a, b + 1):
            if rank in seen:
                raise UsageError(f"--ranks {text!r}: rank {rank} is named twice")
            seen.add(rank)
            out.append(rank)
    return out


def _pull_rank(session: Session, args: argparse.Namespace) -> dict[str, Any]:
    from shardport.loader.rank_pull import pull_rank, pull_ranks
    from shardport.placement import Topology
    from shardport.registry.errors import UsageError
    from shardport.registry.refs import parse_ref

    topology = Topology(tp=args.tp, ep=args.ep, pp=args.pp)
    if args.ranks is not None:
        if args.rank is not None:
            raise UsageError("give either --rank R (one rank) or --ranks A-B (a node's ranks), not both")
        ranks = parse_ranks(args.ranks, topology.world_size)
        node = pull_ranks(session, parse_ref(args.ref), args.dest, topology, ranks, policy=args.policy)
        return node.to_json()
    rank = 0 if args.rank is None else args.rank
    result = pull_rank(session, parse_ref(args.ref), args.dest, topology, rank, policy=args.policy)
    return result.to_json()


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``registry``."""
    from shardport.registry.cli import run

    return run(argv, extensions={"pull_rank": _pull_rank})


if __name__ == "__main__":
    sys.exit(main())
