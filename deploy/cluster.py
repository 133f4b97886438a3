"""The Ray cluster a bring-up runs on: an existing one (``--address``) or an embedded one on loopback.

The embedded default starts a local Ray head on 127.0.0.1 and nowhere else: Ray's switch that keeps
it there (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read when ``ray`` is imported) is set before Ray is
imported (:func:`_ray`), the node address is passed explicitly, and the node address Ray ended up with is
checked after the start. Ray's token authentication stays on (:mod:`.cluster_auth`): the embedded head
gets a token of its own, in its private folder. Its files live in that private folder (:mod:`.scratch`,
mode 0700, removed at exit; a later bring-up removes the folders of drivers that were killed). Ray's own
log lines are kept off the terminal unless ``verbose``. Joining ``--address`` is bounded by a connect
deadline (:func:`probe`): an address where nothing (or something other than a gRPC server) answers
fails in seconds instead of being retried forever.

One placement group holds one bundle per rank: ``{"GPU": 1}`` per rank when the cluster has GPUs, a
share of a CPU otherwise (a 2-core machine cannot otherwise place four ranks; :func:`~.devices.bundle_spec`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardport.deploy import scratch
from shardport.deploy.cluster_auth import embedded_auth_env
from shardport.deploy.devices import bundle_spec
from shardport.deploy.errors import ClusterError
from shardport.placement.nodes import NodeView

LOOPBACK = "127.0.0.1"
#: Ray resolves "127.0.0.1" to the machine's external address unless this is set when ray is imported.
_LOOPBACK_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
CONNECT_TIMEOUT_S = 30.0
"""``--connect-timeout``: how long joining ``--address`` may take before the bring-up fails (exit 6)."""
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


@dataclass(frozen=True)
class Cluster:
    """Where the ranks run: whether Ray was started here, what the cluster offers, the private folder."""

    address: str | None
    started_here: bool
    gpus: int
    cpus: float
    folder: Path | None = None
    """The bring-up's private folder (0700): Ray's files for an embedded head, the rendezvous file."""

    def bundle(self, world: int) -> dict[str, float]:
        """One rank's resources: a whole GPU where there are enough, else a share of the CPUs."""
        return bundle_spec(self.gpus, self.cpus, world)


def _ray() -> Any:
    """Import Ray, its loopback switch set first (a Ray imported earlier is checked by :func:`_start`)."""
    if "ray" not in sys.modules:
        os.environ[_LOOPBACK_SWITCH] = "0"
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - ray is a dependency
        raise ClusterError(f"Ray is not installed ({exc}); install shardport with its dependencies") from exc
    return ray


def _loopback_only(ray: Any) -> None:
    """Refuse to start an embedded head when the imported Ray would rewrite 127.0.0.1 to the network."""
    from ray._private import ray_constants

    if getattr(ray_constants, "ENABLE_RAY_CLUSTER", False):
        raise ClusterError(
            "Ray was imported before shardport set its loopback switch, so an embedded head would listen "
            f"on the network: set {_LOOPBACK_SWITCH}=0 before importing ray, or pass --address"
        )


def probe(address: str, timeout: float) -> None:
    """Check that a gRPC server (a Ray GCS) answers at ``host:port`` within ``timeout`` seconds.

    A TCP connection, then the HTTP/2 preface, answered by a SETTINGS frame from any gRPC server (unless
    Ray's TLS is on, where only the connection is checked). Addresses that are not ``host:port`` (``auto``,
    ``ray://…``) are left to Ray.
    """
    host, sep, port_text = address.rpartition(":")
    if not sep or "://" in address or not port_text.isdigit():
        return
    host = host.strip("[]") or LOOPBACK
    try:
        with socket.create_connection((host, int(port_text)), timeout=timeout) as conn:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return
            conn.settimeout(timeout)
            conn.sendall(_HTTP2_PREFACE)
            head = b""
            while len(head) < 9:
                chunk = conn.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
    except OSError as exc:
        raise ClusterError(
            f"cannot join Ray at {address}: nothing answered within {timeout:g} s ({exc}); check the "
            "address (the head's GCS port, 6379 by default) or raise --connect-timeout"
        ) from exc
    if len(head) < 9 or head[3] != 0x04:
        raise ClusterError(
            f"cannot join Ray at {address}: it answers, but not as a Ray head (no gRPC SETTINGS frame; "
            f"first bytes {head[:9]!r}); check the address (the head's GCS port, 6379 by default)"
        )


def embedded_object_store() -> int:
    """The embedded head's object store: where a node's first rank hands the other ranks their slices.

    A tenth of the machine's memory, at least 128 MiB and at most 4 GiB (Ray maps it lazily: pages
    cost memory only while a handed-over slice is in flight); below what the ranks hand over at once,
    Ray spills to disk and the bring-up slows down, but stays correct.
    """
    try:
        import psutil

        total = int(psutil.virtual_memory().total)
    except ImportError:  # pragma: no cover - psutil is a dependency
        total = 0
    return max(128 * 2**20, min(4 * 2**30, total // 10))


def _reload_auth_settings() -> None:
    """Make this process's Ray read ``RAY_AUTH_*`` again (its C++ config read them at import).

    What Ray itself does when it turns token authentication on for a new local cluster.
    """
    with contextlib.suppress(ImportError, AttributeError):
        import importlib

        raylet: Any = importlib.import_module("ray._raylet")  # compiled: no attributes for mypy
        raylet.Config.initialize("")
        raylet.AuthenticationTokenLoader.instance().reset_cache()


@contextlib.contextmanager
def _environment(values: dict[str, str | None]) -> Iterator[None]:
    """Set (None: remove) variables for the block, restoring the caller's afterwards."""
    if not values:
        yield
        return
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _reload_auth_settings()
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _reload_auth_settings()


@contextlib.contextmanager
def _keep_sigterm() -> Iterator[None]:
    """Keep the caller's own SIGTERM handler across ``ray.init``, which replaces it with Ray's.

    Ray's handler (kill the head's processes, exit 1) stays where the caller had none; a caller with a
    handler of its own (the CLI: unwind, tear down, exit 143) keeps it.
    """
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main and callable(previous):
            signal.signal(signal.SIGTERM, previous)


def _start(ray: Any, address: str | None, world: int, folder: Path, timeout: float, verbose: bool) -> None:
    """``ray.init``: an embedded head in ``folder`` bound to loopback, or a join of ``address``."""
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": verbose,
        "logging_level": logging.INFO if verbose else logging.ERROR,
    }
    if address is None:
        _loopback_only(ray)
        kwargs.update(
            num_cpus=max(world, os.cpu_count() or 1),
            _node_ip_address=LOOPBACK,
            dashboard_host=LOOPBACK,
            object_store_memory=embedded_object_store(),
            _temp_dir=str(folder / "r"),  # Ray makes its folder 0777: the private one (0700) holds it
        )
    else:
        probe(address, timeout)
        kwargs["address"] = address
    try:
        with _keep_sigterm():
            ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = address or f"a local head on {LOOPBACK}"
        raise ClusterError(f"cannot start or join Ray at {where}: {exc}") from exc
    if address is None:
        bound = ray.util.get_node_ip_address()
        if bound != LOOPBACK:
            ray.shutdown()
            raise ClusterError(f"the embedded Ray head came up on {bound}, not {LOOPBACK}: stopped")


@contextlib.contextmanager
def connect(
    address: str | None,
    *,
    world: int,
    connect_timeout: float = CONNECT_TIMEOUT_S,
    verbose: bool = False,
) -> Iterator[Cluster]:
    """Join the Ray cluster at ``address``, or use/start a local one on 127.0.0.1; yield what it offers.

    A Ray already initialised in this process (a test session's, or a caller's) is used as it is and
    left running; a head started here is shut down on exit, and the private folder removed.
    """
    if address == "local":  # Ray's word for "start a new local cluster": the embedded head, made safe
        address = None
    scratch.sweep()
    ray = _ray()
    folder = scratch.make()
    started = False
    ray_logger = logging.getLogger("ray")
    level = ray_logger.level
    try:
        env: dict[str, str | None] = {}
        if not ray.is_initialized() and address is None:
            # RAY_ADDRESS would make ray.init join that cluster instead of starting the embedded head
            env = {**embedded_auth_env(folder), "RAY_ADDRESS": None}
        with _environment(env):
            if not ray.is_initialized():
                _start(ray, address, world, folder, connect_timeout, verbose)
                started = True
            try:
                resources = ray.cluster_resources()
                yield Cluster(
                    address=address,
                    started_here=started,
                    gpus=int(resources.get("GPU", 0)),
                    cpus=float(resources.get("CPU", 0)),
                    folder=folder,
                )
            finally:
                if started:
                    ray.shutdown()
    finally:
        ray_logger.setLevel(level)
        shutil.rmtree(folder, ignore_errors=True)


def driver_node() -> str:
    """The Ray node id of this driver (the ranks' nodes are compared with it: :mod:`.rendezvous`)."""
    ray = _ray()
    return str(ray.get_runtime_context().get_node_id())


def alive_nodes() -> list[NodeView]:
    """Ray's view of the cluster: each alive node's id, address, CPUs and GPUs (node placement's input)."""
    ray = _ray()
    views = []
    for node in ray.nodes():
        if not node.get("Alive", False):
            continue
        resources = node.get("Resources", {}) or {}
        views.append(
            NodeView(
                node_id=str(node["NodeID"]),
                address=str(node.get("NodeManagerAddress", "")),
                cpus=float(resources.get("CPU", 0.0)),
                gpus=float(resources.get("GPU", 0.0)),
            )
        )
    return views


def node_alive(node_id: str) -> bool:
    """Whether Ray still counts ``node_id`` among the alive nodes."""
    return any(v.node_id == node_id for v in alive_nodes())
