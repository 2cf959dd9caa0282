"""Bad input from Python raises a clear exception; nothing crashes the
interpreter."""

from __future__ import annotations

import asyncio
import os
import pickle

import numpy as np
import pytest

import nodekernel
import nodekernel.aio
from conftest import Cluster


@pytest.fixture
def nk(nk_meta):
    with nodekernel.connect(nk_meta) as c:
        yield c


def test_wrong_types(nk, nk_dir):
    t = f"{nk_dir}/t"
    nk.mkdir(t, type="table")
    with pytest.raises(TypeError, match="bytes-like"):
        nk.put(f"{t}/k", "a str is not bytes")
    with pytest.raises(TypeError, match="bytes-like"):
        nk.put(f"{t}/k", 12)
    with pytest.raises(TypeError):
        nk.put(f"{t}/k", None)
    with pytest.raises(TypeError):
        nk.get(b"/bytes/path")
    with pytest.raises(TypeError):
        nk.mkdir(42)
    with pytest.raises(ValueError, match="type must be one of"):
        nk.mkdir(f"{nk_dir}/x", type="folder")
    with pytest.raises(ValueError, match="type must be one of"):
        nk.create(f"{nk_dir}/x", type="dir")
    with pytest.raises(ValueError, match="mode"):
        nk.open(f"{nk_dir}/x", "r+")
    with pytest.raises(ValueError, match="mode"):
        nk.open(f"{nk_dir}/x", "rt")
    nk.put(f"{t}/k", b"value")
    with pytest.raises(TypeError, match="read-only"):
        nk.get_into(f"{t}/k", b"immutable bytes!")
    with pytest.raises(TypeError, match="writable buffer"):
        nk.get_into(f"{t}/k", [0] * 10)
    with pytest.raises(ValueError, match="room for 2"):
        nk.get_into(f"{t}/k", bytearray(2))
    with pytest.raises(ValueError, match="contiguous"):
        nk.get_into(f"{t}/k", np.zeros((10, 10), dtype=np.uint8)[:, 0])
    with pytest.raises(ValueError, match="NUL"):
        nk.get(f"{t}/k\0evil")
    with pytest.raises(TypeError):
        pickle.dumps(nk)


def test_negative_and_huge_offsets(nk, nk_dir):
    p = f"{nk_dir}/f"
    with nk.open(p, "wb") as f:
        f.write(b"0123456789")
        with pytest.raises(OSError, match="not seekable"):
            f.seek(0)
        with pytest.raises(OSError, match="does not support reading"):
            f.read()
    with nk.open(p) as f:
        with pytest.raises(ValueError, match="negative seek"):
            f.seek(-1)
        with pytest.raises(ValueError, match="negative seek"):
            f.seek(-11, 2)
        with pytest.raises(ValueError, match="whence"):
            f.seek(0, 3)
        with pytest.raises(OverflowError):
            f.seek(1 << 70)
        assert f.seek(1 << 40) == 1 << 40
        assert f.read() == b""  # past the end reads nothing
        assert f.read(-5) == b""
        f.seek(8)
        assert f.read(-1) == b"89"
        with pytest.raises(OSError, match="does not support writing"):
            f.write(b"x")


def test_closed_files_and_clients(nk_meta, nk_dir):
    c = nodekernel.connect(nk_meta)
    p = f"{nk_dir}/f"
    f = c.open(p, "wb")
    f.write(b"abc")
    f.close()
    for op in (lambda: f.write(b"x"), f.tell, f.flush, lambda: f.seek(0)):
        with pytest.raises(ValueError, match="closed file"):
            op()
    r = c.open(p)
    r.close()
    with pytest.raises(ValueError, match="closed file"):
        r.read()
    with pytest.raises(ValueError, match="closed file"):
        r.readinto(bytearray(3))
    c.close()
    assert c.closed
    with pytest.raises(ValueError, match="client is closed"):
        c.get(p)
    with pytest.raises(ValueError, match="client is closed"):
        c.open(p)


def test_client_used_after_the_cluster_stopped(short_wait_config):
    cluster = Cluster(dram="64MiB")
    try:
        c = nodekernel.connect(cluster.meta)
        c.mkdir("/t", type="table")
        c.put("/t/k", b"v")
        f = c.open("/t/k")
    finally:
        cluster.stop()
    for op in (lambda: c.get("/t/k"), lambda: c.put("/t/k", b"w"), c.status, f.read):
        with pytest.raises(nodekernel.Error) as e:
            op()
        assert isinstance(e.value, OSError), e.value

    async def aio():
        with pytest.raises(nodekernel.Error):
            await nodekernel.aio.connect(cluster.meta, config=short_wait_config)

    asyncio.run(asyncio.wait_for(aio(), 120))


def test_bad_meta_addresses():
    with pytest.raises(ValueError):
        nodekernel.connect(" , ")
    # A malformed address is said at once, not waited for as a cluster
    # that is starting.
    with pytest.raises(nodekernel.errors.InvalidArgument):
        nodekernel.connect("not-an-address")
    with pytest.raises(ValueError):
        nodekernel.connect(config="/nonexistent/nk.toml")


def test_client_from_before_a_fork_refuses_in_the_child(nk):
    nk.status()
    pid = os.fork()
    if pid == 0:  # the child: must raise, not hang or crash
        code = 1
        try:
            nk.status()
        except RuntimeError as e:
            code = 0 if "another process" in str(e) else 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
