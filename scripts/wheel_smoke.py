"""The checks scripts/test-wheel.sh runs in the fresh virtualenv the wheel
was installed into, against the `nk up` cluster it started (NK_META).
The shell script copies this file out of the repository and runs it there,
so nothing of the checkout is on sys.path.

    python wheel_smoke.py package           the wheel's package, module and nk
    python wheel_smoke.py data WORKDIR      puts and gets, pandas over nk://
    python wheel_smoke.py status FILE       `nk status --json` output
    python wheel_smoke.py stubtest          the stubs match the module

Each failed check exits with "test-wheel: FAIL: ..." naming what was wrong.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import sysconfig
from typing import NoReturn


def fail(message: str) -> NoReturn:
    sys.exit(f"test-wheel: FAIL: {message}")


def check(ok: object, message: str) -> None:
    if not ok:
        fail(message)


def ok(message: str) -> None:
    print(f"  ok: {message}")


def under(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    return pathlib.Path(path).resolve().is_relative_to(pathlib.Path(folder).resolve())


def package() -> None:
    """The package, its native module and `nk` are the wheel's, installed in
    this environment, and nothing else provides them."""
    from importlib import metadata

    import nodekernel
    import nodekernel._native

    site = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    for mod in (nodekernel, nodekernel._native):
        where = mod.__file__ or ""
        check(
            any(under(where, s) for s in site),
            f"{mod.__name__} comes from {where}, not this virtualenv's site-packages {site}",
        )
    ok(
        f"nodekernel {nodekernel.__version__} imported from {pathlib.Path(nodekernel.__file__ or '').parent}"
    )
    dist = metadata.distribution("nodekernel")
    check(
        dist.version == nodekernel.__version__,
        f"installed version {dist.version} != nodekernel.__version__ {nodekernel.__version__}",
    )
    bin_dir = pathlib.Path(sysconfig.get_paths()["scripts"])
    nk = bin_dir / "nk"
    check(nk.is_file() and os.access(nk, os.X_OK), f"{nk} is missing or not executable")
    # The wheel installed it: its RECORD lists the file in bin/.
    recorded = [f for f in dist.files or [] if f.name == "nk"]
    check(
        any(pathlib.Path(str(dist.locate_file(f))).resolve() == nk.resolve() for f in recorded),
        f"{nk} is not in the nodekernel wheel's RECORD (it lists {[str(f) for f in recorded]})",
    )
    found = shutil.which("nk")
    check(
        found is not None and pathlib.Path(found).resolve() == nk.resolve(),
        f"`nk` on PATH is {found}, not the wheel's {nk}",
    )
    check(under(nk, sys.prefix), f"{nk} is outside the virtualenv {sys.prefix}")
    version = subprocess.run(
        [str(nk), "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    check(
        version == f"nk {dist.version}",
        f"`nk --version` says {version!r}, the wheel is {dist.version}",
    )
    ok(f"`nk` is the wheel's console script: {nk} ({version}), in its RECORD")


def data(work: pathlib.Path) -> None:
    """Puts and gets through the package: a Table of KeyValues and a File,
    byte for byte; a pandas DataFrame as Parquet on nk:// through fsspec."""
    import fsspec
    import pandas as pd

    import nodekernel

    meta = os.environ["NK_META"]
    rng = random.Random(45)

    def blob(n: int) -> bytes:
        return rng.randbytes(n)

    with nodekernel.connect() as nk:
        nk.mkdir("/smoke")
        # A Table of KeyValues: small ones (pieces of shared blocks) and one
        # larger than a block.
        table = nodekernel.Table(nk, "/smoke/table", create=True)
        values = {f"k{i}": blob(n) for i, n in enumerate([0, 1, 100, 4096, 65536, 3 << 20])}
        for k, v in values.items():
            table[k] = v
        for k, v in values.items():
            got = table[k]
            check(got == v, f"Table key {k}: read {len(got)} bytes, not the {len(v)} put")
        check(
            sorted(table) == sorted(values),
            f"Table keys {sorted(table)} != {sorted(values)}",
        )
        many = nk.get_many([f"/smoke/table/{k}" for k in values] + ["/smoke/table/missing"])
        check(
            many == [*values.values(), None],
            "get_many did not give the values put (and None for a missing key)",
        )
        ok(f"Table /smoke/table: {len(values)} KeyValues (0 B to 3 MiB) read back byte for byte")

        # A File written in several writes, spanning blocks; the shell reads
        # it again with `nk get` and compares it with expected.bin.
        content = blob((5 << 20) + 12345)
        with nk.open("/smoke/file.bin", "wb") as f:
            for i in range(0, len(content), 1 << 20):
                f.write(content[i : i + (1 << 20)])
        with nk.open("/smoke/file.bin") as f:
            got = f.read()
        check(
            got == content,
            f"File /smoke/file.bin: read {len(got)} bytes, not the {len(content)} written",
        )
        size = nk.stat("/smoke/file.bin")["size"]
        check(size == len(content), f"stat size {size} != {len(content)}")
        (work / "expected.bin").write_bytes(content)
        ok(f"File /smoke/file.bin: {len(content):,} bytes read back byte for byte")

    # pandas over fsspec: the `nk` protocol comes from the wheel's entry
    # point (no import of nodekernel.fsspec).
    check("nk" in fsspec.available_protocols(), "fsspec does not know the nk protocol")
    df = pd.DataFrame(
        {
            "key": [f"k{i % 7}" for i in range(10_000)],
            "n": range(10_000),
            "x": [i / 3 for i in range(10_000)],
        }
    )
    url = f"nk://{meta}/smoke/frames/part-0.parquet"
    df.to_parquet(url)
    back = pd.read_parquet(url)
    pd.testing.assert_frame_equal(back, df)
    back_dir = pd.read_parquet("nk:///smoke/frames/")
    pd.testing.assert_frame_equal(back_dir, df)
    fs = fsspec.filesystem("nk")
    listed = fs.ls("/smoke/frames", detail=False)
    check(listed == ["/smoke/frames/part-0.parquet"], f"fsspec ls /smoke/frames gave {listed}")
    ok(f"pandas DataFrame {df.shape} as Parquet on {url}: read back equal (file and folder)")


def status(path: pathlib.Path) -> None:
    """`nk status --json`: the one DRAM server nk up started is alive and
    exports what --dram asked."""
    try:
        out = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        fail(f"`nk status --json` is not JSON ({e}): {path.read_text()[:500]!r}")
    servers = out.get("servers")
    check(isinstance(servers, list) and servers, f"`nk status --json` lists no servers: {out}")
    dram = [s for s in servers if s.get("medium") == "dram"]
    check(len(dram) == 1, f"`nk status --json`: {len(dram)} DRAM servers, not 1: {servers}")
    check(dram[0].get("alive") is True, f"the DRAM server is not alive: {dram[0]}")
    want = int(os.environ["SMOKE_DRAM_BYTES"])
    check(
        dram[0].get("capacity_bytes") == want,
        f"the DRAM server exports {dram[0].get('capacity_bytes')} bytes, not the {want} asked",
    )
    ok(f"`nk status --json`: DRAM server {dram[0]['addr']} alive, {want} bytes")


# What stubtest reports that is not wrong: the file crates/py/tests/
# test_package.py reads too, copied beside this script by test-wheel.sh.
STUBTEST_EXPECTED = {
    line
    for line in pathlib.Path(__file__).with_name("stubtest_expected.txt").read_text().splitlines()
    if line and not line.startswith("#")
}


def stubtest() -> None:
    """The wheel's _native.pyi against the wheel's module."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy.stubtest",
            "--concise",
            "--ignore-disjoint-bases",
            "nodekernel._native",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    reports = set(proc.stdout.splitlines())
    check(
        reports == STUBTEST_EXPECTED,
        "stubtest: the stubs do not match the module:\n"
        + "\n".join(sorted(reports - STUBTEST_EXPECTED))
        + (
            f"\n(expected and missing: {sorted(STUBTEST_EXPECTED - reports)})"
            if STUBTEST_EXPECTED - reports
            else ""
        )
        + f"\nstderr: {proc.stderr}",
    )
    ok("stubtest: nodekernel/_native.pyi matches the module (only the known default-value notes)")


def main() -> None:
    what, *args = sys.argv[1:] or [""]
    if what == "package":
        package()
    elif what == "data":
        data(pathlib.Path(args[0]))
    elif what == "status":
        status(pathlib.Path(args[0]))
    elif what == "stubtest":
        stubtest()
    else:
        fail(f"wheel_smoke.py: unknown check {what!r} (package, data, status, stubtest)")


if __name__ == "__main__":
    main()
