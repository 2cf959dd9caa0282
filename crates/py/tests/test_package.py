"""The package as a user first meets it: `nodekernel.aio` and
`nodekernel.__version__` right after `import nodekernel`, and type stubs
that mypy accepts for the whole public API and that match the native
module. What depends on imports runs in a fresh interpreter, so that the
imports of other tests cannot hide a regression."""

from __future__ import annotations

import importlib.metadata
import pathlib
import subprocess
import sys
from typing import Any

import pytest
from packaging.version import Version

import nodekernel
from conftest import HANG_S, ROOT, run_script

PY = ROOT / "crates" / "py"
PACKAGE = PY / "python" / "nodekernel"
HERE = pathlib.Path(__file__).resolve().parent


def _python(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    """Runs a fresh interpreter of this environment, with this process's
    environment variables."""
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=HANG_S
    )


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    return proc.stdout


# ---------------------------------------------------------------------------
# nodekernel.aio

AIO_WITHOUT_IMPORT = """
import asyncio
import sys

import nodekernel


async def main(base):
    async with await nodekernel.aio.connect() as nk:
        await nk.mkdir(base + "/t", type="table")
        await nk.put(base + "/t/k", b"v")
        assert await nk.get(base + "/t/k") == b"v"


asyncio.run(main(sys.argv[1]))
"""


def test_aio_comes_with_import_nodekernel(nk_dir, tmp_path):
    script = tmp_path / "aio_without_import.py"
    script.write_text(AIO_WITHOUT_IMPORT)
    _ok(run_script(script, nk_dir, cwd=tmp_path))


@pytest.mark.parametrize(
    "first",
    [
        "import nodekernel.aio",
        "from nodekernel import aio",
        "from nodekernel.aio import connect",
        "import nodekernel.errors",
        "import nodekernel.fsspec",
    ],
)
def test_each_module_can_be_imported_first(first, tmp_path):
    """No import cycle: any module of the package imports first."""
    code = f"{first}\nimport nodekernel\nassert nodekernel.aio.connect and nodekernel.NotFound"
    _ok(_python("-c", code, cwd=tmp_path))


# ---------------------------------------------------------------------------
# nodekernel.__version__


def _toml(path: pathlib.Path) -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        tomllib = pytest.importorskip("tomli")
    with open(path, "rb") as f:
        return tomllib.load(f)


def _declared_version() -> str:
    """The version the package is built with: pyproject.toml's own, or
    (declared `dynamic`, as maturin reads it) the crate's, which may be the
    workspace's."""
    project = _toml(PY / "pyproject.toml")["project"]
    if "version" in project:
        return project["version"]
    assert "version" in project.get("dynamic", []), "pyproject.toml declares no version"
    version = _toml(PY / "Cargo.toml")["package"]["version"]
    if isinstance(version, dict):
        assert version == {"workspace": True}, version
        version = _toml(ROOT / "Cargo.toml")["workspace"]["package"]["version"]
    return version


def test_version_is_the_declared_one():
    assert isinstance(nodekernel.__version__, str)
    assert nodekernel.__version__ == importlib.metadata.version("nodekernel")
    # Compared as PEP 440 versions: maturin writes Cargo's SemVer in that
    # form (1.0.0-alpha.1 as 1.0.0a1).
    assert Version(nodekernel.__version__) == Version(_declared_version())


NO_METADATA = """
import importlib.metadata


def missing(name):
    raise importlib.metadata.PackageNotFoundError(name)


importlib.metadata.version = missing
import nodekernel

print(nodekernel.__version__)
"""


def test_version_without_package_metadata(tmp_path):
    """Imported from a source tree that was never installed, the package
    still imports, and says its version is unknown."""
    out = _ok(_python("-c", NO_METADATA, cwd=tmp_path))
    assert out.strip() == "0+unknown"
    assert Version(out.strip()) < Version("0.0.1")


# ---------------------------------------------------------------------------
# Type stubs


def _mypy(*args: str, cwd: pathlib.Path, cache: pathlib.Path) -> str:
    return _ok(_python("-m", "mypy", "--cache-dir", str(cache), *args, cwd=cwd))


def test_mypy_accepts_the_usage_example_and_the_package(tmp_path):
    """`mypy --strict` on typed_usage.py, which calls the whole public API
    (sync and asyncio clients and files, the batched calls, Table, errors,
    `nodekernel.aio`, `__version__`) and pins the type each call returns,
    and on the package's typed modules (the native module's are
    `_native.pyi`). fsspec.py follows fsspec's untyped API: it is checked
    without --strict, its calls into the native module against the stubs."""
    typed = [PACKAGE / m for m in ("__init__.py", "aio.py", "errors.py", "_future.py")]
    _mypy(
        "--strict",
        str(HERE / "typed_usage.py"),
        *map(str, typed),
        cwd=HERE,
        cache=tmp_path / "cache",
    )
    _mypy(
        "--check-untyped-defs",
        "--ignore-missing-imports",
        str(PACKAGE),
        cwd=tmp_path,
        cache=tmp_path / "cache2",
    )


# What stubtest reports that is not wrong (stubtest_expected.txt says why;
# scripts/wheel_smoke.py reads the same file). Every other report fails the
# test, these included once they change (an allowlist would hide anything
# else about a method).
STUBTEST_EXPECTED = {
    line
    for line in pathlib.Path(__file__).with_name("stubtest_expected.txt").read_text().splitlines()
    if line and not line.startswith("#")
}


def test_stubs_match_the_native_module(tmp_path):
    """stubtest compares _native.pyi with the built module: every function,
    class, method, property and parameter of one is in the other."""
    proc = _python(
        "-m",
        "mypy.stubtest",
        "--concise",
        # PEP 800's @disjoint_base is too new to ask of the stubs' readers.
        "--ignore-disjoint-bases",
        "nodekernel._native",
        cwd=tmp_path,
    )
    reports = set(proc.stdout.splitlines())
    assert reports == STUBTEST_EXPECTED, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )


def test_usage_example_runs(nk_dir, tmp_path):
    """What typed_usage.py's types say, the calls do."""
    _ok(run_script(HERE / "typed_usage.py", nk_dir, cwd=tmp_path))
