"""The commands that write tags: ``push``, ``tag``, ``rollback`` and ``convert``.

Each imports the registry modules it needs when it runs.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardport.registry.errors import UsageError

if TYPE_CHECKING:
    from shardport.registry.artifact.manifest import Manifest
    from shardport.registry.session import Session


def manifest_layers(manifest: Manifest) -> Manifest:
    """The layers above the registry, computed from the manifest draft (pure; push and convert).

    ``runtime``: the runtime and catalogue admission ran against and the expected kernel per weight
    class and device class (:func:`shardport.kernels.expectations.runtime_layer`; the draft's
    ``--kernels-*`` ids steer it); ``topology``: the degrees bring-up can place it at
    (:func:`shardport.deploy.topology_check.placeable_degrees`).
    """
    from shardport.deploy.topology_check import placeable_degrees
    from shardport.kernels.expectations import runtime_layer

    return manifest.model_copy(
        update={"runtime": runtime_layer(manifest), "topology": placeable_degrees(manifest)}
    )


def _declare(text: str | None) -> str | None:
    """``--declare`` takes inline JSON or a path to a JSON file."""
    if text is None or text.lstrip().startswith("{"):
        return text
    try:
        return Path(text).read_text()
    except OSError as exc:
        raise UsageError(
            f"--declare {text}: not inline JSON and not a readable file ({exc.strerror})"
        ) from exc


def push(session: Session, args: argparse.Namespace, json_mode: bool) -> tuple[Any, int]:
    """Run ``push SRC NAME:TAG``."""
    from shardport.registry.artifact.refs import parse_ref
    from shardport.registry.progress import reporter
    from shardport.registry.push import push
    from shardport.registry.trust.tagging import validity

    ref = parse_ref(args.target, require_tag=True)
    assert ref.tag is not None
    with reporter(json_mode) as rep:
        res = push(
            session,
            args.src,
            ref.name,
            ref.tag,
            reporter=rep,
            retries=args.retry,
            valid_for=validity(args.expires_days),
            declare=_declare(args.declare),
            reference=args.reference,
            witness=args.witness,
            strict=args.strict,
            allow_nonfinite=args.allow_nonfinite,
            sign=args.sign,
            tile_target=args.tile_size,
            tile_minimum=args.tile_min,
            kernels_required=_kernel_ids("--kernels-required", args.kernels_required),
            kernels_preferred=_kernel_ids("--kernels-preferred", args.kernels_preferred),
            layers=manifest_layers,
        )
    return res.to_json(), 0


_KERNEL_ID = re.compile(r"[a-z0-9][a-z0-9._-]*(@[A-Za-z0-9._-]+)?")


def _kernel_ids(option: str, text: str) -> list[str]:
    """Split ``ID[,ID...]``; each an id like ``cpu.int4pack`` or ``cpu.int4pack@1``."""
    ids = [part.strip() for part in text.split(",") if part.strip()]
    for kernel in ids:
        if not _KERNEL_ID.fullmatch(kernel):
            raise UsageError(
                f"{option} {kernel!r}: expected a kernel id (lowercase letters, digits, '.', '-', '_'; "
                "optionally @VERSION), e.g. cpu.int4pack or cpu.int4pack@1"
            )
    if len(set(ids)) != len(ids):
        raise UsageError(f"{option} {text!r}: a kernel id is named twice")
    return ids


def tag(session: Session, args: argparse.Namespace, json_mode: bool) -> tuple[Any, int]:
    """Run ``tag REF NAME:TAG``."""
    from shardport.registry import commands
    from shardport.registry.artifact.refs import parse_ref
    from shardport.registry.trust.tagging import validity

    ref, target = parse_ref(args.ref), parse_ref(args.target, require_tag=True)
    assert target.tag is not None
    return commands.tag(
        session,
        ref,
        target.name,
        target.tag,
        retries=args.retry,
        valid_for=validity(args.expires_days),
    ), 0


def rollback(session: Session, args: argparse.Namespace, json_mode: bool) -> tuple[Any, int]:
    """Run ``rollback NAME:TAG --to DIGEST | --steps N``."""
    from shardport.registry import commands
    from shardport.registry.artifact.refs import parse_ref

    return commands.rollback(
        session,
        parse_ref(args.ref, require_tag=True),
        to=args.to,
        steps=args.steps,
        reason=args.reason,
        retries=args.retry,
    ), 0


def convert(session: Session, args: argparse.Namespace, json_mode: bool) -> tuple[Any, int]:
    """Run ``convert REF NAME:TAG --layout tiled``."""
    from shardport.registry.artifact.refs import parse_ref
    from shardport.registry.convert import convert
    from shardport.registry.progress import reporter

    target = parse_ref(args.target, require_tag=True)
    assert target.tag is not None
    with reporter(json_mode) as rep:
        res = convert(
            session,
            parse_ref(args.ref),
            target.name,
            target.tag,
            layout=args.layout,
            reporter=rep,
            retries=args.retry,
            layers=manifest_layers,
        )
    return res.to_json(), 0
