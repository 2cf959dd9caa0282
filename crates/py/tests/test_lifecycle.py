"""TTLs from Python and fsspec (docs/lifecycle.md): given at create, put,
open and mkdir, changed with expire, shown by stat, and honoured: an
expired node is gone as if deleted. (When exactly a node expires is the
metadata server's state machine's business, tested there with an injected
clock; these tests wait, with a timeout that only catches a hang.)"""

from __future__ import annotations

import asyncio
import datetime
import time

import fsspec
import pytest

import nodekernel
import nodekernel.aio
from nodekernel.errors import InvalidArgument, NotFound

HANG_S = 60


@pytest.fixture
def nk(nk_meta):
    with nodekernel.connect(nk_meta) as c:
        yield c


def wait_gone(c, path: str) -> None:
    deadline = time.monotonic() + HANG_S
    while c.exists(path):
        assert time.monotonic() < deadline, f"{path} never expired"
        time.sleep(0.05)


def table(c, nk_dir: str) -> str:
    """A Table under the test's Directory: KeyValues live in Tables."""
    t = f"{nk_dir}/t"
    c.mkdir(t, type="table")
    return t


def test_ttls_given_at_create_are_shown_and_honoured(nk, nk_dir):
    t = table(nk, nk_dir)
    before = time.time()
    nk.put(f"{t}/v", b"x", ttl=3600)
    st = nk.stat(f"{t}/v")
    # About an hour from now (the server's clock, milliseconds).
    assert before + 3590 < st["expires"] < time.time() + 3610
    assert st["child_ttl"] is None

    nk.put(f"{t}/short", b"y", ttl=datetime.timedelta(milliseconds=200))
    with nk.open(f"{nk_dir}/f", "wb", ttl=0.2) as f:
        f.write(b"file bytes")
    nk.mkdir(f"{nk_dir}/d", ttl=0.2)
    with nk.open(f"{nk_dir}/d/inside", "wb") as f:
        f.write(b"z")
    wait_gone(nk, f"{t}/short")
    wait_gone(nk, f"{nk_dir}/f")
    # A directory goes with its subtree.
    wait_gone(nk, f"{nk_dir}/d")
    with pytest.raises(NotFound):
        nk.open(f"{nk_dir}/d/inside", "rb")
    # The long-lived value is still there.
    assert nk.get(f"{t}/v") == b"x"


def test_expire_changes_and_clears_a_ttl(nk, nk_dir):
    v = f"{table(nk, nk_dir)}/v"
    nk.put(v, b"x")
    assert nk.stat(v)["expires"] is None
    st = nk.expire(v, 3600)
    assert st["expires"] is not None
    assert nk.expire(v, "never")["expires"] is None
    nk.expire(v, 0.1)
    wait_gone(nk, v)


def test_child_ttls_are_inherited_unless_a_create_says_never(nk, nk_dir):
    nk.mkdir(f"{nk_dir}/t", type="table", child_ttl=0.2)
    assert nk.stat(f"{nk_dir}/t")["child_ttl"] == pytest.approx(0.2)
    nk.put(f"{nk_dir}/t/k", b"goes")
    nk.put(f"{nk_dir}/t/keep", b"stays", ttl="never")
    wait_gone(nk, f"{nk_dir}/t/k")
    assert nk.get(f"{nk_dir}/t/keep") == b"stays"
    assert nk.stat(f"{nk_dir}/t/keep")["expires"] is None
    assert nk.set_child_ttl(f"{nk_dir}/t", None)["child_ttl"] is None
    nk.put(f"{nk_dir}/t/later", b"stays too")
    assert nk.stat(f"{nk_dir}/t/later")["expires"] is None


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), float("inf"), "soon", 10**12])
def test_bad_ttls_raise_before_anything_is_made(nk, nk_dir, ttl):
    v = f"{table(nk, nk_dir)}/v"
    with pytest.raises((ValueError, TypeError)):
        nk.put(v, b"x", ttl=ttl)
    assert not nk.exists(v)
    with pytest.raises((ValueError, TypeError)):
        nk.mkdir(f"{nk_dir}/d", child_ttl=ttl)
    assert not nk.exists(f"{nk_dir}/d")


def test_a_ttl_on_a_reader_is_refused(nk, nk_dir):
    with nk.open(f"{nk_dir}/f", "wb") as f:
        f.write(b"x")
    with pytest.raises(ValueError):
        nk.open(f"{nk_dir}/f", "rb", ttl=10)


def test_a_child_ttl_on_a_data_node_is_the_servers_error(nk, nk_dir):
    v = f"{table(nk, nk_dir)}/v"
    nk.put(v, b"x")
    with pytest.raises(InvalidArgument):
        nk.set_child_ttl(v, 10)


def test_the_async_client_takes_the_same_ttls(nk_meta, nk_dir):
    async def main():
        async with await nodekernel.aio.connect(nk_meta) as c:
            await c.mkdir(f"{nk_dir}/d", type="table", child_ttl=60)
            assert (await c.stat(f"{nk_dir}/d"))["child_ttl"] == 60
            await c.put(f"{nk_dir}/d/a", b"x", ttl=3600)
            assert (await c.stat(f"{nk_dir}/d/a"))["expires"] is not None
            assert (await c.expire(f"{nk_dir}/d/a", "never"))["expires"] is None

    asyncio.run(asyncio.wait_for(main(), HANG_S))


def test_fsspec_passes_ttls_through_its_kwargs(nk_meta, nk_dir):
    fs = fsspec.filesystem("nk", meta=nk_meta, skip_instance_cache=True)
    fs.pipe_file(f"{nk_dir}/p", b"piped", ttl=3600)
    info = fs.info(f"{nk_dir}/p")
    assert info["expires"] is not None and info["child_ttl"] is None
    with fs.open(f"{nk_dir}/o", "wb", ttl=0.2) as f:
        f.write(b"opened")
    fs.mkdir(f"{nk_dir}/d", child_ttl=3600)
    assert fs.info(f"{nk_dir}/d")["child_ttl"] == 3600
    fs.pipe_file(f"{nk_dir}/d/x", b"inherits")
    assert fs.info(f"{nk_dir}/d/x")["expires"] is not None
    assert fs.expire(f"{nk_dir}/p", "never")["expires"] is None
    with pytest.raises(ValueError):
        fs.open(f"{nk_dir}/p", "rb", ttl=1)
    c = nodekernel.connect(nk_meta)
    try:
        wait_gone(c, f"{nk_dir}/o")
    finally:
        c.close()
