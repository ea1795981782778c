"""Server tests: a real ``vllm serve`` (the vllm-cpu build of this environment, spec-compat
loaded through the plugin entry point) and a stock speculators release as the client, in a
second environment (``SPEC_COMPAT_CLIENT_PYTHON``, set by ``matrix/run`` for two-environment
cells).  One server at a time; each test starts its own."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")

MISSING = [m for m in ("vllm", "torch", "transformers") if importlib.util.find_spec(m) is None]


def _speculators_is_a_server_client() -> bool:
    """speculators >= 0.5 generates data through ``vllm serve``; 0.3/0.4 (in-process generator)
    next to vLLM are no client of these tests."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import InvalidVersion, Version

    try:
        return Version(version("speculators")).release >= (0, 5)
    except (PackageNotFoundError, InvalidVersion):
        return False


# a one-environment cell (speculators >= 0.5 next to vLLM, as on vLLM >= 0.17) is its own client
if not MISSING and not os.environ.get("SPEC_COMPAT_CLIENT_PYTHON") and _speculators_is_a_server_client():
    os.environ["SPEC_COMPAT_CLIENT_PYTHON"] = sys.executable


def pytest_collection_modifyitems(config, items):
    reason = None
    if MISSING:
        reason = f"needs a vLLM server environment ({', '.join(MISSING)} not installed)"
    elif not os.environ.get("SPEC_COMPAT_CLIENT_PYTHON"):
        reason = ("needs a client environment (SPEC_COMPAT_CLIENT_PYTHON; matrix/run sets it for two-env cells) "
                  "or speculators >= 0.5 installed here")
    if reason is None:
        return
    if os.environ.get("SPEC_COMPAT_REQUIRE_SERVER") == "1":
        raise pytest.UsageError(reason)
    for item in items:
        if "tests/server" in str(item.fspath):
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def client_python() -> str:
    return os.environ["SPEC_COMPAT_CLIENT_PYTHON"]


@pytest.fixture(scope="session")
def fixture_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("fixtures")
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            out = root / name
            subprocess.run([sys.executable, "-m", "spec_compat", "fixture", name, str(out)], check=True,
                           stdout=subprocess.DEVNULL)
            built[name] = out
        return built[name]

    return get


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python -m vllm.entrypoints.cli.main serve ...`` (speculators' launch command) in the
    background; ``url`` once ``/v1/models`` answers."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None,
                 python: str | None = None) -> None:
        self.port = free_port()
        self.log = log
        self._out = open(log, "w")
        full_env = dict(os.environ)
        full_env.pop("SPEC_COMPAT_DISABLE", None)  # only what the test passes
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [python or sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *args, "--port", str(self.port),
             "--host", "127.0.0.1"], stdout=self._out, stderr=subprocess.STDOUT, env=full_env)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 420) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(2)
        raise TimeoutError(f"vllm serve not ready after {timeout}s:\n{self.tail()}")

    def tail(self, n: int = 6000) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")[-n:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self._out.close()


@pytest.fixture
def serve(tmp_path):
    started: list[Server] = []

    def start(args: list[str], env: dict[str, str] | None = None) -> Server:
        server = Server(args, tmp_path / f"server-{len(started)}.log", env)
        started.append(server)
        return server

    yield start
    for s in started:
        s.stop()
