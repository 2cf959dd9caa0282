"""Batched calls: put_many, get_many and delete_many, sync and asyncio.

Every item is answered as its single call would be, in the order given; a
failing key fails alone (BatchError lists it, the others are done); bad
arguments fail before anything is done; a cancelled put_many leaves
nothing of the puts it had in flight."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

import nodekernel
import nodekernel.aio
from conftest import used, wait_for_baseline
from nodekernel.errors import BatchError, InvalidArgument, InvalidPath, NotFound, TypeMismatch

HANG_S = 300  # only catches hangs
MAX_ITEMS = 1 << 16


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, HANG_S))


def values(n: int, size: int = 100) -> list[bytes]:
    rng = random.Random(n * 7919 + size)
    return [rng.randbytes(size) for _ in range(n)]


def test_put_many_takes_a_mapping_pairs_or_any_buffers_and_get_many_answers_in_order(
    nk_meta, nk_dir
):
    with nodekernel.connect(nk_meta) as c:
        t = f"{nk_dir}/t"
        c.mkdir(t, type="table", parents=True)
        vs = values(300)
        # A dict (its items), in_flight 1.
        c.put_many({f"{t}/d{i}": v for i, v in enumerate(vs[:100])}, in_flight=1)
        # A generator of pairs of every kind of buffer.
        kinds = [bytes, bytearray, memoryview, lambda v: np.frombuffer(v, dtype=np.uint8)]
        c.put_many(((f"{t}/g{i}", kinds[i % 4](v)) for i, v in enumerate(vs[100:200])), in_flight=7)
        # A list of pairs, with an empty value and a large one.
        big = bytes(range(256)) * (12 << 10) + b"!"
        c.put_many(
            [(f"{t}/l{i}", v) for i, v in enumerate(vs[200:])]
            + [
                (f"{t}/empty", b""),
                (f"{t}/big", big),
            ]
        )
        keys = (
            [f"{t}/d{i}" for i in range(100)]
            + [f"{t}/g{i}" for i in range(100)]
            + [f"{t}/l{i}" for i in range(100)]
        )
        for in_flight in (1, 3, 64):
            assert c.get_many(keys, in_flight=in_flight) == vs
        got = c.get_many(iter([f"{t}/big", f"{t}/missing", f"{t}/empty", f"{t}/d0"]))
        assert got == [big, None, b"", vs[0]]
        assert all(type(v) is bytes for v in got if v is not None)
        assert c.get_many([]) == []
        c.put_many({})


def test_put_many_replaces_keys_and_the_last_of_a_repeated_key_wins(nk_meta, nk_dir):
    with nodekernel.connect(nk_meta) as c:
        t = f"{nk_dir}/t"
        c.mkdir(t, type="table", parents=True)
        c.put(f"{t}/k", b"old")
        for in_flight in (1, 64):
            c.put_many(
                [(f"{t}/k", b"first"), (f"{t}/j", b"x"), (f"{t}/k", b"second")],
                in_flight=in_flight,
            )
            assert c.get(f"{t}/k") == b"second"


def test_a_failing_key_fails_alone_and_batch_error_lists_each(nk_meta, nk_dir):
    with nodekernel.connect(nk_meta) as c:
        t = f"{nk_dir}/t"
        c.mkdir(t, type="table", parents=True)
        items = [
            (f"{t}/a", b"1"),
            (f"{nk_dir}/none/k", b"2"),
            (f"{t}/b", bytearray(b"3")),
            ("relative", b"4"),
            (f"{t}/c", b"5"),
        ]
        with pytest.raises(BatchError) as e:
            c.put_many(items, in_flight=4)
        err = e.value
        assert isinstance(err, nodekernel.Error)
        assert err.total == 5
        assert list(err.errors) == [f"{nk_dir}/none/k", "relative"]
        assert isinstance(err.errors[f"{nk_dir}/none/k"], NotFound)
        assert isinstance(err.errors["relative"], InvalidPath)
        assert err.errors[f"{nk_dir}/none/k"].path == f"{nk_dir}/none/k"
        assert "2 of 5 items failed" in str(err) and "NotFound" in str(err)
        assert c.get_many([f"{t}/a", f"{t}/b", f"{t}/c"]) == [b"1", b"3", b"5"]

        # delete_many: a missing key is its own NotFound; the others are gone.
        with pytest.raises(BatchError) as e:
            c.delete_many([f"{t}/a", f"{t}/gone", f"{t}/b"], in_flight=2)
        assert list(e.value.errors) == [f"{t}/gone"]
        assert isinstance(e.value.errors[f"{t}/gone"], NotFound)
        assert c.get_many([f"{t}/a", f"{t}/b", f"{t}/c"]) == [None, None, b"5"]
        c.delete_many([f"{t}/c"])
        assert not c.exists(f"{t}/c")
        # A non-empty container needs recursive, as with delete.
        c.put(f"{t}/kept", b"x")
        with pytest.raises(BatchError) as e:
            c.delete_many([t])
        assert type(e.value.errors[t]).__name__ == "NotEmpty"
        c.delete_many([t], recursive=True)
        assert not c.exists(t)


def test_get_many_raises_a_failure_other_than_a_missing_key(nk_meta, nk_dir):
    with nodekernel.connect(nk_meta) as c:
        c.mkdir(f"{nk_dir}/t", type="table", parents=True)
        c.mkdir(f"{nk_dir}/d")
        c.put(f"{nk_dir}/t/v", b"v")
        with pytest.raises(TypeMismatch):
            c.get_many([f"{nk_dir}/t/v", f"{nk_dir}/none", f"{nk_dir}/d"])


def test_bad_arguments_fail_before_anything_is_done(nk_meta, nk_dir):
    with nodekernel.connect(nk_meta) as c:
        t = f"{nk_dir}/t"
        c.mkdir(t, type="table", parents=True)
        ok = (f"{t}/ok", b"x")
        with pytest.raises(TypeError):
            c.put_many([ok, (3, b"x")])
        with pytest.raises(TypeError):
            c.put_many([ok, (f"{t}/s", "a str is not bytes")])
        with pytest.raises(TypeError):
            c.put_many([ok, (f"{t}/s",)])
        with pytest.raises(TypeError):
            c.put_many(5)
        with pytest.raises(ValueError):
            c.put_many([ok, (f"{t}/nul\0", b"x")])
        for bad in (0, -1, 4097):
            with pytest.raises(ValueError):
                c.put_many([ok], in_flight=bad)
            with pytest.raises(ValueError):
                c.get_many([ok[0]], in_flight=bad)
        with pytest.raises(TypeError):
            c.get_many(f"{t}/ok")  # one str, not keys
        with pytest.raises(TypeError):
            c.delete_many([f"{t}/ok", None])
        assert not c.exists(f"{t}/ok"), "nothing was put"

        # More items than a call takes: refused while iterating, so an
        # endless iterable is not drained.
        def endless():
            i = 0
            while True:
                yield (f"{t}/e{i % 4}", b"x")
                i += 1

        with pytest.raises(InvalidArgument):
            c.put_many(endless())
        with pytest.raises(InvalidArgument):
            c.get_many(f"{t}/k{i}" for i in range(MAX_ITEMS + 1))
        with pytest.raises(InvalidArgument):
            c.delete_many([f"{t}/ok"] * (MAX_ITEMS + 1))
        assert not c.exists(f"{t}/e0"), "nothing was put"


def test_async_batched_calls(nk_meta, nk_dir):
    async def main():
        async with await nodekernel.aio.connect(nk_meta) as c:
            t = f"{nk_dir}/t"
            await c.mkdir(t, type="table", parents=True)
            vs = values(200)
            keys = [f"{t}/k{i}" for i in range(200)]
            await c.put_many(
                [(k, memoryview(bytearray(v))) for k, v in zip(keys, vs)], in_flight=16
            )
            assert await c.get_many([*keys, f"{t}/none"]) == [*vs, None]
            with pytest.raises(BatchError) as e:
                await c.put_many({f"{t}/x": b"1", f"{nk_dir}/none/y": b"2"})
            assert list(e.value.errors) == [f"{nk_dir}/none/y"]
            assert await c.get(f"{t}/x") == b"1"
            # Several batches at once on one client.
            await asyncio.gather(*(c.put_many({k: b"again" for k in keys[i::4]}) for i in range(4)))
            assert await c.get_many(keys) == [b"again"] * 200
            await c.delete_many(keys)
            assert await c.get_many(keys) == [None] * 200
            with pytest.raises(BatchError):
                await c.delete_many(keys[:3])

    run(main())


def test_a_cancelled_put_many_gives_the_space_of_its_puts_back_at_once(small_cluster):
    async def main():
        async with await nodekernel.aio.connect(small_cluster.meta) as c:
            await c.mkdir("/t", type="table")
            keys = [f"/t/k{i}" for i in range(8)]
            # The table keeps the pieces its child records took: those of
            # eight keys at once.
            await c.put_many([(k, b"x") for k in keys])
            await c.delete_many(keys)
            baseline = used(await c.status())
            rng = random.Random(38)
            value = bytearray(b"\x11" * (1 << 20))
            cancelled = 0
            for _ in range(300):
                try:
                    timeout = rng.choice((0, 0.0002, 0.001, 0.003, 0.01, 0.03))
                    await asyncio.wait_for(
                        c.put_many([(k, value) for k in keys], in_flight=4), timeout
                    )
                except asyncio.TimeoutError:
                    cancelled += 1
                # Once cancelled, the call no longer holds the buffer.
                value.extend(b"x")
                del value[-1]
            assert cancelled > 0, "no put_many was cancelled: the test proves nothing"
            # Puts that finished before their timeout are values: drop them.
            try:
                await c.delete_many(keys)
            except BatchError as e:
                assert all(isinstance(x, NotFound) for x in e.errors.values()), e
            await wait_for_baseline(c, baseline)
            # The space is there: most of the cluster in one batch.
            await c.put_many({f"/t/big{i}": b"\x22" * (10 << 20) for i in range(8)})

    run(main())
