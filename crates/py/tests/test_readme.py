"""The README's Python examples run exactly as written: every ```python
block of its "## Python" section, each in a fresh interpreter against a
fresh cluster, as a user who copies it would run it (NK_META names the
cluster). Each runs as `__main__` and its interpreter must exit with
status 0: no exception, and no crash while Python finalizes (the PyArrow
block once aborted there; test_ecosystem.py has the test made for it)."""

from __future__ import annotations

import os
import re

import pytest

from conftest import HANG_S, ROOT, Cluster, run_script

README = ROOT / "README.md"
SECTION = "## Python"


def python_blocks() -> list[str]:
    """The ```python blocks of the README's Python section, in order."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n{SECTION}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    return re.findall(r"^```python\n(.*?)^```[ \t]*$", section, re.S | re.M)


BLOCKS = python_blocks()

# Blocks that cannot run as written, by index, with the reason. None now:
# every block of the section is meant to be copied and run.
SKIPPED: dict[int, str] = {}


def test_the_python_section_has_its_examples():
    # The sync client, asyncio, fsspec/pandas/PyArrow: finding fewer means
    # the section or its fences changed, and the tests below would shrink.
    assert len(BLOCKS) >= 3, BLOCKS
    assert any("nodekernel.connect(" in b for b in BLOCKS)
    assert any("nodekernel.aio.connect(" in b for b in BLOCKS)
    assert any("nk://" in b for b in BLOCKS)


@pytest.fixture
def fresh_cluster(tmp_path):
    """A cluster of its own (the examples use fixed paths such as /cache),
    and a client config whose wait only catches a hang."""
    c = Cluster(dram="256MiB")
    config = tmp_path / "client.toml"
    config.write_text(f"[client]\ntimeout_ms = {HANG_S * 1000}\n")
    yield c, str(config)
    c.stop()


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=lambda i: f"block{i + 1}")
def test_readme_python_block_runs_as_written(index, fresh_cluster, tmp_path):
    if index in SKIPPED:
        pytest.skip(SKIPPED[index])
    cluster, config = fresh_cluster
    script = tmp_path / f"readme_block{index + 1}.py"
    script.write_text(BLOCKS[index], encoding="utf-8")
    env = {**os.environ, "NK_META": cluster.meta, "NK_CONFIG": config}
    run_dir = tmp_path / "cwd"
    run_dir.mkdir()
    proc = run_script(script, cwd=run_dir, env=env)
    assert proc.returncode == 0, (
        f"README block {index + 1} exited {proc.returncode}:\n{BLOCKS[index]}\n"
        f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
