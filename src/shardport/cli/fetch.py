"""``pull``: a whole artifact (the registry's pull), or with ``--tp`` the ranks' bytes (the loader's).

Every check of ``--tp/--ep/--pp/--rank/--ranks/--force`` is made in one place,
:func:`select_ranks`; the loader and placement are imported only for a per-rank pull.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardport.registry.errors import UsageError

if TYPE_CHECKING:
    from shardport.placement import Topology
    from shardport.registry.session import Session

_RANKS = re.compile(r"([0-9]+)(?:-([0-9]+))?", re.ASCII)


def parse_ranks(text: str, world_size: int) -> list[int]:
    """``--ranks``: ``all``, ``A-B`` (inclusive) or ``A,B,...`` (ranges allowed inside the list).

    Each item is checked against ``0 .. world_size - 1`` before anything is expanded; a rank named twice
    is an error that names it.
    """
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


@dataclass(frozen=True)
class RankSelection:
    """What ``--tp/--ep/--pp`` with ``--rank`` or ``--ranks`` select.

    ``node`` is true for ``--ranks`` (the ranks of one node, one shared read, one node result), false
    for ``--rank`` (exactly one rank in ``ranks``, one rank result).
    """

    topology: Topology
    ranks: tuple[int, ...]
    node: bool


def select_ranks(args: argparse.Namespace) -> RankSelection | None:
    """The ranks ``pull``'s options select, or ``None`` for a whole pull; every refusal is a UsageError."""
    if args.tp is None:
        if args.rank is not None or args.ranks is not None:
            raise UsageError("--rank/--ranks select ranks of a topology: give --tp N (and --ep/--pp) too")
        return None
    if args.force:
        raise UsageError(
            "--force replaces DEST in a full pull; a per-rank pull (--tp) never deletes anything, "
            "it only adds or replaces its own rank files in DEST"
        )
    from shardport.placement import Topology

    topology = Topology(tp=args.tp, ep=args.ep, pp=args.pp)
    if args.ranks is None:
        return RankSelection(topology, (0 if args.rank is None else args.rank,), node=False)
    if args.rank is not None:
        raise UsageError("give either --rank R (one rank) or --ranks A-B (a node's ranks), not both")
    return RankSelection(topology, tuple(parse_ranks(args.ranks, topology.world_size)), node=True)


def _pull_ranks(session: Session, args: argparse.Namespace, selection: RankSelection) -> dict[str, Any]:
    from shardport.loader.rank_pull import pull_rank, pull_ranks
    from shardport.registry.artifact.refs import parse_ref

    ref = parse_ref(args.ref)
    if selection.node:
        node = pull_ranks(session, ref, args.dest, selection.topology, selection.ranks, policy=args.policy)
        return node.to_json()
    (rank,) = selection.ranks
    return pull_rank(session, ref, args.dest, selection.topology, rank, policy=args.policy).to_json()


def pull(session: Session, args: argparse.Namespace, json_mode: bool) -> tuple[Any, int]:
    """Run ``pull REF DEST`` (whole artifact) or ``pull REF DEST --tp N [--rank R | --ranks A-B]``."""
    selection = select_ranks(args)
    if selection is not None:
        return _pull_ranks(session, args, selection), 0
    from shardport.registry.artifact.refs import parse_ref
    from shardport.registry.progress import reporter
    from shardport.registry.pull import pull

    with reporter(json_mode) as rep:
        return pull(session, parse_ref(args.ref), args.dest, reporter=rep, force=args.force).to_json(), 0
