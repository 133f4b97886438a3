"""Human-readable output of each command's result (``--json`` prints the result itself)."""

from __future__ import annotations

import json
from typing import Any

from shardport.cli import bringup


def _published(result: Any) -> str:
    return (
        f"{result['digest']}\npushed {result['name']}:{result['tag']} version {result['version']}: "
        f"{result['files']} files, uploaded {result['uploaded_bytes']} bytes, "
        f"reused {result['reused_bytes']} bytes"
    ) + "".join(f"\n  note: {n}" for n in result.get("notes", []))


def _pulled(result: Any) -> str:
    if "node_ranks" in result:
        return (
            f"{result['digest']}\npulled ranks {result['node_ranks']} of {result['world_size']} "
            f"with one shared read: {result['bytes_assigned']} bytes assigned, {result['bytes_fetched']} "
            f"fetched (amplification per node {result['read_amplification']:.3f}, "
            f"{result['requests']} requests)"
        )
    if "rank" in result:
        return (
            f"{result['digest']}\npulled rank {result['rank']} of {result['world_size']} "
            f"into {result['out']}: "
            f"{result['bytes_assigned']} bytes assigned, {result['bytes_fetched']} fetched "
            f"(amplification {result['read_amplification']:.3f}, {result['requests']} requests)"
        )
    return (
        f"{result['digest']}\npulled {result['ref']} into {result['dest']}: "
        f"{result['files']} files, {result['bytes']} bytes"
    )


def _log(result: Any) -> str:
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


def _ls(result: Any) -> str:
    lines = []
    for repo in result:
        lines.append(repo["name"])
        lines += [f"  {t['tag']}  v{t['version']}  {t['target']}" for t in repo["tags"]]
    return "\n".join(lines)


def _moved(result: Any) -> str:
    return f"{result['digest']}\n{result['ref']} is now version {result['version']}"


def _verified(result: Any) -> str:
    head = f"{'OK' if result['ok'] else 'FAILED'}: {result['subject']} {result['digest'] or ''}".rstrip()
    body = [f"  {f['kind']}: {f['object']}: {f['message']}" for f in result["findings"]]
    checked = f"  {result['checked_files']} files, {result['checked_bytes']} bytes"
    return "\n".join([head, f"{checked}, {result['weights_checked']} weights checked", *body])


def _evidence(result: Any) -> str:
    if "predicate" in result:  # --show: the statement itself
        return json.dumps(result, indent=2, sort_keys=True)
    head = f"{result['manifest']}: {len(result['evidence'])} verified evidence statement(s)"
    if result["evidence"]:
        newest = "passed" if result["newest"]["passed"] else "failed"
        head += f" ({result['passed']} passed, {result['failed']} failed; newest {newest})"
    lines = [head]
    for e in result["evidence"]:  # oldest first, as created
        signers = ", ".join(e["signers"])
        mark = "passed" if e["passed"] is True else "failed"
        lines.append(f"  {mark:6}  {e['digest']}  {e['created'] or '-'}  {e['topology'] or ''}  by {signers}")
        lines += [f"          same statement: {d}" for d in e.get("duplicates", [])]
    lines += [f"  FAILED {f['digest']}: {f['type']}: {f['message']}" for f in result["failures"]]
    return "\n".join(lines)


def _decoded(result: Any) -> str:
    return f"wrote {result['tensor']} {result['shape']} float32 ({result['family']}) to {result['out']}"


_RENDER = {
    "push": _published,
    "convert": _published,
    "pull": _pulled,
    "log": _log,
    "ls": _ls,
    "tag": _moved,
    "rollback": _moved,
    "verify": _verified,
    "decode": _decoded,
    "evidence": _evidence,
    "up": bringup.render,
}


def human(command: str, result: Any) -> str:
    """``result`` of ``command`` as text; a command without its own form prints indented JSON."""
    render = _RENDER.get(command)
    return render(result) if render is not None else json.dumps(result, indent=2, sort_keys=True)
