"""The ``registry`` command line.

Exit codes (:data:`shardport.EXIT_CODES`; each means one thing): 0 ok, 1 verification failed, 2 usage,
3 not found, 4 conflict (retry), 5 refused input (a container or contract gate), 6 unavailable,
70 internal error. ``--json`` prints one JSON document on stdout; errors then go to stdout as
``{"error": {...}}`` too. Progress bars appear only on an interactive terminal without ``--json``.

Start-up: building the parser imports nothing beyond the standard library and the error classes;
each command imports its own modules when it runs (``--help`` and ``log`` need no numpy or gguf).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from shardport import EXIT_CODES as _EXIT_TABLE
from shardport import ShardportError
from shardport.registry.errors import InternalError, UsageError

if TYPE_CHECKING:
    from shardport.registry.session import Session

EXIT_CODES = "exit codes: " + ", ".join(
    f"{code} {meaning.split(':')[0]}" for code, meaning in sorted(_EXIT_TABLE.items())
)


class _ParseError(UsageError):  # type: ignore[misc, unused-ignore]
    """argparse refused the command line; ``parser`` is the (sub)parser whose usage applies."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(f"{parser.prog}: {message}")
        self.parser = parser
        self.reason = message


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are raised (so that ``--json`` can report them as JSON)."""

    def error(self, message: str) -> NoReturn:
        """Raise instead of printing and exiting; :func:`run` reports it."""
        raise _ParseError(self, message)


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
    parser: argparse.ArgumentParser = _Parser(
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
    p.add_argument(
        "--witness", type=Path, help="the producer's rows of its weights (safetensors; README: Witnesses)"
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="refuse instead of noting: the inventory must match the architecture exactly, and a check of "
        "a field no loader reads (README: checks noted, not refused) refuses with its error",
    )
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
    p.add_argument(
        "--strict", action="store_true", help="for a checkpoint PATH: refuse what push only notes (see push)"
    )
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
    from shardport.registry.session import Session

    return Session.open(
        getattr(args, "store", None),
        s3_endpoint=getattr(args, "s3_endpoint", None),
        trust=getattr(args, "trust", None),
        key=getattr(args, "key", None),
        allow_unsigned=getattr(args, "allow_unsigned", False),
    )


_MAX_GRACE_S = 100 * 365 * 86400.0
Extension = Callable[["Session", argparse.Namespace], dict[str, Any]]


def _dispatch(
    args: argparse.Namespace, json_mode: bool, extensions: Mapping[str, Extension] | None = None
) -> tuple[Any, int]:
    cmd = args.command
    from shardport.registry import commands  # each command imports what it needs, when it runs
    from shardport.registry.refs import parse_ref

    if cmd == "keygen":
        return commands.keygen(args.name, tuple(args.scope or ["*"])), 0
    session = _session(args)
    if cmd == "push":
        from shardport.registry.progress import reporter
        from shardport.registry.push import push
        from shardport.registry.tagging import validity

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
        from shardport.registry.progress import reporter
        from shardport.registry.pull import pull

        with reporter(json_mode) as rep:
            return pull(session, parse_ref(args.ref), args.dest, reporter=rep, force=args.force).to_json(), 0
    if cmd == "tag":
        from shardport.registry.tagging import validity

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
        from shardport.registry.verify import verify_checkpoint, verify_dir, verify_ref

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
            )
        return res.to_json(), 0
    if cmd == "decode":
        from shardport.registry.decoding import run_decode

        return run_decode(session, args.target, args.tensor, args.out).to_json(), 0
    if cmd == "gc":
        from shardport.registry.housekeeping import gc

        if not 0 <= args.grace_seconds <= _MAX_GRACE_S:  # also refuses nan
            raise UsageError(
                f"--grace-seconds {args.grace_seconds}: expected 0 .. {_MAX_GRACE_S:.0f} "
                "(a negative grace would delete the blobs of pushes in flight)"
            )
        return gc(session, dry_run=args.dry_run, grace=timedelta(seconds=args.grace_seconds)).to_json(), 0
    if cmd == "fsck":
        from shardport.registry.housekeeping import fsck

        found = fsck(session)
        return found.to_json(), 0 if found.ok else 1
    raise UsageError(f"unknown command {cmd!r}")


def _human(cmd: str, result: Any) -> str:
    if cmd in ("push", "convert"):
        return (
            f"{result['digest']}\npushed {result['name']}:{result['tag']} version {result['version']}: "
            f"{result['files']} files, uploaded {result['uploaded_bytes']} bytes, "
            f"reused {result['reused_bytes']} bytes"
        ) + "".join(f"\n  note: {n}" for n in result.get("notes", []))
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


def _traceback_file(exc: BaseException, argv: Sequence[str]) -> Path | None:
    """Write ``exc``'s traceback to ``$SHARDPORT_HOME/logs/`` (else the temp folder); return its path."""
    import os
    import tempfile
    import time
    import traceback
    import uuid

    from shardport import __version__
    from shardport.registry.home import home

    text = f"shardport {__version__}, python {sys.version.split()[0]}, registry {' '.join(argv)}\n" + "".join(
        traceback.format_exception(exc)
    )
    name = f"internal-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}.txt"
    for folder in (home() / "logs", Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(text)
            return path
        except OSError:
            continue
    return None


def _internal(exc: Exception, argv: Sequence[str]) -> InternalError:
    """The last line of defence: an exception nobody anticipated, as an :class:`InternalError`."""
    path = _traceback_file(exc, argv)
    where = f"the traceback is in {path}" if path else "the traceback could not be written (see stderr)"
    if path is None:
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    error = InternalError(
        f"unexpected {type(exc).__name__}: {exc} — this is a bug in shardport, not in your input; "
        f"{where}; please attach it to a bug report"
    )
    error.traceback_file = str(path) if path else None
    return error


def _report(command: str, exc: ShardportError, json_mode: bool) -> int:
    """Print ``exc`` (one JSON document under ``--json``) and return its exit code."""
    if json_mode:
        body: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc), "exit_code": exc.exit_code}
        traceback_file = getattr(exc, "traceback_file", None)
        if traceback_file:
            body["traceback_file"] = traceback_file
        print(json.dumps({"error": body}))
    else:
        print(f"registry {command}: error: {exc}", file=sys.stderr)
    return exc.exit_code


def run(argv: Sequence[str] | None = None, extensions: Mapping[str, Extension] | None = None) -> int:
    """Run the CLI; return the exit code.

    ``extensions`` lets higher layers serve commands the registry cannot (it imports neither the
    loader nor deploy): ``pull_rank`` serves ``pull --tp``. Every failure is reported as one typed
    error: a :class:`ShardportError` with its own exit code, and any other exception (a bug) as an
    :class:`~shardport.registry.errors.InternalError` (exit 70) whose traceback goes to a file.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except _ParseError as exc:
        if "--json" in argv:
            return _report(exc.parser.prog, UsageError(str(exc)), True)
        exc.parser.print_usage(sys.stderr)
        print(f"{exc.parser.prog}: error: {exc.reason}", file=sys.stderr)
        return exc.exit_code
    json_mode = bool(getattr(args, "json", False))
    try:
        result, code = _dispatch(args, json_mode, extensions)
        text = json.dumps(result, sort_keys=True) if json_mode else _human(args.command, result)
    except ShardportError as exc:
        return _report(args.command, exc, json_mode)
    except Exception as exc:  # the last line of defence; KeyboardInterrupt and SystemExit pass
        return _report(args.command, _internal(exc, argv), json_mode)
    try:
        print(text, flush=True)
    except BrokenPipeError:  # the reader went away (`registry ls | head -1`): not a failure of ours
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at interpreter exit
    return code
