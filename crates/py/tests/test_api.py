"""The synchronous API against a real cluster: every node type, values,
files, Tables, Bags, zero-copy reads."""

from __future__ import annotations

import io
import mmap
import os
import subprocess
import threading
import time

import numpy as np
import pytest

import nodekernel


@pytest.fixture
def nk(nk_meta):
    with nodekernel.connect(nk_meta) as c:
        yield c


def test_connect_discovers_nk_meta_and_config_file(nk_meta, tmp_path, monkeypatch):
    # NK_META (set by the session fixture) when no argument is given.
    with nodekernel.connect() as c:
        st = c.status()
        assert st["ready"]
        # nk up keeps no operation log.
        assert st["logs"] == []
        # One metadata partition, answering; no server is being drained.
        assert st["unreachable"] == []
        assert st["servers"]
        assert all(s["draining"] is False for s in st["servers"])
        # Blocks tier migration moved, per class (none moved: a list).
        assert isinstance(st["moves"], list)
        assert all({"class", "demoted", "promoted"} <= m.keys() for m in st["moves"])
    # The [client] section of a config file, when NK_META is unset.
    monkeypatch.delenv("NK_META")
    cfg = tmp_path / "nk.toml"
    cfg.write_text(f'[meta]\nlisten = "x"\n[client]\nmeta = ["{nk_meta}"]\n')
    with nodekernel.connect(config=str(cfg)) as c:
        assert c.status()["ready"]
    monkeypatch.setenv("NK_CONFIG", str(cfg))
    with nodekernel.connect() as c:
        assert c.status()["ready"]


def test_every_node_type(nk, nk_dir):
    nk.mkdir(f"{nk_dir}/sub/deeper", parents=True)
    nk.mkdir(f"{nk_dir}/tab", type="table")
    nk.mkdir(f"{nk_dir}/hidden", type="table", enumerable=False)
    nk.mkdir(f"{nk_dir}/bag", type="bag")
    with nk.create(f"{nk_dir}/file") as f:
        f.write(b"file bytes")
    with nk.create(f"{nk_dir}/tab/key", type="kv") as f:
        f.write(b"kv bytes")
    types = {s["name"].rsplit("/", 1)[1]: s["type"] for s in nk.ls(nk_dir, detail=True)}
    assert types == {"sub": "dir", "tab": "table", "hidden": "table", "bag": "bag", "file": "file"}
    assert nk.stat(f"{nk_dir}/tab/key")["type"] == "kv"
    assert nk.stat(f"{nk_dir}/hidden")["enumerable"] is False
    # What each takes of the cluster: the table's one child record a
    # 640-byte piece, an empty table nothing, a 10-byte File the smallest
    # piece (64 bytes, its 8-byte tag included).
    assert nk.stat(f"{nk_dir}/tab")["stored"] == 640
    assert nk.stat(f"{nk_dir}/hidden")["stored"] == 0
    assert nk.stat(f"{nk_dir}/file")["stored"] == 64
    assert nk.get(f"{nk_dir}/file") == b"file bytes"
    assert nk.get(f"{nk_dir}/tab/key") == b"kv bytes"
    assert nk.ls(f"{nk_dir}/sub") == ["deeper"]


def test_put_get_replace_delete(nk, nk_dir):
    t = f"{nk_dir}/t"
    nk.mkdir(t, type="table")
    for v in [b"", b"x", os.urandom(1 << 20), os.urandom(3 * (1 << 20) + 5)]:
        nk.put(f"{t}/k", v)
        assert nk.get(f"{t}/k") == v
    nk.put(f"{t}/ba", bytearray(b"from bytearray"))
    nk.put(f"{t}/mv", memoryview(b"from memoryview"))
    nk.put(f"{t}/np", np.arange(10, dtype=np.int64))
    b = io.BytesIO(b"from a BytesIO buffer")
    view = b.getbuffer()  # writable: borrowed for the call, not copied
    nk.put(f"{t}/bio", view)
    view.release()
    nk.put(f"{t}/ro", memoryview(np.arange(3, dtype=np.uint8)).toreadonly())  # copied
    assert nk.get(f"{t}/bio") == b"from a BytesIO buffer"
    assert nk.get(f"{t}/ro") == bytes([0, 1, 2])
    assert nk.get(f"{t}/ba") == b"from bytearray"
    assert nk.get(f"{t}/mv") == b"from memoryview"
    assert np.frombuffer(nk.get(f"{t}/np"), dtype=np.int64).tolist() == list(range(10))
    assert nk.exists(f"{t}/k")
    nk.delete(f"{t}/k")
    assert not nk.exists(f"{t}/k")
    nk.move(f"{t}/ba", f"{t}/moved")
    assert nk.get(f"{t}/moved") == b"from bytearray"
    assert sorted(nk.ls(t)) == ["bio", "moved", "mv", "np", "ro"]


def test_readinto_numpy_and_memoryview(nk, nk_dir):
    t = f"{nk_dir}/t"
    nk.mkdir(t, type="table")
    data = os.urandom(2 * (1 << 20) + 123)
    nk.put(f"{t}/v", data)
    arr = np.zeros(len(data), dtype=np.uint8)
    assert nk.get_into(f"{t}/v", arr) == len(data)
    assert arr.tobytes() == data
    # Any element type and a bigger buffer: the value fills its front.
    floats = np.zeros(len(data) // 8 + 1, dtype=np.float64)
    assert nk.get_into(f"{t}/v", floats) == len(data)
    assert floats.tobytes()[: len(data)] == data
    buf = bytearray(len(data))
    assert nk.get_into(f"{t}/v", memoryview(buf)) == len(data)
    assert bytes(buf) == data
    # File.readinto: a NumPy array, a memoryview slice, an mmap.
    with nk.open(f"{t}/v") as f:
        head = np.zeros(1000, dtype=np.uint8)
        assert f.readinto(head) == 1000
        assert head.tobytes() == data[:1000]
        rest = bytearray(len(data))
        n = f.readinto(memoryview(rest)[10:])
        assert n == len(data) - 1000
        assert bytes(rest[10 : 10 + n]) == data[1000:]
        assert f.readinto(bytearray(10)) == 0  # at the end
        f.seek(0)
        m = mmap.mmap(-1, len(data))
        assert f.readinto(m) == len(data)
        assert m[:] == data


def test_file_modes_seek_tell(nk, nk_dir):
    p = f"{nk_dir}/f"
    with nk.open(p, "wb") as f:
        assert f.writable() and not f.readable()
        for i in range(100):
            f.write(bytes([i]) * 1000)
        assert f.tell() == 100_000
    with nk.open(p, "ab") as f:
        f.write(b"tail")
    with nk.open(p, "rb") as f:
        assert f.size == 100_004 and f.seekable()
        assert f.read(3) == b"\x00\x00\x00"
        assert f.tell() == 3
        assert f.seek(-4, 2) == 100_000
        assert f.read() == b"tail"
        assert f.read() == b""
        f.seek(50_500)
        assert f.read(1) == bytes([50])
        f.seek(-1, 1)
        assert f.read(2) == bytes([50, 50])
    # "wb" on an existing File replaces it.
    with nk.open(p, "wb") as f:
        f.write(b"new")
    assert nk.get(p) == b"new"


def test_flush_publishes_to_readers(nk, nk_dir):
    p = f"{nk_dir}/growing"
    w = nk.open(p, "wb")
    w.write(b"a" * 10)
    assert nk.stat(p)["size"] == 0
    w.flush()
    assert nk.stat(p)["size"] == 10
    assert nk.get(p) == b"a" * 10
    w.close()
    w.close()  # twice is fine
    assert w.closed


def test_table_mapping(nk, nk_dir):
    t = nodekernel.Table(nk, f"{nk_dir}/table", create=True)
    t["a"] = b"1"
    t["b"] = bytearray(b"2")
    assert t["a"] == b"1" and "a" in t and "zz" not in t
    assert sorted(t) == ["a", "b"] and len(t) == 2
    assert dict(t.items()) == {"a": b"1", "b": b"2"}
    del t["a"]
    assert "a" not in t
    with pytest.raises(KeyError):
        t["a"]
    with pytest.raises(KeyError):
        del t["a"]
    with pytest.raises(TypeError):
        t[1] = b"x"


def test_bag_reads_as_one_stream_with_boundaries(nk, nk_dir):
    bag = f"{nk_dir}/bag"
    nk.mkdir(bag, type="bag")
    parts = {f"part{i}": os.urandom(1000 * (i + 1)) for i in range(4)}
    for name, data in parts.items():
        with nk.create(f"{bag}/{name}") as f:
            f.write(data)
    with nk.open(bag) as f:
        stream = f.read()
        files = f.files
    assert len(stream) == sum(len(d) for d in parts.values())
    assert sorted(p.rsplit("/", 1)[1] for p, _, _ in files) == sorted(parts)
    for path, offset, size in files:
        assert stream[offset : offset + size] == parts[path.rsplit("/", 1)[1]]


def test_threads_share_a_client(nk, nk_dir):
    t = f"{nk_dir}/t"
    nk.mkdir(t, type="table")
    errors = []

    def work(i):
        try:
            for j in range(50):
                nk.put(f"{t}/k{i}", f"{i}-{j}".encode())
                assert nk.get(f"{t}/k{i}") == f"{i}-{j}".encode()
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert len(nk.ls(t)) == 8


def test_status(nk):
    s = nk.status()
    assert s["ready"] and s["servers"] and s["servers"][0]["alive"]
    assert s["servers"][0]["capacity_bytes"] > 0


def test_import_and_fsspec_registration_from_a_fresh_interpreter(nk_meta):
    # Acceptance 1: the package and the "nk" protocol need no import of ours.
    out = subprocess.run(
        [
            os.sys.executable,
            "-c",
            "import nodekernel, fsspec; fs = fsspec.filesystem('nk'); print(type(fs).__name__)",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "NK_META": nk_meta},
        check=True,
    )
    assert out.stdout.strip() == "NodeKernelFileSystem"


def test_unclosed_writers_do_not_block_the_path(nk, nk_dir):
    import gc

    p = f"{nk_dir}/f"
    w = nk.open(p, "wb")
    w.write(b"abc")
    del w
    gc.collect()
    # Closed in the background: the lease is released, the bytes published.
    with nk.open(p, "ab") as w2:
        w2.write(b"def")
    assert nk.get(p) == b"abcdef"


def test_kv_written_in_steps_is_all_or_nothing(nk, nk_dir):
    t = f"{nk_dir}/t"
    nk.mkdir(t, type="table")
    nk.put(f"{t}/k", b"old")
    with pytest.raises(RuntimeError, match="boom"):
        with nk.open(f"{t}/k", "wb") as w:  # in a Table: a KeyValue
            w.write(b"half of a new value")
            raise RuntimeError("boom")
    assert nk.get(f"{t}/k") == b"old"
    w = nk.create(f"{t}/k2", type="kv")
    w.write(b"never")
    w.abort()
    assert not nk.exists(f"{t}/k2")
    with nk.open(f"{t}/k", "wb") as w:
        w.write(b"new")
    assert nk.get(f"{t}/k") == b"new"
    # A File keeps what was written, as Python's files do.
    with pytest.raises(RuntimeError), nk.open(f"{nk_dir}/f", "wb") as w:
        w.write(b"partial")
        raise RuntimeError("boom")
    assert nk.get(f"{nk_dir}/f") == b"partial"


def test_exists_below_a_file_is_false(nk, nk_dir):
    nk.open(f"{nk_dir}/f", "wb").close()
    assert nk.exists(f"{nk_dir}/f")
    assert not nk.exists(f"{nk_dir}/f/below")


def test_a_closed_client_gives_back_the_puts_it_reserved(small_cluster):
    # A stream of small puts reserves puts ahead of their keys
    # (docs/small-values.md, "Puts in one exchange"); the client, once
    # closed and gone, gives the unused ones back at once. The sweeper cannot run during the
    # test, so only that can bring the count back to none.
    with nodekernel.connect(small_cluster.meta) as watcher:
        watcher.mkdir("/t", type="table")
        with nodekernel.connect(small_cluster.meta) as c:
            for i in range(50):
                c.put(f"/t/k{i}", b"v" * 100)
            # Refills run in the background: the one asked for by the last
            # puts may still be on its way.
            deadline = time.monotonic() + 60  # only catches a hang
            while c.status()["reserved_puts"] == 0:
                assert time.monotonic() < deadline, c.status()
                time.sleep(0.01)
            assert c.status()["puts_in_progress"] == 0
        del c  # the client itself goes with its last reference
        deadline = time.monotonic() + 60  # only catches a hang
        while watcher.status()["reserved_puts"] > 0:
            assert time.monotonic() < deadline, watcher.status()
            time.sleep(0.01)
        assert [watcher.get(f"/t/k{i}") for i in (0, 49)] == [b"v" * 100] * 2
