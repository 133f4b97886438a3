"""The ``registry`` command line, the top of the import graph.

Exit codes (:data:`shardport.EXIT_CODES`; each means one thing): 0 ok, 1 verification failed, 2 usage,
3 not found, 4 conflict (retry), 5 refused input (a container or contract gate), 6 unavailable,
70 internal error. ``--json`` prints one strict JSON document on stdout (a non-finite number as
the text ``"NaN"`` or ``"Infinity"``); errors then go to stdout as ``{"error": {...}}`` too.
Progress bars appear only on an interactive terminal without ``--json``.

Modules: :mod:`~shardport.cli.parser` (the arguments), :mod:`~shardport.cli.dispatch` (which function
runs a command), one module per command group (:mod:`~shardport.cli.keys`,
:mod:`~shardport.cli.publish`, :mod:`~shardport.cli.fetch`, :mod:`~shardport.cli.show`,
:mod:`~shardport.cli.housekeeping`), :mod:`~shardport.cli.render` (human output) and
:mod:`~shardport.cli.failures` (error reports, the last line of defence). Nothing below imports this
package; it may import every layer.

Start-up: building the parser imports nothing beyond the standard library and the error classes;
each command imports its own modules when it runs (``--help`` and ``log`` need no numpy or gguf, the
registry commands no torch or Ray; ``pull --tp`` imports the loader).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from shardport import ShardportError
from shardport.cli.parser import EXIT_CODES, ParseError, build_parser
from shardport.registry.errors import UsageError

__all__ = ["EXIT_CODES", "build_parser", "main", "run"]


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit code.

    Every failure is reported as one typed error: a :class:`ShardportError` with its own exit code, and
    any other exception (a bug) as an :class:`~shardport.registry.errors.InternalError` (exit 70) whose
    traceback goes to a file.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)  # --help exits here, before any command module loads
    except ParseError as exc:
        if "--json" in argv:
            from shardport.cli.failures import report

            return report(exc.parser.prog, UsageError(str(exc)), True)
        exc.parser.print_usage(sys.stderr)
        print(f"{exc.parser.prog}: error: {exc.reason}", file=sys.stderr)
        return exc.exit_code
    from shardport.cli.dispatch import dispatch
    from shardport.cli.failures import internal, report
    from shardport.cli.render import human

    json_mode = bool(getattr(args, "json", False))
    try:
        result, code = dispatch(args, json_mode)
        text = _strict_json(result) if json_mode else human(args.command, result)
    except ShardportError as exc:
        return report(args.command, exc, json_mode)
    except Exception as exc:  # the last line of defence; KeyboardInterrupt and SystemExit pass
        return report(args.command, internal(exc, argv), json_mode)
    try:
        print(text, flush=True)
    except BrokenPipeError:  # the reader went away (`registry ls | head -1`): not a failure of ours
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at interpreter exit
    return code


def _strict_json(result: object) -> str:
    """``--json``: strict JSON; a non-finite number as text (``"NaN"``), as the evidence records it."""
    from shardport.provenance.canonical import finite_text

    return json.dumps(finite_text(result), sort_keys=True, allow_nan=False)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``registry`` (the console script)."""
    return run(argv)
