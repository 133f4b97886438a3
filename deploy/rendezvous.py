"""Where the ranks of one launch meet to form their torch.distributed group, and on which interface.

A ``tcp://`` rendezvous makes rank 0 run a ``TCPStore``, which listens on every interface whatever the
host in the URL: an unauthenticated service on the network for the length of every multi-rank run. When
every rank runs on the driver's machine (the embedded default, or an existing cluster whose ranks were
all placed on this node), the ranks meet through a ``FileStore`` in the bring-up's private folder
(``file://``, mode 0700: no listener at all), and gloo's (and NCCL's bootstrap) sockets are pinned to the
loopback interface. Ranks spread over several nodes are refused for now: the seam for a multi-node
rendezvous is :func:`rendezvous_for`, which already receives the node every rank reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ClusterError


@dataclass(frozen=True)
class Rendezvous:
    """How the ranks join: the ``init_method`` URL and the environment each rank sets before joining."""

    init_method: str
    env: dict[str, str] = field(default_factory=dict)


def loopback_interface() -> str:
    """The name of the interface that holds 127.0.0.1 (``lo`` on Linux)."""
    try:
        import psutil

        for name, addresses in psutil.net_if_addrs().items():
            if any(a.address == "127.0.0.1" for a in addresses):
                return str(name)
    except ImportError:  # pragma: no cover - psutil is a dependency
        pass
    return "lo"


def local_rendezvous(folder: Path, launch: str) -> Rendezvous:
    """Ranks on this machine: a file store in the private ``folder``; gloo and NCCL on loopback."""
    iface = loopback_interface()
    path = folder / f"rendezvous-{launch}"
    return Rendezvous(
        init_method=path.as_uri(),
        env={"GLOO_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": iface},
    )


def rendezvous_for(nodes: Sequence[str], driver_node: str, folder: Path, launch: str) -> Rendezvous:
    """The rendezvous for ranks placed on ``nodes`` (rank order), the driver being on ``driver_node``.

    Every rank on the driver's node: :func:`local_rendezvous`. Otherwise a :class:`ClusterError`: a
    multi-node rendezvous (rank 0's node address, a store bound there and nowhere else) is not built yet.
    """
    elsewhere = sorted({r for r, node in enumerate(nodes) if node != driver_node})
    if not elsewhere:
        return local_rendezvous(folder, launch)
    raise ClusterError(
        f"ranks {elsewhere} were placed on another node than the driver's ({len(set(nodes))} node(s) in "
        "all): a rendezvous across nodes is not supported yet; run the ranks on one machine (the embedded "
        "default, or a cluster of one node)"
    )
