"""Drivers the multi-node tests run inside namespace A; each writes its result, JSON, to OUT.

    python ray_drivers.py OUT spread HEAD_ADDRESS IFACES_JSON   one task per node (STRICT_SPREAD), then
                                                                a gloo all_reduce across the two nodes
    python ray_drivers.py OUT watch HEAD_ADDRESS NODE_IP SECS   print "connected", then wait until the
                                                                node at NODE_IP is reported dead

``IFACES_JSON`` maps each node's address to its veth (``GLOO_SOCKET_IFNAME`` for the rank there). The
result goes to a file, not stdout: Ray's own threads print on the driver's stdout too.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import ray

GLOO_PORT = 29500


def _node() -> dict[str, Any]:
    import socket

    return {
        "ip": ray.util.get_node_ip_address(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
    }


@ray.remote(num_cpus=1)
def where() -> dict[str, Any]:
    return _node()


@ray.remote(num_cpus=1)
def gloo_rank(head_ip: str, ifaces: dict[str, str]) -> dict[str, Any]:
    """Rank 0 on the head's node (it serves the TCPStore there), rank 1 on the other; all_reduce."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    me = _node()
    rank = 0 if me["ip"] == head_ip else 1
    os.environ["GLOO_SOCKET_IFNAME"] = ifaces[me["ip"]]
    store = dist.TCPStore(head_ip, GLOO_PORT, 2, rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        t = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
        dist.all_reduce(t)
        ips: list[Any] = [None, None]
        dist.all_gather_object(ips, me["ip"])
    finally:
        dist.destroy_process_group()
    return {**me, "rank": rank, "sum": t.tolist(), "gathered": ips, "iface": ifaces[me["ip"]]}


def spread(address: str, ifaces: dict[str, str]) -> dict[str, Any]:
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    ray.get(pg.ready(), timeout=60)
    try:
        on = [PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i) for i in range(2)]
        tasks = ray.get([where.options(scheduling_strategy=s).remote() for s in on], timeout=60)
        head_ip = address.rsplit(":", 1)[0]
        t0 = time.monotonic()
        ranks = ray.get(
            [gloo_rank.options(scheduling_strategy=s).remote(head_ip, ifaces) for s in on], timeout=120
        )
        return {
            "tasks": tasks,
            "ranks": sorted(ranks, key=lambda r: r["rank"]),
            "gloo_s": time.monotonic() - t0,
            "driver_ip": ray.util.get_node_ip_address(),
        }
    finally:
        remove_placement_group(pg)


def watch(address: str, node_ip: str, seconds: float) -> dict[str, Any]:
    ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    print("connected", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        states = {n["NodeManagerAddress"]: n["Alive"] for n in ray.nodes()}
        if states.get(node_ip) is False:
            return {"dead_at": time.time(), "states": states}
        time.sleep(0.1)
    return {"dead_at": None, "states": states}


def main(argv: list[str]) -> None:
    result, what, args = Path(argv[0]), argv[1], argv[2:]
    if what == "spread":
        out = spread(args[0], json.loads(args[1]))
    elif what == "watch":
        out = watch(args[0], args[1], float(args[2]))
    else:
        raise SystemExit(f"unknown driver {what!r}: expected spread or watch")
    result.write_text(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
