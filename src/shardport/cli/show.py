"""The commands that read the store and change nothing in it.

``log``, ``ls``, ``inspect``, ``verify`` and ``decode`` (which writes one local file).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardport.registry.session import Session


def log(session: Session, args: argparse.Namespace, json_mode: bool) -> tuple[Any, int]:
    """Run ``log NAME:TAG``."""
    from shardport.registry import commands
    from shardport.registry.artifact.refs import parse_ref

    return commands.log(session, parse_ref(args.ref, require_tag=True)), 0


def ls(session: Session, args: argparse.Namespace, json_mode: bool) -> tuple[Any, int]:
    """Run ``ls [NAME]``."""
    from shardport.registry import commands

    return commands.ls(session, args.name), 0


def inspect(session: Session, args: argparse.Namespace, json_mode: bool) -> tuple[Any, int]:
    """Run ``inspect REF``."""
    from shardport.registry import commands
    from shardport.registry.artifact.refs import parse_ref

    return commands.inspect(session, parse_ref(args.ref)), 0


def verify(session: Session, args: argparse.Namespace, json_mode: bool) -> tuple[Any, int]:
    """Run ``verify REF | DIR | PATH``: exit 1 when a finding says the store or a file lied."""
    from shardport.registry.artifact.refs import parse_ref
    from shardport.registry.verify import verify_checkpoint, verify_dir, verify_ref

    local = Path(args.target)
    if local.exists():
        if local.is_dir():
            report = verify_dir(session, local, strict=args.strict, allow_nonfinite=args.allow_nonfinite)
        else:
            report = verify_checkpoint(local, strict=args.strict, allow_nonfinite=args.allow_nonfinite)
    else:
        report = verify_ref(session, parse_ref(args.target))
    return report.to_json(), report.exit_code


def evidence(session: Session, args: argparse.Namespace, json_mode: bool) -> tuple[Any, int]:
    """Run ``evidence REF [--show DIGEST]``.

    Exit 1 when an attached statement does not verify or the newest one records a failed bring-up
    (:func:`~shardport.registry.evidence.exit_code`); with ``--show``, when the statement shown records
    a failed bring-up.
    """
    from shardport.registry import evidence as ev
    from shardport.registry.artifact.refs import parse_ref
    from shardport.registry.trust.resolve import resolve

    resolved = resolve(session, parse_ref(args.ref))
    if args.show:
        one = ev.show_evidence(session, resolved.ref.name, resolved.digest, args.show)
        doc = {"digest": one.digest, "signers": list(one.signers), "predicate": dict(one.predicate)}
        return doc, 0 if one.passed else 1
    report = ev.read_evidence(session, resolved.ref.name, resolved.digest)
    return {"manifest": resolved.digest, **ev.to_json(report)}, ev.exit_code(report)


def decode(session: Session, args: argparse.Namespace, json_mode: bool) -> tuple[Any, int]:
    """Run ``decode TARGET TENSOR --out FILE``."""
    from shardport.registry.decode import run_decode

    return run_decode(session, args.target, args.tensor, args.out).to_json(), 0
