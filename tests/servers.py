"""Real S3 servers on 127.0.0.1 for tests and benchmarks: moto (fast) and SeaweedFS (real)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ACCESS_KEY = "shardport-test"
SECRET_KEY = "shardport-test-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"server did not listen on 127.0.0.1:{port} within {timeout}s")


@dataclass
class S3Server:
    kind: str
    endpoint: str
    proc: subprocess.Popen[bytes]
    workdir: Path

    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def new_bucket(self) -> str:
        import boto3

        name = f"t-{uuid.uuid4().hex[:16]}"
        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
        )
        client.create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _bin(name: str) -> str:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def start_moto() -> S3Server:
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="moto-"))
    log = work / "log.txt"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [_bin("moto_server"), "-H", "127.0.0.1", "-p", str(port)], stdout=fh, stderr=subprocess.STDOUT
        )
    _wait_port(port, proc, 30, log)
    return S3Server("moto", f"http://127.0.0.1:{port}", proc, work)


def start_seaweedfs() -> S3Server:
    """``weed mini`` with every port chosen free, telemetry off, bound to 127.0.0.1."""
    work = Path(tempfile.mkdtemp(prefix="weed-"))
    s3, master, volume, filer = (free_port() for _ in range(4))
    log = work / "log.txt"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [
                _bin("weed"),
                "mini",
                f"-dir={work}",
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-webdav=false",
                "-admin.ui=false",
                "-master.telemetry=false",
                f"-s3.port={s3}",
                f"-master.port={master}",
                f"-volume.port={volume}",
                f"-filer.port={filer}",
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=work,
        )
    _wait_port(s3, proc, 60, log)
    server = S3Server("seaweedfs", f"http://127.0.0.1:{s3}", proc, work)
    deadline = time.monotonic() + 60
    while True:  # the S3 port opens before the filer is ready to create buckets
        try:
            server.new_bucket()
            return server
        except Exception:
            if time.monotonic() > deadline:
                server.stop()
                raise
            time.sleep(0.5)
