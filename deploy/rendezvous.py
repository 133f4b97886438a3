"""Where the ranks of one launch meet to form their torch.distributed group, and on which interface.

Two rendezvous, chosen from the nodes the ranks reported (:func:`on_driver_node`):

- **Every rank on the driver's node** (the embedded default, or an existing cluster that placed every
  rank here): a ``FileStore`` in the bring-up's private folder (``file://``, mode 0700: no listener at
  all), and gloo's (and NCCL's bootstrap) sockets pinned to the loopback interface. A ``tcp://``
  rendezvous would make rank 0 run a ``TCPStore``, which listens on every interface whatever the host.
- **Ranks on several nodes** (only possible on a cluster the user joined with ``--address``): rank 0's
  actor opens a ``TCPStore`` on its own node (the address Ray knows that node by, a port the kernel
  picks there: no race between choosing a port and binding it) and reports both; every other rank
  connects to it. Each rank pins gloo's and NCCL's sockets to the interface that carries its node's Ray
  address (:func:`interface_of`), so the group uses the network Ray's nodes already reach each other on.
  The store is a TCP listener on rank 0's node for the length of the join and the run: what must be
  reachable between nodes is Ray's own ports plus that one port and gloo's/NCCL's connections.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ClusterError


@dataclass(frozen=True)
class Rendezvous:
    """How the ranks join: the ``init_method`` URL (a file store) or rank 0's TCP store, and the env.

    ``store``: ``(host, port)`` of the TCP store rank 0 opened on its node (ranks on several nodes); then
    ``init_method`` is the same address as a ``tcp://`` URL, for the record, and each rank pins its sockets
    to the interface carrying its node's address (``env`` is empty: it differs per node).
    """

    init_method: str
    env: dict[str, str] = field(default_factory=dict)
    store: tuple[str, int] | None = None


def loopback_interface() -> str:
    """The name of the interface that holds 127.0.0.1 (``lo`` on Linux)."""
    return interface_of("127.0.0.1") or "lo"


def local_rendezvous(folder: Path, launch: str) -> Rendezvous:
    """Ranks on this machine: a file store in the private ``folder``; gloo and NCCL on loopback."""
    iface = loopback_interface()
    path = folder / f"rendezvous-{launch}"
    return Rendezvous(
        init_method=path.as_uri(),
        env={"GLOO_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": iface},
    )


def on_driver_node(nodes: Sequence[str], driver_node: str) -> bool:
    """Whether every rank reported the driver's node (then :func:`local_rendezvous` applies)."""
    return all(node == driver_node for node in nodes)


def store_rendezvous(host: str, port: int) -> Rendezvous:
    """Ranks on several nodes: rank 0's TCP store at ``host:port`` (each rank picks its own interface)."""
    if not host or not 0 < port < 65536:
        raise ClusterError(f"rank 0 reported no usable rendezvous address ({host!r}, port {port})")
    shown = f"[{host}]" if ":" in host else host
    return Rendezvous(init_method=f"tcp://{shown}:{port}", store=(host, port))


def interface_of(address: str) -> str | None:
    """The name of this machine's interface that holds ``address`` (None when none does)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == address for a in addresses):
            return str(name)
    return None


def socket_env(node_address: str, current: dict[str, str]) -> dict[str, str]:
    """The socket interface gloo and NCCL use for a rank on the node at ``node_address``.

    The interface that carries the address (what Ray reaches the node on); a variable the user already
    set (``current``: the rank's environment) is kept. Nothing is set where no interface holds the
    address (gloo then resolves the host name, as it does by default).
    """
    iface = interface_of(node_address)
    if iface is None:
        return {}
    return {k: iface for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if k not in current}
