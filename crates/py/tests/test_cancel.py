"""Cancellation of asyncio calls at random points (asyncio.wait_for with
tiny timeouts): once the CancelledError (or TimeoutError) reaches the
caller, nothing touches the caller's buffer any more, and a cancelled put
or File write gives its space back at once, not when the sweeper finds it."""

from __future__ import annotations

import asyncio
import errno
import gc
import random

import pytest

import nodekernel
import nodekernel.aio
from conftest import run_script, used, wait_for_baseline

HANG_TIMEOUT_S = 300  # only catches hangs
# A few timeouts around the length of one call: some cancel it before it
# starts, some in the middle, some too late.
TINY_TIMEOUTS = (0, 0.00005, 0.0002, 0.0005, 0.001, 0.002, 0.004, 0.008)
# How long the test watches a buffer after a cancellation.
WATCH_S = 0.05


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, HANG_TIMEOUT_S))


async def cancel_at_random(rng, call):
    """Awaits `call` under a tiny timeout; True if it was cancelled."""
    try:
        await asyncio.wait_for(call, rng.choice(TINY_TIMEOUTS))
        return False
    except asyncio.TimeoutError:
        return True


def still_held(buf) -> bool:
    """Whether a call still holds `buf` (a bytearray cannot be resized
    while exported)."""
    try:
        buf.extend(b"x")
    except BufferError:
        return True
    del buf[-1]
    return False


async def count_late_writes(c, scratch, rng, buf, make_call, calls=200):
    """Cancels `calls` reads into `buf` at random points while other calls
    keep the client's runtime busy (so a cancelled read that has not
    stopped gets to run after its caller moved on). After each
    cancellation checks that `buf` is free, zeroes it and watches it.
    Returns (cancelled, still held, changed afterwards)."""
    await c.mkdir(scratch, type="table")
    await c.put(f"{scratch}/v", b"\x01" * (8 << 20))
    running = True

    async def load():
        while running:
            await c.get(f"{scratch}/v")

    loads = [asyncio.ensure_future(load()) for _ in range(16)]
    zeros = bytes(len(buf))
    cancelled = held = changed = 0
    try:
        for _ in range(calls):
            if not await cancel_at_random(rng, make_call()):
                continue
            cancelled += 1
            held += still_held(buf)
            buf[:] = zeros
            await asyncio.sleep(WATCH_S)
            if buf != zeros:
                changed += 1
    finally:
        running = False
        await asyncio.gather(*loads)
    return cancelled, held, changed


def test_a_cancelled_get_into_never_writes_into_the_buffer_afterwards(nk_meta, nk_dir):
    async def main():
        async with await nodekernel.aio.connect(nk_meta) as c:
            await c.mkdir(f"{nk_dir}/t", type="table")
            path = f"{nk_dir}/t/big"
            await c.put(path, b"\xa5" * (32 << 20))
            buf = bytearray(32 << 20)
            cancelled, held, changed = await count_late_writes(
                c, f"{nk_dir}/load", random.Random(4), buf, lambda: c.get_into(path, buf)
            )
            assert cancelled > 0, "no call was cancelled: the test proves nothing"
            assert (held, changed) == (0, 0), (
                f"of {cancelled} cancelled get_into, {held} still held the buffer "
                f"and {changed} wrote into it afterwards"
            )
            assert await c.get_into(path, buf) == 32 << 20
            assert buf == b"\xa5" * (32 << 20)

    run(main())


def test_a_cancelled_readinto_never_writes_into_the_buffer_afterwards(nk_meta, nk_dir):
    async def main():
        async with await nodekernel.aio.connect(nk_meta) as c:
            path = f"{nk_dir}/f"
            async with await c.open(path, "wb") as f:
                await f.write(b"\x5a" * (32 << 20))
            buf = bytearray(32 << 20)
            async with await c.open(path) as f:

                def read():
                    f.seek(0)
                    return f.readinto(buf)

                cancelled, held, changed = await count_late_writes(
                    c, f"{nk_dir}/load", random.Random(6), buf, read
                )
                assert cancelled > 0, "no call was cancelled: the test proves nothing"
                assert (held, changed) == (0, 0), (
                    f"of {cancelled} cancelled readinto, {held} still held the buffer "
                    f"and {changed} wrote into it afterwards"
                )
                f.seek(0)
                assert await f.readinto(buf) == 32 << 20
                assert buf == b"\x5a" * (32 << 20)

    run(main())


async def writers_baseline(c) -> int:
    """Makes the table /t and writes and deletes /t/kv and /f once, so the
    containers hold the blocks their child records take; returns the bytes
    used then, which every later test of space compares with."""
    await c.mkdir("/t", type="table")
    for path in ("/t/kv", "/f"):
        async with await c.open(path, "wb") as f:
            await f.write(b"x")
        await c.delete(path)
    return used(await c.status())


def test_cancelled_puts_give_their_space_back_at_once(small_cluster):
    async def main():
        async with await nodekernel.aio.connect(small_cluster.meta) as c:
            await c.mkdir("/t", type="table")
            # Containers keep the pieces and blocks their child records
            # took: those of 50 keys at once.
            for i in range(50):
                await c.put(f"/t/k{i}", b"x")
            for i in range(50):
                await c.delete(f"/t/k{i}")
            baseline = used(await c.status())
            rng = random.Random(8)
            value = b"\x11" * (1 << 20)
            cancelled = 0
            for i in range(1000):
                cancelled += await cancel_at_random(rng, c.put(f"/t/k{i % 50}", value))
            assert cancelled > 0, "no put was cancelled: the test proves nothing"
            # Puts that finished before their timeout are values: drop them.
            for k in await c.ls("/t"):
                await c.delete(f"/t/{k}")
            await wait_for_baseline(c, baseline)
            # The space is there: a small put and one of most of the cluster.
            await c.put("/t/small", b"hello world")
            await c.put("/t/large", b"\x22" * (80 << 20))
            assert await c.get("/t/small") == b"hello world"

    run(main())


def test_a_cancelled_file_write_poisons_the_file_and_frees_its_space(small_cluster):
    """A cancelled `AsyncFile.write` aborts the writer: later writes raise,
    `close` raises too (nothing more was published), `abort` is quiet, and
    the unpublished blocks are freed at once; a File keeps what its last
    flush published, a KeyValue written in steps leaves no value."""

    async def main():
        async with await nodekernel.aio.connect(small_cluster.meta) as c:
            baseline = await writers_baseline(c)
            rng = random.Random(10)
            data = b"\x33" * (16 << 20)
            cancelled = 0
            for i in range(60):
                path = "/t/kv" if i % 2 else "/f"
                f = await c.open(path, "wb")
                await f.write(b"published")
                await f.flush()
                if not await cancel_at_random(rng, f.write(data)):
                    await f.abort()
                    continue
                cancelled += 1
                with pytest.raises(OSError) as e:
                    await f.write(b"more")
                assert e.value.errno == errno.ECANCELED
                assert "cancelled" in str(e.value)
                with pytest.raises(OSError, match="cancelled"):
                    await f.flush()
                if i % 3 == 0:
                    with pytest.raises(OSError, match="cancelled"):
                        await f.close()
                elif i % 3 == 1:
                    await f.abort()
                else:
                    del f  # dropped unclosed: nothing more to do
                    gc.collect()
                if path == "/f":
                    assert await c.get("/f") == b"published"
                else:
                    # The first step's flush published nothing: a put in
                    # steps is all or nothing.
                    assert not await c.exists("/t/kv")
            assert cancelled > 0, "no write was cancelled: the test proves nothing"
            await c.delete("/f")
            await wait_for_baseline(c, baseline)
            await c.put("/t/large", b"\x22" * (80 << 20))

    run(main())


def test_cancelled_opens_and_closes_of_writers_hold_nothing(small_cluster):
    """Opening a writer and closing it run to their end even if cancelled:
    a writer opened for a cancelled call is closed (a put in steps:
    aborted) when dropped, a cancelled close still publishes. Nothing is
    left holding space or a lease for the sweep."""

    async def main():
        async with await nodekernel.aio.connect(small_cluster.meta) as c:
            baseline = await writers_baseline(c)
            rng = random.Random(12)
            data = b"\x44" * (4 << 20)
            cancelled = 0
            for i in range(300):
                path = "/t/kv" if i % 2 else "/f"
                try:
                    f = await asyncio.wait_for(c.open(path, "wb"), rng.choice(TINY_TIMEOUTS))
                except asyncio.TimeoutError:
                    cancelled += 1
                    continue
                await f.write(data)
                if await cancel_at_random(rng, f.close()):
                    cancelled += 1
                    del f
                    gc.collect()
            assert cancelled > 0, "nothing was cancelled: the test proves nothing"
            # Every value is whole or absent (a File: empty, if its open was
            # cancelled); no lease is left behind.
            for path in ("/t/kv", "/f"):
                if await c.exists(path):
                    assert await c.get(path) in (b"", data)
                async with await c.open(path, "wb") as f:
                    await f.write(b"y")
                await c.delete(path)
            await wait_for_baseline(c, baseline)
            await c.put("/t/large", b"\x22" * (80 << 20))

    run(main())


def test_a_cancelled_open_never_replaces_what_a_later_open_wrote(cluster):
    """A cancelled `open(path, "wb")` runs to its end, and its
    CancelledError comes only then: the next open of the same path, started
    right after the TimeoutError, is never replaced by the cancelled one
    finishing late (its close used to fail with Stale, or its bytes were
    gone)."""

    async def main():
        async with await nodekernel.aio.connect(cluster.meta) as c:
            rng = random.Random(7)
            cancelled = 0
            for i in range(200):
                data = b"v%d" % i
                try:
                    f = await asyncio.wait_for(
                        c.open("/cancel-race", "wb"), rng.choice(TINY_TIMEOUTS[:3])
                    )
                    await f.close()
                    continue
                except asyncio.TimeoutError:
                    cancelled += 1
                async with await c.open("/cancel-race", "wb") as f:
                    await f.write(data)
                assert await c.get("/cancel-race") == data
            assert cancelled > 0, "nothing was cancelled: the test proves nothing"

    run(main())


EXIT_SCRIPT = """
import asyncio, sys
import nodekernel

async def main():
    async with await nodekernel.aio.connect(sys.argv[1]) as c:
        await c.put(sys.argv[2], b"x" * 1000)
        # Many calls end at once, so results are being handed to the loop
        # while the script ends.
        await asyncio.gather(*(c.get(sys.argv[2]) for _ in range(64)))
        for _ in range(16):
            asyncio.ensure_future(c.exists(sys.argv[2]))

asyncio.run(main())
"""


def test_a_script_using_asyncio_exits_cleanly(cluster, tmp_path):
    """Interpreter exit while the native runtime's threads still hand
    results to the event loop: the process ends with status 0, never a
    crash (a thread taking the GIL while Python finalized used to abort or
    crash a few percent of such runs)."""
    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    with nodekernel.connect(cluster.meta) as c:
        c.mkdir("/exit", type="table")
    for i in range(40):
        proc = run_script(script, cluster.meta, f"/exit/k{i}", cwd=tmp_path)
        assert proc.returncode == 0, (i, proc.returncode, proc.stderr[-2000:])
