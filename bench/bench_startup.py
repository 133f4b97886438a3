"""Start-up time of the ``registry`` console script, whole processes, against a bare interpreter.

    .venv/bin/python bench/bench_startup.py [--repeat 15] [--out bench/results/startup.json]

Times ``registry --help`` and the commands that parse no checkpoint (``log``, ``ls``, ``tag``,
``rollback``, ``inspect``) against a small local store holding one pushed artifact, and
``python -c pass`` with the same interpreter (the venv's ``python``: a pyenv ``python3`` shim is a
shell script that would add its own start-up). Bytecode is cached: ``PYTHONDONTWRITEBYTECODE`` is
removed from the children's environment and every command runs once before timing. The commands
run round-robin, so that a change in the machine's load hits all of them alike; each row reports
the median and minimum wall time, the ratio of the medians to the bare interpreter's and their
difference, for wall time and for CPU time (user + system of the child, from ``wait4``; on a shared,
loaded machine wall time mostly measures the wait for a core, CPU time what the process spends).
Goals (issue 15): ``--help`` within 0.2 s of the bare interpreter, the others within 0.5 s. Each row
also lists which heavy packages the command imported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
REGISTRY = str(BIN / "registry")
HEAVY = ("numpy", "pydantic", "gguf", "fsspec", "s3fs", "torch", "ray", "safetensors", "cryptography")
GOALS_S = {"help": 0.2, "log": 0.5, "ls": 0.5, "tag": 0.5, "rollback": 0.5, "inspect": 0.5}
_IMPORTS = """
import contextlib, io, json, sys
from shardport.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(%r))
print(json.dumps({"code": code, "heavy": heavy}))
"""


def _checkpoint(root: Path, seed: int) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1}')
    (root / "model-00000.bin").write_bytes(os.urandom(64 << 10) + bytes([seed]))
    return root


def _run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Run ``cmd``; return its wall time and its CPU time (user + system, from ``wait4``)."""
    start = time.perf_counter()
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert child.stderr is not None
    err = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    took = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    child.stderr.close()
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {child.returncode}: {err.decode()[-2000:]}")
    return took, usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "startup.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shardport-startup-"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["SHARDPORT_HOME"] = str(work / "home")
    env.pop("SHARDPORT_STORE", None)
    store = ["--store", str(work / "store")]
    try:
        _run([REGISTRY, *store, "keygen"], env)
        _run([REGISTRY, *store, "push", str(_checkpoint(work / "a", 1)), "m/x:1"], env)
        _run([REGISTRY, *store, "push", str(_checkpoint(work / "b", 2)), "m/x:1"], env)  # for rollback
        counter = iter(range(1 << 30))
        commands: dict[str, Any] = {
            "bare": lambda: [sys.executable, "-c", "pass"],
            "help": lambda: [REGISTRY, "--help"],
            "log": lambda: [REGISTRY, *store, "log", "m/x:1"],
            "ls": lambda: [REGISTRY, *store, "ls"],
            "tag": lambda: [REGISTRY, *store, "tag", "m/x:1", f"m/x:t{next(counter)}"],
            "rollback": lambda: [REGISTRY, *store, "rollback", "m/x:1", "--steps", "1"],
            "inspect": lambda: [REGISTRY, *store, "inspect", "m/x:1"],
        }
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for make in commands.values():  # warm-up: bytecode written, files in the page cache
            _run(make(), env)
        for _ in range(args.repeat):
            for name, make in commands.items():
                times[name].append(_run(make(), env))
        heavy = {}
        for name, make in commands.items():
            if name == "bare":
                continue
            argv = make()[1:]
            out = subprocess.run(
                [sys.executable, "-c", _IMPORTS % (HEAVY,), *argv],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            heavy[name] = json.loads(out.stdout.strip().splitlines()[-1])["heavy"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    bare_wall = statistics.median(wall for wall, _ in times["bare"])
    bare_cpu = statistics.median(cpu for _, cpu in times["bare"])
    rows: dict[str, Any] = {}
    for name, values in times.items():
        wall = statistics.median(w for w, _ in values)
        cpu = statistics.median(c for _, c in values)
        row: dict[str, Any] = {
            "wall_median_s": round(wall, 4),
            "wall_min_s": round(min(w for w, _ in values), 4),
            "cpu_median_s": round(cpu, 4),
        }
        if name != "bare":
            row["wall_ratio_to_bare"] = round(wall / bare_wall, 2)
            row["wall_minus_bare_s"] = round(wall - bare_wall, 4)
            row["cpu_ratio_to_bare"] = round(cpu / bare_cpu, 2)
            row["cpu_minus_bare_s"] = round(cpu - bare_cpu, 4)
            row["goal_minus_bare_s"] = GOALS_S[name]
            row["goal_met_wall"] = wall - bare_wall <= GOALS_S[name]
            row["goal_met_cpu"] = cpu - bare_cpu <= GOALS_S[name]
            row["imports"] = heavy[name]
        rows[name] = row
    results = {
        "repeat": args.repeat,
        "cpus": os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "note": "wall time includes waiting for a CPU on a loaded machine; CPU time (user + system of "
        "the child) is what the process itself spends, and equals its wall time on an idle core",
        "python": sys.version.split()[0],
        "bytecode_cached": True,
        "commands": rows,
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
