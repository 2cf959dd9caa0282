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


# -- sessions -----------------------------------------------------------------


def test_what_a_session_binds_goes_when_it_closes(nk, nk_dir):
    t = table(nk, nk_dir)
    nk.put(f"{t}/keep", b"stays")
    with nk.session(lease=30) as s:
        assert s.lease == 30 and not s.ended
        nk.mkdir(f"{nk_dir}/job", session=s)
        with nk.open(f"{nk_dir}/job/part-0", "wb") as f:
            f.write(b"inside a bound directory")
        nk.put(f"{t}/bound", b"a bound value", session=s)
        with nk.open(f"{nk_dir}/bound-file", "wb", session=s) as f:
            f.write(b"bound too")
        assert nk.exists(f"{nk_dir}/job/part-0")
    assert s.ended
    for p in [f"{nk_dir}/job", f"{nk_dir}/job/part-0", f"{t}/bound", f"{nk_dir}/bound-file"]:
        assert not nk.exists(p), p
    assert nk.get(f"{t}/keep") == b"stays"
    # An ended session binds nothing more; closing it again is no error.
    with pytest.raises(NotFound):
        nk.mkdir(f"{nk_dir}/late", session=s)
    assert not nk.exists(f"{nk_dir}/late")
    s.close()


def test_a_session_binds_only_what_it_creates(nk, nk_dir):
    with nk.open(f"{nk_dir}/f", "wb") as f:
        f.write(b"x")
    with nk.session() as s:
        assert s.lease == 10
        with pytest.raises(ValueError):
            nk.open(f"{nk_dir}/f", "rb", session=s)
        with pytest.raises(ValueError):
            nk.open(f"{nk_dir}/f", "ab", session=s)
    assert nk.exists(f"{nk_dir}/f")
    with pytest.raises(ValueError):
        nk.session(lease=0)


KILLED = """
import sys, time, nodekernel
c = nodekernel.connect(sys.argv[1])
s = c.session(lease=3)
c.mkdir(sys.argv[2], session=s)
with c.open(sys.argv[2] + "/data", "wb") as f:
    f.write(b"held while the process lives")
print("ready", flush=True)
time.sleep(600)
"""


def test_a_killed_process_loses_its_bound_subtree_once_the_lease_lapses(
    nk, nk_meta, nk_dir, tmp_path
):
    import signal
    import subprocess
    import sys

    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    nk.mkdir(f"{nk_dir}/other")
    p = subprocess.Popen(
        [sys.executable, str(script), nk_meta, f"{nk_dir}/job"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout.readline().strip() == "ready"
        # Renewed while it lives: more than a lease passes and it stays.
        time.sleep(4)
        assert nk.exists(f"{nk_dir}/job/data")
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(HANG_S)
    wait_gone(nk, f"{nk_dir}/job")
    assert nk.exists(f"{nk_dir}/other")


def test_the_async_client_and_fsspec_offer_sessions(nk_meta, nk_dir):
    async def main():
        async with await nodekernel.aio.connect(nk_meta) as c:
            async with await c.session(lease=5) as s:
                await c.mkdir(f"{nk_dir}/a", session=s)
                assert await c.exists(f"{nk_dir}/a")
            assert not await c.exists(f"{nk_dir}/a")
            s2 = await c.session()
            await c.mkdir(f"{nk_dir}/b", session=s2)
            await s2.aclose()
            assert not await c.exists(f"{nk_dir}/b")

    asyncio.run(asyncio.wait_for(main(), HANG_S))

    fs = fsspec.filesystem("nk", meta=nk_meta, skip_instance_cache=True)
    with fs.session(lease=5) as s:
        fs.mkdir(f"{nk_dir}/job", session=s)
        fs.pipe_file(f"{nk_dir}/piped", b"bound", session=s)
        with fs.open(f"{nk_dir}/opened", "wb", session=s) as f:
            f.write(b"bound")
        fs.pipe_file(f"{nk_dir}/job/inside", b"goes with job")
        assert fs.exists(f"{nk_dir}/job/inside")
    for p in ["job", "piped", "opened"]:
        assert not fs.exists(f"{nk_dir}/{p}"), p
    with pytest.raises(ValueError):
        fs.open(f"{nk_dir}/x", "rb", session=s)
