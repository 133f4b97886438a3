"""Which function runs each command, and the session every command but ``keygen`` works on."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shardport.cli import bringup, fetch, housekeeping, keys, publish, show
from shardport.registry.errors import UsageError

if TYPE_CHECKING:
    from shardport.registry.session import Session

Command = Callable[["Session", argparse.Namespace, bool], tuple[Any, int]]

COMMANDS: dict[str, Command] = {
    "push": publish.push,
    "pull": fetch.pull,
    "tag": publish.tag,
    "rollback": publish.rollback,
    "log": show.log,
    "ls": show.ls,
    "inspect": show.inspect,
    "verify": show.verify,
    "evidence": show.evidence,
    "convert": publish.convert,
    "decode": show.decode,
    "gc": housekeeping.gc,
    "fsck": housekeeping.fsck,
    "up": bringup.up,
}


def open_session(args: argparse.Namespace) -> Session:
    """The session the global options (``--store``, ``--trust``, ``--key``, ...) describe."""
    from shardport.registry.session import Session

    return Session.open(
        getattr(args, "store", None),
        s3_endpoint=getattr(args, "s3_endpoint", None),
        trust=getattr(args, "trust", None),
        key=getattr(args, "key", None),
        allow_unsigned=getattr(args, "allow_unsigned", False),
    )


def dispatch(args: argparse.Namespace, json_mode: bool) -> tuple[Any, int]:
    """Run the parsed command; return its result (JSON-able) and its exit code."""
    if args.command == "keygen":
        return keys.keygen(args)
    command = COMMANDS.get(args.command)
    if command is None:
        raise UsageError(f"unknown command {args.command!r}")
    return command(open_session(args), args, json_mode)
