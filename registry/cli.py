"""The ``registry`` command line.

Exit codes: 0 ok, 1 verification failure, 2 usage, 3 not found, 4 conflict. ``--json`` prints one
JSON document on stdout; errors then go to stdout as ``{"error": {...}}`` too.
Progress bars appear only on an interactive terminal without ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from shardport import ShardportError
from shardport.registry import commands
from shardport.registry.convert import convert
from shardport.registry.decoding import run_decode
from shardport.registry.errors import UsageError
from shardport.registry.housekeeping import fsck, gc
from shardport.registry.progress import reporter
from shardport.registry.pull import pull
from shardport.registry.push import push
from shardport.registry.refs import parse_ref
from shardport.registry.session import Session
from shardport.registry.verify import verify_checkpoint, verify_dir, verify_ref

EXIT_CODES = "exit codes: 0 ok, 1 verification failure, 2 usage, 3 not found, 4 conflict"


def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    s = argparse.SUPPRESS
    p.add_argument(
        "--store", default=s, help="store URL: a folder or s3://bucket/prefix (env SHARDPORT_STORE)"
    )
    p.add_argument("--s3-endpoint", default=s, help="S3 endpoint URL (default: AWS_ENDPOINT_URL)")
    p.add_argument("--json", action="store_true", default=s, help="machine-readable output")
    p.add_argument("--trust", default=s, type=Path, help="trust policy JSON or a PEM public key")
    p.add_argument("--key", default=s, type=Path, help="Ed25519 private key (PEM) to sign with")
    p.add_argument("--allow-unsigned", action="store_true", default=s, help="accept/produce unsigned content")
    return p


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used for ``--help``)."""
    common = _common()
    parser = argparse.ArgumentParser(
        prog="registry",
        parents=[common],
        epilog=EXIT_CODES,
        description="Signed, content-addressed registry for model checkpoints.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=help_, description=help_, epilog=EXIT_CODES)

    p = add("keygen", "make an Ed25519 key pair and trust it locally")
    p.add_argument("--name", default="default")
    p.add_argument("--scope", action="append", help="repository/tag glob the key may sign (default *)")
    p = add("push", "push a checkpoint folder as NAME:TAG; prints the manifest digest")
    p.add_argument("src", type=Path)
    p.add_argument("target")
    p.add_argument("--retry", type=int, default=0, help="retries when another writer moves the tag")
    p.add_argument("--expires-days", type=float, default=365.0, help="validity of the tag document")
    p.add_argument("--sign", choices=["ed25519", "sigstore"], default="ed25519")
    p.add_argument("--declare", help="contract declarations: a JSON object or a JSON file")
    p.add_argument("--reference", type=Path, help="the unquantized float checkpoint, to measure error")
    p.add_argument("--strict", action="store_true", help="inventory must match the architecture exactly")
    p.add_argument("--tile-size", type=int, default=1 << 20, help="target tile size in bytes (tile index)")
    p.add_argument("--tile-min", type=int, default=64 << 10, help="smallest tile in bytes (tile index)")
    p = add(
        "pull",
        "verify and download REF into DEST (atomically; DEST must be new, empty or an earlier pull "
        "unless --force); with --tp, only one rank's bytes",
    )
    p.add_argument("ref")
    p.add_argument("dest", type=Path)
    p.add_argument("--tp", type=int, help="tensor-parallel degree: pull only --rank's slices")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel degree")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree")
    p.add_argument("--rank", type=int, help="the rank to pull (0 .. tp*ep*pp-1; default 0)")
    p.add_argument(
        "--ranks",
        help="the ranks of one node, pulled with one shared read (each byte read once): A-B, A,B,... or all",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace DEST even if it holds files pull did not write (never /, your home or current "
        "folder or one containing it, the store, a link or a file)",
    )
    p.add_argument(
        "--policy",
        choices=["align", "refuse"],
        default="align",
        help="a split that would cut a quantization group: move it (align) or refuse",
    )
    p = add("tag", "point NAME:TAG at what REF resolves to")
    p.add_argument("ref")
    p.add_argument("target")
    p.add_argument("--retry", type=int, default=0)
    p.add_argument("--expires-days", type=float, default=365.0)
    p = add("rollback", "move NAME:TAG back to an earlier pinned manifest")
    p.add_argument("ref")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--to", help="manifest digest from the tag's history")
    g.add_argument("--steps", type=int, help="go back N versions")
    p.add_argument("--reason", default="")
    p.add_argument("--retry", type=int, default=0)
    p = add("log", "history of NAME:TAG")
    p.add_argument("ref")
    p = add("ls", "list repositories and tags")
    p.add_argument("name", nargs="?")
    p = add("inspect", "show the verified manifest of REF")
    p.add_argument("ref")
    p = add("verify", "verify REF (signatures, chain, every hash), a pulled DIR or a checkpoint PATH")
    p.add_argument("target")
    p.add_argument("--strict", action="store_true", help="inventory must match the architecture exactly")
    p = add("convert", "write REF as a new artifact NAME:TAG in another layout (tiled: contiguous tiles)")
    p.add_argument("ref")
    p.add_argument("target")
    p.add_argument("--layout", choices=["tiled"], default="tiled")
    p.add_argument("--retry", type=int, default=0)
    p = add("decode", "write the reference float32 decode of one weight as safetensors")
    p.add_argument("target", help="REF, a pulled folder, or a local checkpoint folder/file")
    p.add_argument("tensor", help="logical weight name, or one of its planes (e.g. a qweight)")
    p.add_argument("--out", type=Path, required=True)
    p = add("gc", "delete blobs no retained tag version, attachment or live upload references")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--grace-seconds", type=float, default=3600.0)
    add("fsck", "report corrupt blobs, dangling references and broken tags")
    return parser


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


def _session(args: argparse.Namespace) -> Session:
    return Session.open(
        getattr(args, "store", None),
        s3_endpoint=getattr(args, "s3_endpoint", None),
        trust=getattr(args, "trust", None),
        key=getattr(args, "key", None),
        allow_unsigned=getattr(args, "allow_unsigned", False),
    )


Extension = Callable[[Session, argparse.Namespace], dict[str, Any]]


def _dispatch(
    args: argparse.Namespace, json_mode: bool, extensions: Mapping[str, Extension] | None = None
) -> tuple[Any, int]:
    cmd = args.command
    if cmd == "keygen":
        return commands.keygen(args.name, tuple(args.scope or ["*"])), 0
    session = _session(args)
    if cmd == "push":
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
                valid_for=timedelta(days=args.expires_days),
                declare=_declare(args.declare),
                reference=args.reference,
                strict=args.strict,
                sign=args.sign,
                tile_target=args.tile_size,
                tile_minimum=args.tile_min,
            )
        return res.to_json(), 0
    if cmd == "pull" and args.tp is not None:
        if args.force:
            raise UsageError(
                "--force replaces DEST in a full pull; a per-rank pull (--tp) never deletes anything, "
                "it only adds or replaces its own rank files in DEST"
            )
        handler = (extensions or {}).get("pull_rank")
        if handler is None:
            raise UsageError("a per-rank pull (--tp) needs the loader: run the `registry` console script")
        return handler(session, args), 0
    if cmd == "pull":
        if args.rank is not None or args.ranks is not None:
            raise UsageError("--rank/--ranks select ranks of a topology: give --tp N (and --ep/--pp) too")
        with reporter(json_mode) as rep:
            return pull(session, parse_ref(args.ref), args.dest, reporter=rep, force=args.force).to_json(), 0
    if cmd == "tag":
        ref, target = parse_ref(args.ref), parse_ref(args.target, require_tag=True)
        assert target.tag is not None
        return commands.tag(
            session,
            ref,
            target.name,
            target.tag,
            retries=args.retry,
            valid_for=timedelta(days=args.expires_days),
        ), 0
    if cmd == "rollback":
        return commands.rollback(
            session,
            parse_ref(args.ref, require_tag=True),
            to=args.to,
            steps=args.steps,
            reason=args.reason,
            retries=args.retry,
        ), 0
    if cmd == "log":
        return commands.log(session, parse_ref(args.ref, require_tag=True)), 0
    if cmd == "ls":
        return commands.ls(session, args.name), 0
    if cmd == "inspect":
        return commands.inspect(session, parse_ref(args.ref)), 0
    if cmd == "verify":
        local = Path(args.target)
        if local.exists():
            if local.is_dir():
                report = verify_dir(session, local, strict=args.strict)
            else:
                report = verify_checkpoint(local, strict=args.strict)
        else:
            report = verify_ref(session, parse_ref(args.target))
        return report.to_json(), report.exit_code
    if cmd == "convert":
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
            )
        return res.to_json(), 0
    if cmd == "decode":
        return run_decode(session, args.target, args.tensor, args.out).to_json(), 0
    if cmd == "gc":
        return gc(session, dry_run=args.dry_run, grace=timedelta(seconds=args.grace_seconds)).to_json(), 0
    if cmd == "fsck":
        found = fsck(session)
        return found.to_json(), 0 if found.ok else 1
    raise UsageError(f"unknown command {cmd!r}")


def _human(cmd: str, result: Any) -> str:
    if cmd in ("push", "convert"):
        return (
            f"{result['digest']}\npushed {result['name']}:{result['tag']} version {result['version']}: "
            f"{result['files']} files, uploaded {result['uploaded_bytes']} bytes, "
            f"reused {result['reused_bytes']} bytes"
        )
    if cmd == "pull" and "node_ranks" in result:
        return (
            f"{result['digest']}\npulled ranks {result['node_ranks']} of {result['world_size']} "
            f"with one shared read: {result['bytes_assigned']} bytes assigned, {result['bytes_fetched']} "
            f"fetched (amplification per node {result['read_amplification']:.3f}, "
            f"{result['requests']} requests)"
        )
    if cmd == "pull" and "rank" in result:
        return (
            f"{result['digest']}\npulled rank {result['rank']} of {result['world_size']} "
            f"into {result['out']}: "
            f"{result['bytes_assigned']} bytes assigned, {result['bytes_fetched']} fetched "
            f"(amplification {result['read_amplification']:.3f}, {result['requests']} requests)"
        )
    if cmd == "pull":
        return (
            f"{result['digest']}\npulled {result['ref']} into {result['dest']}: "
            f"{result['files']} files, {result['bytes']} bytes"
        )
    if cmd == "log":
        lines = []
        for e in result:
            rb = (
                f"  ROLLBACK of v{e['rollback_of']['version']}: {e['rollback_of']['reason']}"
                if e["rollback_of"]
                else ""
            )
            who = e["signer_name"] or e["signer"] or "unsigned"
            lines.append(f"v{e['version']}  {e['issued_at']}  {e['target']}  signed by {who}{rb}")
        return "\n".join(lines)
    if cmd == "ls":
        lines = []
        for repo in result:
            lines.append(repo["name"])
            lines += [f"  {t['tag']}  v{t['version']}  {t['target']}" for t in repo["tags"]]
        return "\n".join(lines)
    if cmd in ("tag", "rollback"):
        return f"{result['digest']}\n{result['ref']} is now version {result['version']}"
    if cmd == "verify":
        head = f"{'OK' if result['ok'] else 'FAILED'}: {result['subject']} {result['digest'] or ''}".rstrip()
        body = [f"  {f['kind']}: {f['object']}: {f['message']}" for f in result["findings"]]
        checked = f"  {result['checked_files']} files, {result['checked_bytes']} bytes"
        return "\n".join([head, f"{checked}, {result['weights_checked']} weights checked", *body])
    if cmd == "decode":
        return f"wrote {result['tensor']} {result['shape']} float32 ({result['family']}) to {result['out']}"
    return json.dumps(result, indent=2, sort_keys=True)


def run(argv: Sequence[str] | None = None, extensions: Mapping[str, Extension] | None = None) -> int:
    """Run the CLI; return the exit code.

    ``extensions`` lets higher layers serve commands the registry cannot (it imports neither the
    loader nor deploy): ``pull_rank`` serves ``pull --tp``.
    """
    args = build_parser().parse_args(argv)
    json_mode = bool(getattr(args, "json", False))
    try:
        result, code = _dispatch(args, json_mode, extensions)
    except ShardportError as exc:
        if json_mode:
            print(
                json.dumps(
                    {"error": {"type": type(exc).__name__, "message": str(exc), "exit_code": exc.exit_code}}
                )
            )
        else:
            print(f"registry {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(result, sort_keys=True) if json_mode else _human(args.command, result))
    return code
