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


def _pull_rank(session: Session, args: argparse.Namespace) -> dict[str, Any]:
    from shardport.loader.rank_pull import pull_rank
    from shardport.placement import Topology
    from shardport.registry.refs import parse_ref

    topology = Topology(tp=args.tp, ep=args.ep, pp=args.pp)
    result = pull_rank(session, parse_ref(args.ref), args.dest, topology, args.rank, policy=args.policy)
    return result.to_json()


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``registry``."""
    from shardport.registry.cli import run

    return run(argv, extensions={"pull_rank": _pull_rank})


if __name__ == "__main__":
    sys.exit(main())
