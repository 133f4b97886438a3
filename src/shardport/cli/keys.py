"""``keygen``: make an Ed25519 key pair and trust it locally (needs no store)."""

from __future__ import annotations

import argparse
from typing import Any


def keygen(args: argparse.Namespace) -> tuple[Any, int]:
    """Run ``keygen``; return its result and exit code."""
    from shardport.registry import commands

    return commands.keygen(args.name, tuple(args.scope or ["*"])), 0
