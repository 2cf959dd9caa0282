#!/usr/bin/env python3
"""Builds the workspace's tests once and runs them in tiers (scripts/test.sh).

`cargo test` runs every test binary of the workspace in one go; naming a
subset to it compiles more (`-p`/`--exclude` resolve features anew, `--lib`
builds harnesses for libraries without tests). So the build is one `cargo
test --no-run`, which lists the executables it made, and the runs take them
from that list: the heavy tier runs the integration tests of the packages in
HEAVY (the cluster tests, which start whole clusters: about half of the
Rust tests' time), the core tier every other binary (unit tests included)
and the doc tests.

  scripts/cargo-tests.py build        cargo test --workspace --no-run
  scripts/cargo-tests.py run core     [-- ARGS]
  scripts/cargo-tests.py run heavy    [-- ARGS]

Each binary runs as `cargo test` runs it: in its package's directory (with
CARGO_MANIFEST_DIR and CARGO_PKG_NAME set), with the arguments given after
`--` (test filters, `--nocapture`). A failing binary does not stop the
others; the run fails at the end, naming them. Build and run with the same
CARGO_INCREMENTAL (scripts/test.sh sets 0), or the doc tests' `cargo test
--doc` compiles the workspace's libraries again.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "target" / "test-binaries.json"
# Packages whose integration tests (tests/) are the heavy tier's.
HEAVY = {"nodekernel-cluster"}


def build():
    cmd = ["cargo", "test", "--workspace", "--locked", "--no-run"]
    cmd += ["--message-format=json-render-diagnostics"]
    names = package_names()
    binaries = []
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True) as p:
        for line in p.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                print(line, end="")
                continue
            if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
                continue
            if not msg["profile"]["test"]:
                continue  # a binary the tests run (nk), not a test harness
            binaries.append(
                {
                    "package": names[msg["manifest_path"]],
                    "dir": str(Path(msg["manifest_path"]).parent),
                    "source": msg["target"]["src_path"],
                    "kind": msg["target"]["kind"],
                    "executable": msg["executable"],
                }
            )
    if p.returncode != 0:
        sys.exit(p.returncode)
    LIST.write_text(json.dumps(binaries, indent=1))
    print(f"{len(binaries)} test binaries, listed in {LIST.relative_to(ROOT)}")


def package_names():
    """Each workspace package's name by its manifest's path (package ids
    spell names in several ways across cargo versions)."""
    cmd = ["cargo", "metadata", "--no-deps", "--format-version", "1", "--locked"]
    meta = json.loads(subprocess.check_output(cmd, cwd=ROOT))
    return {p["manifest_path"]: p["name"] for p in meta["packages"]}


def is_heavy(b):
    return b["package"] in HEAVY and b["kind"] == ["test"]


def run(tier, extra):
    if not LIST.exists():
        sys.exit(f"cargo-tests: {LIST} missing; run `{sys.argv[0]} build` first")
    binaries = json.loads(LIST.read_text())
    chosen = [b for b in binaries if is_heavy(b) == (tier == "heavy")]
    if not chosen:
        sys.exit(f"cargo-tests: no test binaries in the {tier} tier")
    failed = []
    for b in chosen:
        rel = os.path.relpath(b["source"], ROOT)
        print(f"     Running {rel} ({os.path.relpath(b['executable'], ROOT)})", flush=True)
        t0 = time.monotonic()
        env = dict(os.environ, CARGO_MANIFEST_DIR=b["dir"], CARGO_PKG_NAME=b["package"])
        rc = subprocess.call([b["executable"], *extra], cwd=b["dir"], env=env)
        print(f"     ({rel}: {time.monotonic() - t0:.1f} s)", flush=True)
        if rc != 0:
            failed.append(rel)
    if tier == "core":
        # Doc tests: rustdoc compiles them as it runs them, against the
        # libraries the build above made.
        print("     Doc-tests (cargo test --doc)", flush=True)
        cmd = ["cargo", "test", "--workspace", "--locked", "--doc", "--", *extra]
        if subprocess.call(cmd, cwd=ROOT) != 0:
            failed.append("doc tests")
    if failed:
        sys.exit("cargo-tests: failed: " + ", ".join(failed))
    print(f"cargo-tests: {len(chosen)} binaries passed")


def main(argv):
    if argv[:1] == ["build"] and len(argv) == 1:
        return build()
    if len(argv) >= 2 and argv[0] == "run" and argv[1] in ("core", "heavy"):
        if argv[2:3] not in ([], ["--"]):
            sys.exit(__doc__)
        return run(argv[1], argv[3:])
    sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
