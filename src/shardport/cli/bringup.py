"""``registry up``: bring a pinned model up on Ray ranks, prove parity, store signed evidence.

The parser entry (:func:`add_parser`), the command (:func:`up`) and its human rendering
(:func:`render`). Deploy, Ray and torch are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardport.deploy.up import UpRequest
    from shardport.registry.session import Session


def _tokens(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids, found {text!r}") from exc
    if not out or any(t < 0 for t in out):
        raise argparse.ArgumentTypeError(f"expected one or more token ids >= 0, found {text!r}")
    return out


MAX_SECONDS = 7 * 24 * 3600.0
"""The longest ``--connect-timeout``/``--stage-timeout`` taken."""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, found {text!r}") from exc
    if not 0 < value <= MAX_SECONDS:  # the socket and Ray's waits take milliseconds in a C int
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds above 0 and at most {MAX_SECONDS:g} (7 days), found {text!r}"
        )
    return value


def add_parser(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """``registry up REF [--tp N] [--ep E] [--pp P] [--address ADDR] [--fallback …] …``."""
    p = add(
        "up",
        "bring REF up on Ray ranks (tp x ep x pp), run it, prove parity and store signed evidence",
    )
    p.add_argument("ref", help="NAME:TAG (resolved once to a digest) or NAME@sha256:…")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel degree")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages")
    p.add_argument(
        "--address", help="join the Ray cluster at ADDR (default: an embedded one on 127.0.0.1 only)"
    )
    p.add_argument(
        "--fallback",
        choices=["forbid", "warn", "allow"],
        default="warn",
        help="kernel fallbacks: forbid refuses generic kernels, full dequantization and conversions (a "
        "layout that changes a stored number, e.g. scales cast to bfloat16); warn (default) warns on "
        "generic kernels, forbids full dequantization, allows conversions; allow lets all three through "
        "(recorded in the evidence)",
    )
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--tokens", type=_tokens, help="the prompt as token ids: 1,2,3")
    g.add_argument(
        "--prompt", help="the prompt as text, encoded with the checkpoint's tokenizer (verified at push)"
    )
    p.add_argument("--generate", type=int, default=4, metavar="K", help="greedy tokens to decode")
    p.add_argument(
        "--ladder",
        choices=["full", "sample", "off"],
        default="sample",
        help="parity L0-L3 on the ranks: full (every level on every weight); sample (default: L0, L1 and "
        "the witness rows on every weight, L2 reconstruction and L3 on one weight per kernel class); off "
        "(none; the evidence says so)",
    )
    p.add_argument(
        "--activations",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="dtype of the quantized operators' activations: float32 (parity first), bfloat16 (the CPU "
        "int4pack fast path; L4's tolerance follows the dtype) or auto (default: float32 on CPU ranks, "
        "bfloat16 on CUDA ranks, whose int4 kernel takes nothing else); an operator whose kernel does "
        "not take it runs float32 and its dispatch trace says so; norms, rotary, softmax and the KV cache "
        "stay float32",
    )
    p.add_argument(
        "--logits-out",
        type=Path,
        help="write float32 prompt logits [T, vocab] (safetensors) to a new file or over a regular file "
        "(never a link, device, pipe or folder, nor inside the store or SHARDPORT_HOME; checked before "
        "anything starts, written atomically)",
    )
    p.add_argument("--report", type=Path, help="write the HTML evidence report (same rules as --logits-out)")
    p.add_argument("--no-evidence", action="store_true", help="do not store the signed evidence")
    p.add_argument(
        "--retries",
        type=int,
        default=0,
        metavar="N",
        help="relaunch the whole bring-up up to N times when a rank is lost (its actor died, its node "
        "went away); a rank's validation, admission or I/O failure is never retried (default 0)",
    )
    p.add_argument(
        "--stage-timeout",
        type=_seconds,
        metavar="S",
        help="declare a rank lost when it has not answered a stage (prepare, run) within S seconds "
        "(default: 120 s plus time for the model's size)",
    )
    p.add_argument(
        "--connect-timeout",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="fail when the Ray cluster at --address does not answer within S seconds (default 30)",
    )
    p.add_argument("--verbose", action="store_true", help="show Ray's own log lines on stderr")


AUTH_NOTE = (
    "registry up: note (shown once): the embedded Ray cluster keeps token authentication on, since "
    "listening on 127.0.0.1 alone does not keep other users of this machine out; each bring-up's token "
    "is in its private folder (/tmp/sp-ray-*/auth_token, mode 0600) and is removed with it"
)


def _note_token_once() -> None:
    """Say once per ``SHARDPORT_HOME`` where the embedded cluster's token lives and why auth stays on."""
    from shardport.registry.home import home

    marker = home() / "notes" / "ray-token"
    if marker.exists():
        return
    print(AUTH_NOTE, file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()


def destinations(session: Session, args: argparse.Namespace) -> tuple[Path | None, Path | None]:
    """``--logits-out`` and ``--report``, checked before anything starts.

    :func:`~shardport.registry.output.destination.file_destination`: a bring-up never runs for minutes to fail
    at writing its result.
    """
    from shardport.registry.errors import UsageError
    from shardport.registry.output.destination import file_destination

    root = session.store.local_root
    out = [
        None if given is None else file_destination(given, store_root=root, flag=flag)
        for flag, given in (("--logits-out", args.logits_out), ("--report", args.report))
    ]
    if out[0] is not None and out[0] == out[1]:
        raise UsageError(f"--logits-out and --report are both {args.report}: name two files")
    return out[0], out[1]


def request_of(session: Session, args: argparse.Namespace) -> UpRequest:
    """The :class:`~shardport.deploy.up.UpRequest` the parsed arguments ask for.

    With the session's global options that the ranks need too: store, S3 endpoint, ``--trust``,
    ``--allow-unsigned``.
    """
    from shardport.deploy.up import UpRequest

    trust = getattr(args, "trust", None)
    return UpRequest(
        ref=args.ref,
        tokens=args.tokens or (),
        prompt=args.prompt,
        steps=args.generate,
        tp=args.tp,
        ep=args.ep,
        pp=args.pp,
        fallback=args.fallback,
        store=session.store.url,
        s3_endpoint=getattr(args, "s3_endpoint", None),
        address=args.address,
        retries=args.retries,
        ladder=getattr(args, "ladder", "sample"),
        activations=getattr(args, "activations", "auto"),
        trust=None if trust is None else str(Path(trust).absolute()),
        allow_unsigned=bool(getattr(args, "allow_unsigned", False)),
        stage_timeout=getattr(args, "stage_timeout", None),
        connect_timeout=getattr(args, "connect_timeout", 30.0),
        verbose=getattr(args, "verbose", False),
    )


def _bring_up_quietly(session: Session, request: UpRequest, args: argparse.Namespace, progress: Any) -> Any:
    """``bring_up``, with Ray's prints kept off stdout (the result's, under ``--json``)."""
    from shardport.deploy.up import bring_up

    # Ray's driver thread prints a dead worker's notice on stdout: shown on stderr with --verbose,
    # dropped otherwise (our own error names the lost rank either way)
    with contextlib.ExitStack() as quiet:
        sink = sys.stderr if request.verbose else quiet.enter_context(open(os.devnull, "w"))
        quiet.enter_context(contextlib.redirect_stdout(sink))
        return bring_up(session, request, store_evidence=not args.no_evidence, progress=progress)


def up(session: Session, args: argparse.Namespace, json_mode: bool) -> tuple[Any, int]:
    """Run ``registry up``; exit 1 when the bring-up ran but parity (L0-L5) did not hold."""
    from shardport.cli.failures import interrupted, stopped_by
    from shardport.deploy.report import write_report
    from shardport.deploy.up import write_logits
    from shardport.registry.output.staging import stop_on_signals

    logits_out, report = destinations(session, args)
    request = request_of(session, args)
    if request.address is None and os.environ.get("SHARDPORT_RAY_AUTH", "token") != "disabled":
        _note_token_once()
    progress = None
    if not json_mode and sys.stderr.isatty():

        def progress(rank: int, what: str) -> None:
            print(f"rank {rank}: {what}", file=sys.stderr, flush=True)

    # SIGTERM/SIGHUP unwind the bring-up (ranks, placement group, head and private folder torn down),
    # then end the process by that signal; so does Ctrl-C. One line says so.
    with stop_on_signals():
        try:
            result = _bring_up_quietly(session, request, args, progress)
        except BaseException as exc:
            signum = stopped_by(exc)  # also when Ray's C extension returned it wrapped
            if signum is None:
                raise
            interrupted("up", signum, json_mode)
            if signum == signal.SIGINT:  # Python's own handler: end by the signal, no traceback
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.raise_signal(signal.SIGINT)
            raise  # stop_on_signals raises the signal again once the block has ended
    if logits_out is not None:
        write_logits(logits_out, result.prompt_logits)
    if report is not None:  # the L3 chart reads the per-operator ladder values the evidence names by digest
        from shardport.deploy.up_content import ladder_values

        write_report({**result.predicate, "ladders": ladder_values(result.reports)}, report)
    doc = result.to_json()
    if "text" in result.predicate:
        doc["text"] = result.predicate["text"]
    doc["logits_out"] = None if args.logits_out is None else str(args.logits_out)
    doc["report"] = None if args.report is None else str(args.report)
    return doc, 0 if result.predicate["passed"] else 1


def render(result: Any) -> str:
    """The human form: what ran, the parity ladder, time to first token per rank."""
    lines = [
        f"{'OK' if result['passed'] else 'FAILED'}: {result['repository']}@{result['digest']} "
        f"tp={result['topology']['tp']} ep={result['topology']['ep']} pp={result['topology']['pp']}"
        + (f" activations={result['runtime']['activations']}" if result.get("runtime") else ""),
    ]
    if result.get("tag"):
        lines.append(f"  tag {result['tag']['name']} version {result['tag']['version']}")
    lines.append(f"  generated {result['generated']}")
    for row in result["parity"]:
        mark = row.get("status") or (
            "not run" if row["passed"] is None else "pass" if row["passed"] else "fail"
        )
        tail = (
            f"{row['value']} (tolerance {row['tolerance']})"
            if row["passed"] is not None
            else row.get("detail", "")
        )
        lines.append(f"  {row['level']} {'FAIL' if mark == 'fail' else mark}  {row['name']}: {tail}")
    for rank, stages in sorted(result["timeline"].items(), key=lambda kv: int(kv[0])):
        total = sum(stages.values())
        parts = ", ".join(f"{k} {v:.2f}" for k, v in stages.items())
        lines.append(f"  rank {rank}: first token after {total:.2f} s ({parts})")
    for a in result.get("attempts", []):
        if a["outcome"] == "lost":
            where = f"rank {a['rank']} lost during {a['stage']} after {a['seconds']:.1f} s"
            lines.append(f"  attempt {a['attempt']}: {where} (relaunched)")
    if result.get("evidence"):
        lines.append(f"  evidence {result['evidence']}")
    for key in ("logits_out", "report"):
        if result.get(key):
            lines.append(f"  wrote {result[key]}")
    lines.append(verdict_line(result))
    return "\n".join(lines)


def verdict_line(result: Any) -> str:
    """The one line a person acts on, last: the verdict, the failed rows, the evidence and the report."""
    rows = result["parity"]
    failed = [f"{r['level']} {r['name']}" for r in rows if r["passed"] is False]
    measured = sum(1 for r in rows if r["passed"] is not None)
    if result["passed"]:
        verdict = f"PASSED: {measured} of {len(rows)} parity rows measured and within tolerance"
    else:
        verdict = "FAILED: " + ("; ".join(failed) if failed else "the bring-up did not pass")
    where = []
    if result.get("evidence"):
        ref = f"{result['repository']}@{result['digest']}"
        shown = f"registry evidence {ref} --show {result['evidence']}"
        where.append(f"signed evidence {result['evidence']} ({shown})")
    else:
        where.append("no evidence stored")
    if result.get("report"):
        where.append(f"report {result['report']}")
    return f"{verdict} — " + ", ".join(where)
