"""Quotas and disk usage through the Python client and fsspec
(docs/lifecycle.md): limits set and cleared, refusals as OSError EDQUOT that
leave nothing, and `du` from the metadata server's accounting."""

from __future__ import annotations

import asyncio
import errno

import fsspec
import pytest

import nodekernel
import nodekernel.aio
from nodekernel.errors import InvalidArgument, NotFound, QuotaExceeded, TypeMismatch


@pytest.fixture
def nk(nk_meta):
    with nodekernel.connect(nk_meta) as c:
        yield c


def test_du_counts_nodes_bytes_and_classes(nk, nk_dir):
    nk.mkdir(f"{nk_dir}/a")
    nk.mkdir(f"{nk_dir}/t", type="table")
    with nk.create(f"{nk_dir}/a/f") as f:
        f.write(b"x" * 1000)
    nk.put(f"{nk_dir}/t/k", b"hello")
    u = nk.du(nk_dir)
    assert u["path"] == nk_dir
    assert u["type"] == "dir"
    # a, t, a/f, t/k
    assert u["nodes"] == 4
    assert u["bytes"] == 1005
    held = (
        sum(c["piece_bytes"] for c in u["classes"])
        + sum(c["blocks"] for c in u["classes"]) * nk.status()["block_size"]
    )
    assert u["stored"] == held > 0
    assert all({"class", "blocks", "piece_bytes"} <= c.keys() for c in u["classes"])
    assert u["quota"] is None
    # A data node: itself.
    f = nk.du(f"{nk_dir}/a/f")
    assert (f["type"], f["nodes"], f["bytes"]) == ("file", 1, 1000)
    with pytest.raises(NotFound):
        nk.du(f"{nk_dir}/none")


def test_a_quota_refuses_growth_with_edquot_and_leaves_nothing(nk, nk_dir):
    q = f"{nk_dir}/q"
    nk.mkdir(q)
    u = nk.set_quota(q, nodes=2)
    assert u["quota"] == {"bytes": None, "nodes": 2}
    assert nk.quota(q) == {"bytes": None, "nodes": 2}
    nk.mkdir(f"{q}/a")
    nk.mkdir(f"{q}/b")
    with pytest.raises(QuotaExceeded) as e:
        nk.mkdir(f"{q}/c")
    assert isinstance(e.value, OSError)
    assert e.value.errno == errno.EDQUOT
    assert f"{q}: its quota of 2 nodes" in str(e.value)
    assert not nk.exists(f"{q}/c")
    # A byte limit: a put past it is refused and leaves no value.
    nk.set_quota(q, bytes=1 << 20)
    assert nk.quota(q) == {"bytes": 1 << 20, "nodes": None}
    nk.mkdir(f"{q}/t", type="table")
    with pytest.raises(OSError) as e:
        nk.put(f"{q}/t/big", b"\0" * (3 << 20))
    assert e.value.errno == errno.EDQUOT
    assert not nk.exists(f"{q}/t/big")
    nk.put(f"{q}/t/small", b"fits")
    listed = [x for x in nk.quotas() if x["path"] == q]
    assert len(listed) == 1 and listed[0]["nodes"] == 4
    # Both None clears it.
    nk.set_quota(q)
    assert nk.quota(q) is None
    assert all(x["path"] != q for x in nk.quotas())
    nk.put(f"{q}/t/big", b"\0" * (3 << 20))


def test_only_containers_carry_quotas(nk, nk_dir):
    with nk.create(f"{nk_dir}/f") as f:
        f.write(b"1")
    with pytest.raises(TypeMismatch):
        nk.set_quota(f"{nk_dir}/f", nodes=1)
    with pytest.raises(InvalidArgument):
        nk.set_quota(nk_dir, nodes=2**64 - 1)
    with pytest.raises(OverflowError):
        nk.set_quota(nk_dir, nodes=-1)


def test_the_async_client_sets_and_reads_quotas(nk_meta, nk_dir):
    async def main():
        async with await nodekernel.aio.connect(nk_meta) as c:
            await c.set_quota(nk_dir, bytes=1 << 30, nodes=100)
            await c.mkdir(f"{nk_dir}/x")
            u = await c.du(nk_dir)
            assert (u["nodes"], u["quota"]) == (1, {"bytes": 1 << 30, "nodes": 100})
            assert await c.quota(nk_dir) == {"bytes": 1 << 30, "nodes": 100}
            assert any(x["path"] == nk_dir for x in await c.quotas())
            await c.set_quota(nk_dir)

    asyncio.run(main())


def test_fsspec_du_totals_from_the_accounting(nk_meta, nk_dir):
    fs = fsspec.filesystem("nk", meta=nk_meta)
    fs.makedirs(f"{nk_dir}/d/e")
    fs.pipe_file(f"{nk_dir}/d/a", b"a" * 10)
    fs.pipe_file(f"{nk_dir}/d/e/b", b"b" * 20)
    fs.pipe_file(f"{nk_dir}/top", b"c" * 5)
    assert fs.du(nk_dir) == 35
    assert fs.du(f"{nk_dir}/d") == 30
    assert fs.du(f"{nk_dir}/top") == 5
    assert fs.du(f"{nk_dir}/missing") == 0
    # A relative path names the same node.
    assert fs.du(nk_dir.lstrip("/")) == 35
    # The walk fsspec itself does agrees.
    sizes = fs.du(nk_dir, total=False)
    assert sizes == {
        f"{nk_dir}/d/a": 10,
        f"{nk_dir}/d/e/b": 20,
        f"{nk_dir}/top": 5,
    }
    assert sum(sizes.values()) == fs.du(nk_dir)
    assert fs.du(nk_dir, maxdepth=1) == 5
    assert fs.du(nk_dir, withdirs=True) == 35


def test_a_streamed_put_refused_by_a_quota_leaves_no_unclosed_put(nk, nk_dir):
    q = f"{nk_dir}/q"
    nk.mkdir(q)
    nk.set_quota(q, bytes=1 << 20)
    nk.mkdir(f"{q}/t", type="table")
    before = nk.du(q)
    with pytest.raises(QuotaExceeded):
        with nk.create(f"{q}/t/streamed", "kv") as w:
            for _ in range(3):
                w.write(b"\1" * (1 << 20))
    assert not nk.exists(f"{q}/t/streamed")
    # The with block's abort has returned: the put is dropped by then.
    assert nk.du(q)["nodes"] == before["nodes"]
