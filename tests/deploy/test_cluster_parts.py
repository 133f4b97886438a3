"""The pieces of the bring-up's cluster handling that need no cluster: the connect deadline, the stage
timeouts, the private folders and their sweep, the rendezvous."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from shardport.deploy import scratch
from shardport.deploy.cluster import probe
from shardport.deploy.errors import ClusterError
from shardport.deploy.rendezvous import (
    interface_of,
    local_rendezvous,
    on_driver_node,
    socket_env,
    store_rendezvous,
)
from shardport.deploy.stage_budget import FLOOR_S, stage_timeouts


def test_nothing_listening_fails_within_the_connect_deadline() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    t0 = time.monotonic()
    with pytest.raises(
        ClusterError, match=rf"cannot join Ray at 127.0.0.1:{port}: nothing answered within 2 s"
    ):
        probe(f"127.0.0.1:{port}", 2.0)
    assert time.monotonic() - t0 < 2.5


@pytest.mark.parametrize("greeting", [b"", b"SSH-2.0-OpenSSH_9.6\r\n", b"HTTP/1.1 400 Bad Request\r\n\r\n"])
def test_a_port_that_is_not_a_ray_head_fails_within_the_deadline(greeting: bytes) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            if greeting:
                with contextlib.suppress(OSError):  # the prober may have hung up already
                    conn.sendall(greeting)
                    conn.shutdown(socket.SHUT_WR)
            time.sleep(3)

    threading.Thread(target=answer, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=rf"cannot join Ray at 127.0.0.1:{port}"):
        probe(f"127.0.0.1:{port}", 1.5)
    assert time.monotonic() - t0 < 2.5
    server.close()


def test_stage_timeouts_grow_with_the_model_from_a_floor() -> None:
    small = stage_timeouts(10 * 2**20, 2, 4)
    assert FLOOR_S <= small.prepare < FLOOR_S + 5 and FLOOR_S <= small.run < FLOOR_S + 5
    big = stage_timeouts(64 * 2**30, 8, 16)  # 64 GiB on 8 ranks: 8 GiB each
    assert big.prepare == pytest.approx(FLOOR_S + 8 * 1024 / 4, abs=0.1)
    assert big.run > big.prepare and big.of("run") == big.run and big.of("prepare") == big.prepare
    assert stage_timeouts(64 * 2**30, 8, 16, override=7.0).run == 7.0


def test_the_sweep_removes_only_folders_whose_owner_is_dead(tmp_path: Path) -> None:
    mine = scratch.make(str(tmp_path))
    assert oct(mine.stat().st_mode & 0o777) == oct(0o700)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from shardport.deploy import scratch; print(scratch.make({str(tmp_path)!r}))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    orphaned = Path(dead.stdout.strip())
    # a helper process of the dead driver still holds a file in its folder
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; f = open(sys.argv[1], 'w'); time.sleep(60)",
            str(orphaned / "log"),
        ]
    )
    recycled = scratch.make(str(tmp_path))  # an owner pid that now names another process (start time differs)
    (recycled / scratch.OWNER).write_text(f"{child.pid} 1\n")
    foreign = tmp_path / "sp-ray-foreign"
    foreign.mkdir()  # no owner recorded: not ours to judge
    try:
        deadline = time.monotonic() + 10
        while not scratch.holders(orphaned) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert scratch.holders(orphaned) == [holder.pid]
        assert scratch.owner_alive(mine) is True and scratch.owner_alive(orphaned) is False
        assert scratch.owner_alive(foreign) is None
        assert sorted(scratch.sweep(str(tmp_path))) == sorted([orphaned, recycled])
        assert mine.exists() and foreign.exists() and not orphaned.exists() and not recycled.exists()
        assert holder.wait(timeout=10) == -9  # killed with its folder
    finally:
        child.kill()
        holder.kill()
        child.wait()
        holder.wait()


def test_ranks_on_the_drivers_node_meet_through_a_file_and_loopback(tmp_path: Path) -> None:
    assert on_driver_node(["n1", "n1"], "n1") and not on_driver_node(["n1", "n2"], "n1")
    meet = local_rendezvous(tmp_path, "abc")
    assert meet.init_method == (tmp_path / "rendezvous-abc").as_uri() and meet.store is None
    assert meet.env["GLOO_SOCKET_IFNAME"] == meet.env["NCCL_SOCKET_IFNAME"]
    assert meet.env["GLOO_SOCKET_IFNAME"] in {name for _, name in socket.if_nameindex()}
    assert os.listdir(tmp_path) == []  # nothing written before the ranks join


def test_ranks_on_several_nodes_meet_at_rank_zeros_store_on_their_own_interfaces() -> None:
    meet = store_rendezvous("10.0.0.5", 29511)
    assert meet.store == ("10.0.0.5", 29511) and meet.init_method == "tcp://10.0.0.5:29511"
    assert store_rendezvous("fd00::1", 5).init_method == "tcp://[fd00::1]:5"
    for host, port in (("", 5), ("10.0.0.5", 0), ("10.0.0.5", 70000)):
        with pytest.raises(ClusterError, match="no usable rendezvous address"):
            store_rendezvous(host, port)
    lo = interface_of("127.0.0.1")
    assert lo is not None and lo in {name for _, name in socket.if_nameindex()}
    assert interface_of("192.0.2.77") is None  # TEST-NET-1: on no interface here
    assert socket_env("127.0.0.1", {}) == {"GLOO_SOCKET_IFNAME": lo, "NCCL_SOCKET_IFNAME": lo}
    assert socket_env("127.0.0.1", {"GLOO_SOCKET_IFNAME": "eth9"}) == {"NCCL_SOCKET_IFNAME": lo}
    assert socket_env("192.0.2.77", {}) == {}
