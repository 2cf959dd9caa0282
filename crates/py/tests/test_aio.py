"""The asyncio API: same methods as the sync client, many calls in flight
from one loop, cancellation leaves the client usable."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

import nodekernel
import nodekernel.aio

HANG_TIMEOUT_S = 120  # only catches hangs


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, HANG_TIMEOUT_S))


def test_hundred_concurrent_gets_from_one_loop(nk_meta, nk_dir):
    async def main():
        async with await nodekernel.aio.connect(nk_meta) as c:
            t = f"{nk_dir}/t"
            await c.mkdir(t, type="table")
            values = {f"k{i}": os.urandom(100 + i) for i in range(100)}
            await asyncio.gather(*(c.put(f"{t}/{k}", v) for k, v in values.items()))
            got = await asyncio.gather(*(c.get(f"{t}/{k}") for k in values))
            assert got == list(values.values())
            assert sorted(await c.ls(t)) == sorted(values)

    run(main())


def test_every_method_and_files(nk_meta, nk_dir):
    async def main():
        c = await nodekernel.aio.connect(nk_meta)
        await c.mkdir(f"{nk_dir}/a/b", parents=True)
        await c.mkdir(f"{nk_dir}/t", type="table")
        await c.mkdir(f"{nk_dir}/bag", type="bag")
        f = await c.create(f"{nk_dir}/a/b/f")
        assert isinstance(f, nodekernel.AsyncFile)
        await f.write(b"hello ")
        await f.write(bytearray(b"world"))
        await f.flush()
        await f.close()
        async with await c.open(f"{nk_dir}/a/b/f") as r:
            assert r.size == 11
            assert await r.read(5) == b"hello"
            r.seek(6)
            buf = np.zeros(5, dtype=np.uint8)
            assert await r.readinto(buf) == 5
            assert buf.tobytes() == b"world"
        st = await c.stat(f"{nk_dir}/a/b/f")
        assert st["type"] == "file" and st["size"] == 11
        assert await c.exists(f"{nk_dir}/a") and not await c.exists(f"{nk_dir}/nope")
        await c.move(f"{nk_dir}/a/b/f", f"{nk_dir}/a/g")
        assert await c.get(f"{nk_dir}/a/g") == b"hello world"
        mv = memoryview(bytearray(20))
        assert await c.get_into(f"{nk_dir}/a/g", mv) == 11
        await c.put(f"{nk_dir}/t/k", b"v")
        h = await c.lookup(f"{nk_dir}/t/k")
        assert await h.read() == b"v"
        await c.delete(f"{nk_dir}/a", recursive=True)
        assert not await c.exists(f"{nk_dir}/a")
        assert (await c.status())["ready"]
        with pytest.raises(nodekernel.NotFound):
            await c.get(f"{nk_dir}/t/missing")
        await c.close()
        with pytest.raises(ValueError, match="closed"):
            await c.get(f"{nk_dir}/t/k")

    run(main())


def test_cancelled_calls_leave_the_client_usable(nk_meta, nk_dir):
    async def main():
        c = await nodekernel.aio.connect(nk_meta)
        t = f"{nk_dir}/t"
        await c.mkdir(t, type="table")
        big = os.urandom(4 << 20)
        await c.put(f"{t}/big", big)
        for _ in range(20):
            tasks = [asyncio.ensure_future(c.get(f"{t}/big")) for _ in range(8)]
            await asyncio.sleep(0)
            for task in tasks[::2]:
                task.cancel()
            done = await asyncio.gather(*tasks, return_exceptions=True)
            for i, r in enumerate(done):
                if i % 2 == 0:
                    assert isinstance(r, (asyncio.CancelledError, bytes))
                else:
                    assert r == big
        # wait_for timeouts cancel too.
        for _ in range(10):
            try:
                await asyncio.wait_for(c.get(f"{t}/big"), 0.0001)
            except asyncio.TimeoutError:
                pass
        assert await c.get(f"{t}/big") == big
        await c.put(f"{t}/k", b"after")
        assert await c.get(f"{t}/k") == b"after"

    run(main())


def test_opens_for_writing_of_one_path_at_once_each_replace_it(nk_meta, nk_dir):
    """open(path, "wb") replaces an existing File. Several at once (other
    processes, or a cancelled open that runs to its end) each replace it in
    turn: a writer whose File another replaced finds its handle Stale, but
    no open fails with NotFound because another deleted the File between
    its lookup and its delete, and the value left is one writer's, whole."""

    async def main():
        async with await nodekernel.aio.connect(nk_meta) as c:
            path = f"{nk_dir}/f"
            async with await c.open(path, "wb") as f:
                await f.write(b"first")

            async def write(i):
                async with await c.open(path, "wb") as f:
                    await f.write(bytes([i]) * 1000)

            values = {bytes([i]) * 1000 for i in range(8)}
            for _ in range(25):
                results = await asyncio.gather(
                    *(write(i) for i in range(8)), return_exceptions=True
                )
                failed = [
                    r
                    for r in results
                    if r is not None and not isinstance(r, nodekernel.errors.Stale)
                ]
                assert not failed, failed
                assert await c.get(path) in values

    run(main())
