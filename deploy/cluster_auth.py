"""Token authentication of the embedded Ray head: on, with a token of its own, unless the user opts out.

Ray 2.60 protects a cluster's gRPC services with a token. Loopback alone does not keep other local users
out, so the embedded head keeps it on: a 256-bit token made once per driver process is written to
``auth_token`` (0600) in the bring-up's private folder (0700) and handed to Ray's processes with
``RAY_AUTH_TOKEN_PATH``; it is removed with the folder when the bring-up ends. Nothing is written under
``~/.ray`` (where Ray would write its own token, world-readable).

``RAY_AUTH_MODE=disabled`` in the environment is refused for the embedded head (Ray would run it open to
anything that reaches its ports) unless ``SHARDPORT_RAY_AUTH=disabled`` says so explicitly (tests and
benchmarks that want Ray's default files untouched).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from .errors import ClusterSettingsError

OPT_OUT = "SHARDPORT_RAY_AUTH"
TOKEN_FILE = "auth_token"  # noqa: S105 - a file name
_TOKEN: list[str] = []


def _token() -> str:
    """The token of this process (one per process: Ray's token loader caches the first it reads)."""
    if not _TOKEN:
        _TOKEN.append(secrets.token_hex(32))
    return _TOKEN[0]


def auth_mode(environ: dict[str, str]) -> str:
    """``token`` or ``disabled`` for the embedded head, from ``SHARDPORT_RAY_AUTH`` and ``RAY_AUTH_MODE``."""
    ours = environ.get(OPT_OUT, "token").strip().lower()
    if ours not in ("token", "disabled"):
        raise ClusterSettingsError(
            f"{OPT_OUT}={environ[OPT_OUT]!r}: expected token (the default) or disabled"
        )
    if ours == "disabled":
        return "disabled"
    ray_mode = environ.get("RAY_AUTH_MODE", "token").strip().lower()
    if ray_mode != "token":
        raise ClusterSettingsError(
            f"RAY_AUTH_MODE={environ['RAY_AUTH_MODE']!r}: the embedded Ray head keeps token authentication "
            f"on (without it, anything that reaches its ports can run code as you); unset RAY_AUTH_MODE, or "
            f"set {OPT_OUT}=disabled to start it without authentication anyway"
        )
    return "token"


def embedded_auth_env(folder: Path) -> dict[str, str | None]:
    """The variables for the embedded head's start: the token file written (0600) when auth is on."""
    if auth_mode(dict(os.environ)) == "disabled":
        return {"RAY_AUTH_MODE": "disabled"}
    path = folder / TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(_token())
    # RAY_AUTH_TOKEN would take precedence over the file: it is the user's, for another cluster
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path), "RAY_AUTH_TOKEN": None}
