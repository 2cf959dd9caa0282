"""Fixtures: a real NodeKernel cluster (`nk up` on port 0) per test session."""

from __future__ import annotations

import asyncio
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
HANG_S = 120  # every wait here only catches a hang (startup takes a second)

# `nk up` tells clients of this user on this host where its token is, in a
# runtime directory (docs/security.md): the tests' own, not the user's.
os.environ.setdefault("NK_RUNTIME_DIR", tempfile.mkdtemp(prefix="nk-py-run-"))


def run_script(
    script: str | os.PathLike, *args: str, cwd: str | os.PathLike, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Runs a Python script in a fresh interpreter of this environment, its
    output captured; the timeout only catches a hang."""
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


def nk_binary() -> str:
    """`NK_BIN`, else the workspace's debug build, else its release build."""
    if os.environ.get("NK_BIN"):
        return os.environ["NK_BIN"]
    for profile in ("debug", "release"):
        p = ROOT / "target" / profile / "nk"
        if p.exists():
            return str(p)
    found = shutil.which("nk")
    if found:
        return found
    pytest.exit("no nk binary: run `cargo build -p nodekernel-cli` or set NK_BIN", 2)


class Cluster:
    """A `nk up` process with its own data directory."""

    def __init__(self, dram: str = "1GiB", extra: tuple[str, ...] = (), file: str = "0"):
        self.dir = tempfile.mkdtemp(prefix="nk-py-")
        self.bin = nk_binary()
        self.log = open(os.path.join(self.dir, "up.log"), "w+")
        self.proc = subprocess.Popen(
            [
                self.bin,
                "up",
                "--port",
                "0",
                "--dram",
                dram,
                "--file",
                file,
                "--data-dir",
                os.path.join(self.dir, "data"),
                *extra,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.meta = self._wait_for_address()
        self.admin = self._admin_url()
        subprocess.run(
            [
                self.bin,
                "status",
                "--wait",
                "--timeout",
                str(HANG_S),
                "--meta",
                self.meta,
            ],
            check=True,
            capture_output=True,
        )

    def _wait_for_address(self) -> str:
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            self.log.seek(0)
            m = re.search(r"metadata server at (\S+)", self.log.read())
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"nk up exited: {self.log.read()}")
            time.sleep(0.05)
        raise RuntimeError("nk up did not print its address")

    def _admin_url(self) -> str | None:
        """The dashboard's URL, if `nk up` printed one (before its last
        start-up line, `export NK_META=...`)."""
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            self.log.seek(0)
            out = self.log.read()
            if "export NK_META=" in out:
                m = re.search(r"admin endpoint and dashboard at (\S+)", out)
                return m.group(1) if m else None
            time.sleep(0.05)
        raise RuntimeError("nk up did not finish its start-up report")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster():
    c = Cluster()
    # Clients of the tests wait for a reply as long as it takes (the bound
    # only catches a hang): on a loaded machine, the default 5 s is not.
    client_cfg = os.path.join(c.dir, "client.toml")
    with open(client_cfg, "w") as f:
        f.write(f"[client]\ntimeout_ms = {HANG_S * 1000}\n")
    saved = {k: os.environ.get(k) for k in ("NK_META", "NK_CONFIG")}
    os.environ["NK_META"] = c.meta
    os.environ["NK_CONFIG"] = client_cfg
    yield c
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    c.stop()


@pytest.fixture(scope="session")
def nk_meta(cluster) -> str:
    """The session cluster's metadata server address (also in NK_META)."""
    return cluster.meta


@pytest.fixture
def short_wait_config(tmp_path) -> str:
    """A client config whose 1 s timeout also bounds the wait for a cluster
    to start (docs/deployment.md, *Start order and readiness*): for tests
    of addresses where nothing will ever listen."""
    path = tmp_path / "client.toml"
    path.write_text("[client]\ntimeout_ms = 1000\n")
    return str(path)


_counter = 0


@pytest.fixture
def nk_dir(nk_meta) -> str:
    """A fresh, empty directory path in the session cluster."""
    import nodekernel

    global _counter
    _counter += 1
    path = f"/t{os.getpid()}_{_counter}"
    with nodekernel.connect(nk_meta) as c:
        c.mkdir(path)
    return path


# The metadata server drops an abandoned put only after its lease and as
# long again: with this lease that is 20 minutes, so within a test only an
# abort can give the space back.
NO_SWEEP = "[meta]\nlease_timeout_ms = 600000\n"
BASELINE_HANG_S = 60  # only catches a hang, for space coming back


@pytest.fixture
def small_cluster(tmp_path):
    """A 96 MiB cluster whose sweeper never runs during a test (NO_SWEEP)."""
    cfg = tmp_path / "nk.toml"
    cfg.write_text(NO_SWEEP)
    cluster = Cluster(dram="96MiB", extra=("--config", str(cfg)))
    yield cluster
    cluster.stop()


def used(status) -> int:
    """Bytes the cluster's storage servers use, from `status()`."""
    return sum(s["used_bytes"] for s in status["servers"])


async def wait_for_baseline(c, baseline):
    """Waits until no put is in progress and the cluster uses `baseline`
    bytes again (aborts run in the background, so this polls; the bound
    only catches a hang, and the sweeper cannot run meanwhile)."""
    deadline = time.monotonic() + BASELINE_HANG_S
    while True:
        st = await c.status()
        if st["puts_in_progress"] == 0 and used(st) == baseline:
            return
        assert time.monotonic() < deadline, (
            f"{st['puts_in_progress']} puts still in progress, {used(st)} bytes used "
            f"(baseline {baseline})"
        )
        await asyncio.sleep(0.01)
