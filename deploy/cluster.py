"""The Ray cluster a bring-up runs on: an existing one (``--address``) or an embedded one on loopback.

The embedded default starts a local Ray head bound to 127.0.0.1 only (an unauthenticated Ray head on a
network interface is a known way in) and keeps Ray's token authentication as Ray configures it. Ray
is imported only here and only when a bring-up runs. One placement group holds one bundle per rank:
``{"GPU": 1}`` per rank when the cluster has GPUs, a share of a CPU otherwise (a 2-core machine cannot
otherwise place four ranks; :func:`~.devices.bundle_spec`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from shardport.deploy.devices import bundle_spec
from shardport.deploy.errors import ClusterError

#: Ray listens on loopback only when this is set before the head starts (measured with ``ss``).
_LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@dataclass(frozen=True)
class Cluster:
    """Where the ranks run: whether Ray was started here, and what the cluster offers."""

    address: str | None
    started_here: bool
    gpus: int
    cpus: float

    def bundle(self, world: int) -> dict[str, float]:
        """One rank's resources: a whole GPU where there are enough, else a share of the CPUs."""
        return bundle_spec(self.gpus, self.cpus, world)


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - ray is a dependency
        raise ClusterError(f"Ray is not installed ({exc}); install shardport with its dependencies") from exc
    return ray


@contextlib.contextmanager
def connect(address: str | None, *, world: int) -> Iterator[Cluster]:
    """Join the Ray cluster at ``address``, or use/start a local one on 127.0.0.1; yield what it offers.

    A Ray already initialised in this process (a test session's, or a caller's) is used as it is and
    left running; a head started here is shut down on exit.
    """
    ray = _ray()
    started = False
    temp: str | None = None
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address is None:
            os.environ.update(_LOOPBACK_ENV)
            temp = tempfile.mkdtemp(prefix="sp-ray-", dir="/tmp")
            kwargs.update(
                num_cpus=max(world, os.cpu_count() or 1),
                _node_ip_address="127.0.0.1",
                object_store_memory=128 * 1024 * 1024,
                _temp_dir=temp,
            )
        else:
            kwargs["address"] = address
        try:
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            if temp is not None:
                shutil.rmtree(temp, ignore_errors=True)
            where = address or "a local head on 127.0.0.1"
            raise ClusterError(f"cannot start or join Ray at {where}: {exc}") from exc
        started = True
    resources = ray.cluster_resources()
    try:
        yield Cluster(
            address=address,
            started_here=started,
            gpus=int(resources.get("GPU", 0)),
            cpus=float(resources.get("CPU", 0)),
        )
    finally:
        if started:
            ray.shutdown()
            if temp is not None:  # the embedded head's session files (logs, sockets) go with it
                shutil.rmtree(temp, ignore_errors=True)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for the ranks' torch.distributed rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
