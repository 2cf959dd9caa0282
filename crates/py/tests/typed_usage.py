"""The public API as a user types it: test_package.py runs `mypy --strict`
on this file (each `assert_type` pins what the stubs say a call returns),
and runs it on the session cluster (`python typed_usage.py BASE_DIR`, with
BASE_DIR an empty directory there), so that the types and what the calls
really do are checked together."""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Optional, Union

from typing_extensions import assert_type

import nodekernel
import nodekernel.aio
from nodekernel import AsyncClient, AsyncFile, Client, File


def sync_calls(nk: Client, base: str) -> None:
    assert_type(nk.closed, bool)
    nk.mkdir(f"{base}/t", type="table")
    nk.mkdir(f"{base}/d/e", parents=True)
    nk.put(f"{base}/t/a", b"value")
    assert_type(nk.get(f"{base}/t/a"), bytes)
    assert_type(nk.exists(f"{base}/t/a"), bool)
    nk.put_many({f"{base}/t/b": b"1", f"{base}/t/c": bytearray(b"2")}, in_flight=8)
    nk.put_many([(f"{base}/t/d", memoryview(b"3"))])
    got = nk.get_many([f"{base}/t/b", f"{base}/t/missing"])
    assert_type(got, list[Optional[bytes]])
    assert got == [b"1", None]
    buf = bytearray(16)
    n = nk.get_into(f"{base}/t/a", buf)
    assert_type(n, int)
    names = nk.ls(f"{base}/t")
    assert_type(names, list[str])
    assert names == ["a", "b", "c", "d"]
    details = nk.ls(f"{base}/t", detail=True)
    assert_type(details, list[dict[str, Any]])
    assert_type(nk.ls(f"{base}/t", True), list[dict[str, Any]])
    flag = len(names) > 1
    assert_type(nk.ls(f"{base}/t", detail=flag), Union[list[str], list[dict[str, Any]]])
    st = nk.stat(f"{base}/t/a")
    assert_type(st, dict[str, Any])
    assert st["size"] == 5
    assert_type(nk.status(), dict[str, Any])
    nk.delete_many([f"{base}/t/c", f"{base}/t/d"])
    try:
        nk.delete_many([f"{base}/t/missing"])
    except nodekernel.BatchError as e:
        assert_type(e.errors, dict[str, nodekernel.Error])
        assert isinstance(e.errors[f"{base}/t/missing"], nodekernel.NotFound)
    else:
        raise AssertionError("delete_many of a missing key raised no BatchError")

    with nk.open(f"{base}/d/f", "wb") as f:
        assert_type(f, File)
        assert_type(f.write(b"abc"), int)
        f.flush()
    with nk.open(f"{base}/d/f", "ab") as f:
        f.write(memoryview(b"def"))
    w = nk.create(f"{base}/t/kv", "kv")
    w.write(b"in steps")
    w.abort()
    with nk.lookup(f"{base}/d/f") as f:
        assert_type(f.size, int)
        assert_type(f.files, list[tuple[str, int, int]])
        assert_type(f.seek(1), int)
        assert_type(f.read(2), bytes)
        assert_type(f.readinto(buf), int)
        assert_type(f.tell(), int)
        assert_type(f.readall(), bytes)
        assert f.readable() and f.seekable() and not f.writable()
        assert_type(f.name, str)
        assert_type(f.mode, str)
    nk.move(f"{base}/d/f", f"{base}/d/g")

    t = nodekernel.Table(nk, f"{base}/t")
    t["k"] = b"v"
    assert_type(t["k"], bytes)
    assert "k" in t and sorted(t) == ["a", "b", "k"] and len(t) == 3
    del t["k"]

    try:
        nk.get(f"{base}/t/missing")
    except nodekernel.NotFound as e:  # also a FileNotFoundError
        assert_type(e.path, Optional[str])
        assert_type(e.code, str)
        assert_type(e.message, str)
        assert e.path == f"{base}/t/missing" and isinstance(e, FileNotFoundError)
    except nodekernel.errors.AlreadyExists:
        raise
    else:
        raise AssertionError("get of a missing key raised no NotFound")
    nk.delete(f"{base}/d", recursive=True)


async def async_calls(base: str) -> None:
    # `nodekernel.aio` comes with `import nodekernel`.
    async with await nodekernel.aio.connect() as nk:
        assert_type(nk, AsyncClient)
        await nk.mkdir(f"{base}/at", type="table")
        await nk.put(f"{base}/at/a", b"value")
        assert_type(await nk.get(f"{base}/at/a"), bytes)
        await nk.put_many({f"{base}/at/b": b"1"})
        assert_type(await nk.get_many([f"{base}/at/b"]), list[Optional[bytes]])
        assert_type(await nk.ls(f"{base}/at"), list[str])
        assert_type(await nk.ls(f"{base}/at", detail=True), list[dict[str, Any]])
        assert_type(await nk.stat(f"{base}/at/a"), dict[str, Any])
        assert_type(await nk.exists(f"{base}/at/a"), bool)
        assert_type(await nk.get_into(f"{base}/at/a", bytearray(8)), int)
        await nk.delete_many([f"{base}/at/b"])
        async with await nk.open(f"{base}/af", "wb") as f:
            assert_type(f, AsyncFile)
            assert_type(await f.write(b"abc"), int)
            await f.flush()
        f = await nk.lookup(f"{base}/af")
        assert_type(f.seek(1), int)
        assert_type(await f.read(), bytes)
        assert_type(await f.readinto(bytearray(4)), int)
        assert f.readable() and not f.writable()
        await f.close()
        await nk.move(f"{base}/af", f"{base}/ag")
        await nk.delete(f"{base}/ag")
    assert nk.closed


def main(base: str) -> None:
    assert_type(nodekernel.__version__, str)
    assert_type(nodekernel.DEFAULT_META, str)
    with nodekernel.connect() as nk:
        sync_calls(nk, base)
    asyncio.run(async_calls(base))


if __name__ == "__main__":
    main(sys.argv[1])
