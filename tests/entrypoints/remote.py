"""A real ``tandem serve`` in a subprocess on a free loopback port, for the server tests.

Each test module starts one server (module-scoped fixture) and the fixture stops it with SIGINT
(graceful: uvicorn, then the engine), killing it only if it does not exit in time. Tests never reach
any address but 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tandem.entrypoints.serve_cmd import READY_PREFIX

START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0


class RemoteServer:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        self.log = log

    @property
    def host_port(self) -> tuple[str, int]:
        host, port = self.url.removeprefix("http://").split(":")
        return host, int(port)

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics (parsed by prometheus-client), keyed by name and sorted labels."""
        status, body = self.get("/metrics")
        assert status == 200
        samples: dict[str, float] = {}
        for family in text_string_to_metric_families(body.decode()):
            for s in family.samples:
                labels = ",".join(
                    f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name"
                )
                samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return samples

    def wait_idle(self, timeout: float = 60.0) -> dict[str, float]:
        """Metrics once no request runs or waits and no KV block is in use."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            idle = (
                m["vllm:num_requests_running"] == 0
                and m["vllm:num_requests_waiting"] == 0
                and m["vllm:kv_cache_usage_perc"] == 0
            )
            if idle or time.monotonic() > deadline:
                return m
            time.sleep(0.2)


def config_json(*flags: str) -> dict:
    """``tandem config --json`` for the same engine flags."""
    out = subprocess.run(
        [sys.executable, "-m", "tandem.entrypoints.cli", "config", "--json", *flags],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return json.loads(out.stdout)


@contextmanager
def launch(*flags: str, env: dict[str, str] | None = None) -> Iterator[RemoteServer]:
    tmp = Path(tempfile.mkdtemp(prefix="tandem-serve-"))
    out_path, log_path = tmp / "stdout", tmp / "stderr"
    cmd = [
        sys.executable,
        "-m",
        "tandem.entrypoints.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--uvicorn-log-level",
        "warning",
        "--disable-uvicorn-access-log",
        *flags,
    ]
    with open(out_path, "wb") as out, open(log_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env={**os.environ, **(env or {})})
    try:
        url = _wait_ready(proc, out_path, log_path)
        server = RemoteServer(proc, url, log_path)
        _wait_healthy(server)
        yield server
    finally:
        _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)  # the server's stdout / stderr, read only while it runs


def _wait_ready(proc: subprocess.Popen[bytes], out_path: Path, log_path: Path) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for line in out_path.read_text().splitlines():
            if line.startswith(READY_PREFIX):
                url = line[len(READY_PREFIX) :].strip()
                assert url.startswith("http://127.0.0.1:"), url
                return url
        if proc.poll() is not None:
            raise RuntimeError(
                f"server exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}"
            )
        time.sleep(0.2)
    raise TimeoutError(f"server not ready in {START_TIMEOUT_S}s:\n{log_path.read_text()[-3000:]}")


def _wait_healthy(server: RemoteServer) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if server.get("/health", timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError("server never became healthy")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
