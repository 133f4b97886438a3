"""Store maintenance: ``gc`` and ``fsck``."""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from shardport.registry.errors import UsageError

if TYPE_CHECKING:
    from shardport.registry.session import Session

_MAX_GRACE_S = 100 * 365 * 86400.0


def gc(session: Session, args: argparse.Namespace, json_mode: bool) -> tuple[Any, int]:
    """Run ``gc [--dry-run] [--grace-seconds S]``."""
    from shardport.registry.housekeeping import gc

    if not 0 <= args.grace_seconds <= _MAX_GRACE_S:  # also refuses nan
        raise UsageError(
            f"--grace-seconds {args.grace_seconds}: expected 0 .. {_MAX_GRACE_S:.0f} "
            "(a negative grace would delete the blobs of pushes in flight)"
        )
    return gc(session, dry_run=args.dry_run, grace=timedelta(seconds=args.grace_seconds)).to_json(), 0


def fsck(session: Session, args: argparse.Namespace, json_mode: bool) -> tuple[Any, int]:
    """Run ``fsck``: exit 1 when anything is corrupt, dangling or broken."""
    from shardport.registry.housekeeping import fsck

    found = fsck(session)
    return found.to_json(), 0 if found.ok else 1
