"""Fixtures of the PySpark test: a NodeKernel cluster (the Python tests' own
`nk up` on port 0, crates/py/tests/conftest.py) and the jars that
scripts/java.sh built, found as docs/spark.md tells a user to name them."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
JAVA = ROOT / "java"

# The Python tests' cluster (its import also gives `nk up` and its clients a
# runtime directory of the tests' own, NK_RUNTIME_DIR).
_spec = importlib.util.spec_from_file_location(
    "nk_py_tests_conftest", ROOT / "crates" / "py" / "tests" / "conftest.py"
)
py_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(py_tests)
HANG_S = py_tests.HANG_S


def project_version() -> str:
    """The version of java/pom.xml's modules (their jars' names carry it)."""
    pom = (JAVA / "pom.xml").read_text()
    m = re.search(r"<artifactId>nodekernel-parent</artifactId>\s*<version>([^<]+)</version>", pom)
    if not m:
        raise RuntimeError("no version of nodekernel-parent in java/pom.xml")
    return m.group(1)


def jar(path: str) -> str:
    """A jar that scripts/java.sh builds (path relative to java/, with
    VERSION for the project's version)."""
    p = JAVA / path.replace("VERSION", project_version())
    if not p.is_file():
        pytest.exit(f"{p} is missing: build it first (scripts/java.sh --part=spark)", 2)
    return str(p)


class Nk:
    """The cluster, and `nk` commands against it."""

    def __init__(self, cluster, client_config: str):
        self.cluster = cluster
        self.meta = cluster.meta
        self.client_config = client_config

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.cluster.bin, *args, "--meta", self.meta, "--config", self.client_config],
            capture_output=True,
            text=True,
            timeout=HANG_S,
            check=check,
        )

    def exists(self, path: str) -> bool:
        r = self.run("test", "-e", path, check=False)
        assert r.returncode in (0, 1), r.stderr
        return r.returncode == 0


@pytest.fixture(scope="session")
def nk():
    c = py_tests.Cluster()
    # Waits bounded only to catch a hang: a loaded machine is slow.
    cfg = os.path.join(c.dir, "client.toml")
    with open(cfg, "w") as f:
        f.write(f"[client]\ntimeout_ms = {HANG_S * 1000}\n")
    yield Nk(c, cfg)
    c.stop()
