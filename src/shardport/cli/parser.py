"""The ``registry`` argument parser: every command and option, and nothing else.

Building it imports nothing beyond the standard library and the error classes (``registry --help``
must start fast); its errors are raised as :class:`ParseError` so that ``--json`` can report them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from shardport import EXIT_CODES as _EXIT_TABLE
from shardport.cli import bringup
from shardport.registry.errors import UsageError

EXIT_CODES = "exit codes: " + ", ".join(
    f"{code} {meaning.split(':')[0]}" for code, meaning in sorted(_EXIT_TABLE.items())
)

_Add = Callable[[str, str], argparse.ArgumentParser]


class ParseError(UsageError):  # type: ignore[misc, unused-ignore]
    """argparse refused the command line; ``parser`` is the (sub)parser whose usage applies."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(f"{parser.prog}: {message}")
        self.parser = parser
        self.reason = message


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are raised (so that ``--json`` can report them as JSON)."""

    def error(self, message: str) -> NoReturn:
        """Raise instead of printing and exiting; :func:`shardport.cli.run` reports it."""
        raise ParseError(self, message)


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


def _keygen(add: _Add) -> None:
    p = add("keygen", "make an Ed25519 key pair and trust it locally")
    p.add_argument("--name", default="default")
    p.add_argument("--scope", action="append", help="repository/tag glob the key may sign (default *)")


def _push(add: _Add) -> None:
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
    p.add_argument(
        "--allow-nonfinite",
        action="store_true",
        help="record a float tensor holding NaN or inf (a norm, an embedding) as a manifest note instead "
        "of refusing it (exit 5); a quantized weight's float scales and zeros are refused regardless",
    )
    p.add_argument("--tile-size", type=int, default=1 << 20, help="target tile size in bytes (tile index)")
    p.add_argument("--tile-min", type=int, default=64 << 10, help="smallest tile in bytes (tile index)")
    p.add_argument(
        "--kernels-required",
        default="",
        help="kernel ids bring-up may select, comma-separated (ID or ID@VERSION; recorded in runtime)",
    )
    p.add_argument(
        "--kernels-preferred",
        default="",
        help="kernel ids bring-up tries first, comma-separated (recorded in runtime)",
    )


def _pull(add: _Add) -> None:
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


def _tags(add: _Add) -> None:
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


def _reads(add: _Add) -> None:
    p = add("log", "history of NAME:TAG")
    p.add_argument("ref")
    p = add("ls", "list repositories and tags")
    p.add_argument("name", nargs="?")
    p = add("inspect", "show the verified manifest of REF")
    p.add_argument("ref")
    p = add("evidence", "list the verified bring-up evidence attached to REF, or show one statement")
    p.add_argument("ref")
    p.add_argument("--show", metavar="DIGEST", help="print one evidence statement (a unique digest prefix)")
    p = add("verify", "verify REF (signatures, chain, every hash), a pulled DIR or a checkpoint PATH")
    p.add_argument("target")
    p.add_argument(
        "--strict", action="store_true", help="for a checkpoint PATH: refuse what push only notes (see push)"
    )
    p.add_argument(
        "--allow-nonfinite",
        action="store_true",
        help="for a checkpoint PATH: note, not fail, a float tensor holding NaN or inf (as push)",
    )


def _transforms(add: _Add) -> None:
    p = add("convert", "write REF as a new artifact NAME:TAG in another layout (tiled: contiguous tiles)")
    p.add_argument("ref")
    p.add_argument("target")
    p.add_argument("--layout", choices=["tiled"], default="tiled")
    p.add_argument("--retry", type=int, default=0)
    p = add("decode", "write the reference float32 decode of one weight as safetensors")
    p.add_argument("target", help="REF, a pulled folder, or a local checkpoint folder/file")
    p.add_argument("tensor", help="logical weight name, or one of its planes (e.g. a qweight)")
    p.add_argument("--out", type=Path, required=True)


def _housekeeping(add: _Add) -> None:
    p = add("gc", "delete blobs no retained tag version, attachment or live upload references")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--grace-seconds", type=float, default=3600.0)
    add("fsck", "report corrupt blobs, dangling references and broken tags")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used for ``--help``); commands appear in this order in the help."""
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

    for group in (_keygen, _push, _pull, _tags, _reads, _transforms, _housekeeping, bringup.add_parser):
        group(add)
    return parser
