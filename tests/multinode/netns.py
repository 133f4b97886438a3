"""Two Ray nodes on this machine, each in a network namespace of its own (issue 28).

``two_node_cluster`` creates namespaces ``A`` and ``B`` joined by a veth pair whose two private
addresses exist only inside them, starts ``ray start --head`` in A and ``ray start --address`` in B,
and yields a :class:`TwoNodeCluster` that runs drivers (and any other command) inside A. Token
authentication stays on: the cluster's own token (0600, in the cluster's folder) reaches every Ray
process through ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH``; nothing is read from or written
to ``~/.ray``. The namespaces share the file system with the test, not its network: a server the
cluster must reach (an S3 server, say) runs inside A on A's private address (``popen_in_head``).

Every process is started with a clean environment: the test process's, less every ``RAY_*`` variable
and ``SHARDPORT_RAY_AUTH`` (the suite's own Ray runs with authentication disabled), plus the auth
variables above and the venv's ``bin`` first on ``PATH``. ``RAY_ADDRESS`` is never set: a driver
names :attr:`TwoNodeCluster.head_address` itself.

Teardown, in every outcome: every process ``ip netns pids`` lists (SIGTERM, then SIGKILL), the veth,
both namespaces and the cluster's folder. ``ray stop`` is never used (it stops every Ray on the
machine). An ``atexit`` hook tears down what a dying test process left, and each new cluster first
sweeps namespaces of this prefix whose creating process is gone (a test run killed outright).

gloo across the two nodes needs ``GLOO_SOCKET_IFNAME`` set to the node's veth (:attr:`NodeNet.iface`):
left to itself, gloo resolves the host name, which ``/etc/hosts`` maps to 127.0.0.1 in both
namespaces, and each rank then dials its own loopback ("Connection refused").
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "spn"  # namespaces spn-<pid>-<tag>-a/-b, folder /tmp/spn-<pid>-<tag>
NETNS_DIR = Path("/run/netns")
RAY_PORT = 6379  # the head's GCS port: ports are per namespace, so no other Ray on the machine clashes
OBJECT_STORE_BYTES = 80_000_000
BIN = Path(sys.executable).parent  # the venv's bin: python, ray, registry
START_TIMEOUT_S = 90.0
# Ray's default health check (every 3 s, dead after 5 misses) reports a killed raylet dead after 15 s
# (measured); this one after about 1.5-3 s, so a test that kills a node stays short.
FAST_HEALTH = {
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 3,
    "health_check_timeout_ms": 1000,
}
_NAME = re.compile(rf"{PREFIX}-(\d+)-([0-9a-f]+)-[ab]")
_LIVE: dict[str, tuple[tuple[str, str], Path]] = {}  # tag -> (namespaces, folder): the atexit net

# A driver in A: wait until ``want`` nodes are alive (or the deadline), print every node the GCS knows.
_NODES_SCRIPT = """
import json, sys, time, ray
address, want, deadline = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
ray.init(address=address, log_to_driver=False, logging_level="ERROR")
while True:
    nodes = ray.nodes()
    if sum(n["Alive"] for n in nodes) >= want or time.monotonic() > deadline:
        break
    time.sleep(0.2)
print(json.dumps([{"id": n["NodeID"], "address": n["NodeManagerAddress"], "alive": n["Alive"]}
                  for n in nodes]))
"""


class ClusterStartError(RuntimeError):
    """The two-node cluster did not come up; the message holds the command's output and Ray's logs."""

    def __init__(self, message: str, cluster: TwoNodeCluster) -> None:
        super().__init__(message)
        self.cluster = cluster  # torn down by the time the caller sees this error


@dataclass(frozen=True, slots=True)
class NodeNet:
    """One node: its label (``a`` or ``b``), namespace, veth end, private address and Ray folder."""

    label: str
    netns: str
    iface: str
    address: str
    temp_dir: Path


@dataclass(frozen=True, slots=True)
class Proc:
    """A process, told apart from a later one with the same pid by its start time (clock ticks)."""

    pid: int
    start: int
    cmdline: str

    def alive(self) -> bool:
        now = _stat(self.pid)
        return now is not None and now[1] == self.start and now[0] != "Z"


@dataclass(frozen=True, slots=True)
class TwoNodeCluster:
    """A running two-node cluster: A (head, drivers) and B (joined), and how to run things in A."""

    a: NodeNet
    b: NodeNet
    port: int
    folder: Path
    token_path: Path
    env: Mapping[str, str]  # what every process in the namespaces starts with (auth on, no RAY_ADDRESS)
    ended: list[Proc] = field(default_factory=list)  # filled at teardown: every process it ended

    @property
    def head_address(self) -> str:
        """``ADDR_A:PORT``: what a driver passes to ``ray.init(address=…)`` or ``registry up --address``."""
        return f"{self.a.address}:{self.port}"

    @property
    def nodes(self) -> tuple[NodeNet, NodeNet]:
        return (self.a, self.b)

    @property
    def namespaces(self) -> tuple[str, str]:
        return (self.a.netns, self.b.netns)

    @property
    def python(self) -> str:
        """The venv's python, for drivers: ``run_in_head([cluster.python, "-c", …])``."""
        return str(BIN / "python")

    def node(self, label: str) -> NodeNet:
        if label not in ("a", "b"):
            raise ValueError(f"node {label!r}: expected 'a' (head) or 'b' (joined)")
        return self.a if label == "a" else self.b

    def driver_env(self, extra: Mapping[str, str | None] | None = None) -> dict[str, str]:
        """The environment of a process in the namespaces, ``extra`` applied (None removes a variable)."""
        env = dict(self.env)
        for k, v in (extra or {}).items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env

    def run_in(
        self,
        label: str,
        argv: Sequence[str | Path],
        env: Mapping[str, str | None] | None = None,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside node ``label``'s namespace; its output captured, its status not checked."""
        return subprocess.run(
            ["ip", "netns", "exec", self.node(label).netns, *map(str, argv)],
            env=self.driver_env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def run_in_head(
        self, argv: Sequence[str | Path], env: Mapping[str, str | None] | None = None, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside A (the driver's namespace) and wait for it."""
        return self.run_in("a", argv, env, timeout)

    def popen_in_head(
        self, argv: Sequence[str | Path], env: Mapping[str, str | None] | None = None, **kwargs: Any
    ) -> subprocess.Popen[str]:
        """Start ``argv`` inside A and return at once (stdout/stderr piped unless ``kwargs`` say else).

        Whatever it leaves running is ended with the cluster.
        """
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        return subprocess.Popen(
            ["ip", "netns", "exec", self.a.netns, *map(str, argv)],
            env=self.driver_env(env),
            text=True,
            **kwargs,
        )

    def processes(self, label: str) -> list[Proc]:
        """The processes in node ``label``'s namespace."""
        return _netns_procs(self.node(label).netns)

    def raylet(self, label: str = "b") -> Proc:
        """Node ``label``'s raylet (the process whose executable is Ray's ``raylet``)."""
        found = [p for p in self.processes(label) if Path(p.cmdline.split(" ", 1)[0]).name == "raylet"]
        if len(found) != 1:
            listed = [p.cmdline[:80] for p in self.processes(label)]
            raise RuntimeError(f"node {label}: expected one raylet, found {len(found)} among {listed}")
        return found[0]

    def kill_raylet(self, label: str = "b", sig: int = signal.SIGKILL) -> Proc:
        """Send ``sig`` (SIGKILL: a crash) to node ``label``'s raylet; wait until it is gone."""
        proc = self.raylet(label)
        os.kill(proc.pid, sig)
        _wait_gone([proc], 10.0)
        if proc.alive():
            raise RuntimeError(f"node {label}: raylet {proc.pid} still alive 10 s after signal {sig}")
        return proc

    def ray_nodes(self, want_alive: int = 0, wait_s: float = 0.0) -> list[dict[str, Any]]:
        """Every node the GCS knows (``id``, ``address``, ``alive``), read by a driver in A.

        ``want_alive``: poll up to ``wait_s`` seconds until that many are alive.
        """
        done = self.run_in_head(
            [self.python, "-c", _NODES_SCRIPT, self.head_address, str(want_alive), str(wait_s)],
            timeout=wait_s + 60.0,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"a driver in {self.a.netns} could not list Ray's nodes: {done.stderr[-3000:]}"
            )
        # Ray's processes may print on the driver's stdout too: the script's own line is the last list
        line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("[")), None)
        if line is None:
            raise RuntimeError(f"the node-listing driver printed no node list: {done.stdout[-2000:]}")
        nodes: list[dict[str, Any]] = json.loads(line)
        return nodes

    def node_ids(self) -> dict[str, str]:
        """The Ray node id of each alive node, by label (``a``, ``b``)."""
        by_address = {n["address"]: n["id"] for n in self.ray_nodes() if n["alive"]}
        return {n.label: by_address[n.address] for n in self.nodes if n.address in by_address}


# -- processes and namespaces ---------------------------------------------------------------------


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of ``pid``, or None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "
    return fields[0], int(fields[19])


def _netns_procs(netns: str) -> list[Proc]:
    """The processes in ``netns`` (what ``ip netns pids`` lists), with start times and command lines."""
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=False)
    procs = []
    for word in done.stdout.split():
        pid = int(word)
        st = _stat(pid)
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if st is not None and st[0] != "Z":
                procs.append(Proc(pid, st[1], cmdline.strip()))
    return procs


def _wait_gone(procs: Sequence[Proc], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(p.alive() for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)


def _signal_all(procs: Sequence[Proc], sig: int) -> None:
    for p in procs:
        if p.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, sig)


def _end_netns_procs(namespaces: Sequence[str], grace_s: float = 1.0) -> list[Proc]:
    """SIGTERM every process in ``namespaces``, SIGKILL what is left after ``grace_s``; return them all."""
    ended: dict[int, Proc] = {}
    for _ in range(5):  # a process may start another while the first round ends
        procs = [p for ns in namespaces for p in _netns_procs(ns)]
        if not procs:
            break
        ended.update({p.pid: p for p in procs})
        _signal_all(procs, signal.SIGTERM)
        _wait_gone(procs, grace_s)
        _signal_all(procs, signal.SIGKILL)
        _wait_gone(procs, 5.0)
    return list(ended.values())


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()}")


def _remove(namespaces: Sequence[str], iface: str | None, folder: Path) -> list[Proc]:
    """End every process in ``namespaces``, delete the veth and the namespaces, remove ``folder``."""
    ended = _end_netns_procs(namespaces)
    existing = set(_listed_namespaces())
    if iface is not None and namespaces[0] in existing:
        subprocess.run(["ip", "-n", namespaces[0], "link", "del", iface], capture_output=True, check=False)
    failures = []
    for ns in namespaces:
        if ns in existing:
            try:
                _ip("netns", "del", ns)
            except RuntimeError as exc:
                failures.append(str(exc))
    shutil.rmtree(folder, ignore_errors=True)
    if failures:
        raise RuntimeError("; ".join(failures))
    return ended


def _listed_namespaces() -> list[str]:
    return sorted(os.listdir(NETNS_DIR)) if NETNS_DIR.is_dir() else []


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise RuntimeError("/proc/stat has no btime line")


def _owner_alive(pid: int, created: float) -> bool:
    """Whether process ``pid`` exists and started before ``created`` (so it made the namespace)."""
    st = _stat(pid)
    if st is None or st[0] == "Z":
        return False
    started = _boot_time() + st[1] / os.sysconf("SC_CLK_TCK")
    return started <= created + 1.0


def sweep_stale() -> list[str]:
    """Remove this prefix's namespaces (and folders) whose creating process is gone; return their names.

    A namespace of a live process (another test run on this machine, or this one's) is left alone.
    """
    swept = []
    for name in _listed_namespaces():
        m = _NAME.fullmatch(name)
        if m is None:
            continue
        try:
            created = (NETNS_DIR / name).stat().st_mtime  # nsfs: the namespace's creation time
        except FileNotFoundError:
            continue
        if _owner_alive(int(m[1]), created):
            continue
        _remove([name], None, Path("/tmp") / f"{PREFIX}-{m[1]}-{m[2]}")
        swept.append(name)
    return swept


@atexit.register
def _teardown_left() -> None:
    """The safety net: tear down every cluster this process still holds."""
    for tag, (namespaces, folder) in list(_LIVE.items()):
        with contextlib.suppress(Exception):
            _remove(namespaces, None, folder)
        _LIVE.pop(tag, None)


def leftovers(cluster: TwoNodeCluster, seen: Sequence[Proc] = ()) -> list[str]:
    """What a torn-down ``cluster`` left behind: namespaces, live processes, its folder (empty: nothing).

    ``seen``: processes listed in its namespaces before the teardown; each must have been ended.
    """
    left = [f"namespace {ns}" for ns in cluster.namespaces if ns in _listed_namespaces()]
    ended = {p.pid for p in cluster.ended}
    left += [f"process {p.pid} ({p.cmdline[:60]}) not ended" for p in seen if p.pid not in ended]
    left += [f"process {p.pid} ({p.cmdline[:60]}) alive" for p in [*seen, *cluster.ended] if p.alive()]
    if cluster.folder.exists():
        left.append(f"folder {cluster.folder}")
    return left


# -- bring-up -------------------------------------------------------------------------------------


def clean_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` less every ``RAY_*`` variable and ``SHARDPORT_RAY_AUTH``; the venv's bin first on PATH."""
    env = {k: v for k, v in base.items() if not k.startswith("RAY_") and k != "SHARDPORT_RAY_AUTH"}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "/usr/bin:/bin")])
    return env


def _make_network(a: NodeNet, b: NodeNet) -> None:
    """Namespaces A and B, a veth pair created straight inside them (never in the test's namespace)."""
    _ip("netns", "add", a.netns)
    _ip("netns", "add", b.netns)
    _ip("link", "add", a.iface, "netns", a.netns, "type", "veth", "peer", "name", b.iface, "netns", b.netns)
    for n in (a, b):
        _ip("-n", n.netns, "addr", "add", f"{n.address}/24", "dev", n.iface)
        _ip("-n", n.netns, "link", "set", "lo", "up")
        _ip("-n", n.netns, "link", "set", n.iface, "up")


def _log_tails(folder: Path, lines: int = 15) -> str:
    """The last lines of Ray's gcs_server and raylet logs under ``folder``."""
    out = []
    for path in sorted(folder.glob("*/session_2*/logs/*")):  # not session_latest: a link to the same
        if path.name.startswith(("gcs_server", "raylet")) and path.suffix in (".out", ".err"):
            with contextlib.suppress(OSError):
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                if tail:
                    out.append(f"--- {path.relative_to(folder)}\n" + "\n".join(tail))
    return "\n".join(out)


def _ray_start(cluster: TwoNodeCluster, node: NodeNet, args: Sequence[str], cpus: int) -> None:
    argv = [
        str(BIN / "ray"),
        "start",
        *args,
        "--node-ip-address",
        node.address,
        "--num-cpus",
        str(cpus),
        "--object-store-memory",
        str(OBJECT_STORE_BYTES),
        "--disable-usage-stats",
        "--temp-dir",
        str(node.temp_dir),
    ]
    done = cluster.run_in(node.label, argv, timeout=START_TIMEOUT_S)
    if done.returncode != 0:
        raise ClusterStartError(
            f"`ray start` in {node.netns} ({node.address}) exited {done.returncode}:\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}\n{_log_tails(cluster.folder)}",
            cluster,
        )


def _start_ray(cluster: TwoNodeCluster, cpus: int, system_config: Mapping[str, Any] | None) -> None:
    head = ["--head", "--port", str(cluster.port), "--include-dashboard", "false"]
    if system_config:
        head += ["--system-config", json.dumps(dict(system_config))]
    _ray_start(cluster, cluster.a, head, cpus)
    _ray_start(cluster, cluster.b, ["--address", cluster.head_address], cpus)
    nodes = cluster.ray_nodes(want_alive=2, wait_s=START_TIMEOUT_S)
    alive = sorted(n["address"] for n in nodes if n["alive"])
    if alive != sorted([cluster.a.address, cluster.b.address]):
        raise ClusterStartError(
            f"expected nodes {cluster.a.address} and {cluster.b.address} alive, the GCS lists {nodes}\n"
            f"{_log_tails(cluster.folder)}",
            cluster,
        )


def _plan(tag: str, folder: Path, subnet: int) -> tuple[NodeNet, NodeNet]:
    names = [f"{PREFIX}-{os.getpid()}-{tag}-{x}" for x in "ab"]
    return (
        NodeNet("a", names[0], f"sp{tag}a", f"10.251.{subnet}.1", folder / "a"),
        NodeNet("b", names[1], f"sp{tag}b", f"10.251.{subnet}.2", folder / "b"),
    )


def _keep_logs(folder: Path, dest: Path) -> None:
    """Copy Ray's logs of both nodes under ``dest`` (after a failure, before the folder goes)."""
    for logs in folder.glob("*/session_2*/logs"):
        with contextlib.suppress(OSError):
            shutil.copytree(logs, dest / logs.parts[-3], dirs_exist_ok=True)


@contextlib.contextmanager
def two_node_cluster(
    tmp_path: Path,
    cpus_per_node: int = 2,
    system_config: Mapping[str, Any] | None = None,
    base_env: Mapping[str, str] | None = None,
) -> Iterator[TwoNodeCluster]:
    """Bring up Ray on two namespaced nodes; tear everything down on exit, whatever the outcome.

    ``system_config``: Ray's ``--system-config`` for the head (e.g. a shorter health check).
    ``base_env``: the environment the namespaced processes start from (default: this process's),
    cleaned by :func:`clean_env`. After a failure (bring-up or the block), Ray's logs are copied under
    ``tmp_path / "ray-logs"``.
    """
    sweep_stale()
    tag = secrets.token_hex(3)
    folder = Path("/tmp") / f"{PREFIX}-{os.getpid()}-{tag}"  # short: Ray's socket paths live under it
    folder.mkdir(mode=0o700)
    a, b = _plan(tag, folder, secrets.randbelow(250) + 1)
    token = folder / "token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    env = {**clean_env(os.environ if base_env is None else base_env), **auth}
    cluster = TwoNodeCluster(a, b, RAY_PORT, folder, token, env)
    _LIVE[tag] = ((a.netns, b.netns), folder)
    failed = True
    try:
        _make_network(a, b)
        _start_ray(cluster, cpus_per_node, system_config)
        yield cluster
        failed = False
    finally:
        if failed:
            _keep_logs(folder, tmp_path / "ray-logs")
        cluster.ended.extend(_remove((a.netns, b.netns), a.iface, folder))
        _LIVE.pop(tag, None)
