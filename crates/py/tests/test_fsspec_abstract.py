"""fsspec's own abstract filesystem test suite, unmodified, run against the
`nk` filesystem on the session's real NodeKernel cluster; then the
NodeKernel-specific behaviour the suite does not cover (URLs, node types,
moves, deletes, ranges, transactions, pickling)."""

from __future__ import annotations

import datetime
import os
import pickle
import time

import fsspec
import pytest
from fsspec.tests.abstract import (
    AbstractCopyTests,
    AbstractFixtures,
    AbstractGetTests,
    AbstractOpenTests,
    AbstractPipeTests,
    AbstractPutTests,
)

import nodekernel
from nodekernel.fsspec import NodeKernelFileSystem


class NodeKernelFixtures(AbstractFixtures):
    @pytest.fixture(scope="class")
    @classmethod
    def fs(cls, nk_meta):
        return fsspec.filesystem("nk", meta=nk_meta)

    @pytest.fixture
    def fs_path(self, nk_dir):
        return nk_dir


class TestNodeKernelCopy(AbstractCopyTests, NodeKernelFixtures):
    pass


class TestNodeKernelGet(AbstractGetTests, NodeKernelFixtures):
    pass


class TestNodeKernelPut(AbstractPutTests, NodeKernelFixtures):
    pass


class TestNodeKernelPipe(AbstractPipeTests, NodeKernelFixtures):
    pass


class TestNodeKernelOpen(AbstractOpenTests, NodeKernelFixtures):
    pass


# ---------------------------------------------------------------------------
# Behaviour beyond the abstract suite.


@pytest.fixture
def fs(nk_meta):
    return fsspec.filesystem("nk", meta=nk_meta)


def test_registered_protocol_and_urls(nk_meta, nk_dir):
    assert fsspec.get_filesystem_class("nk") is NodeKernelFileSystem
    fs, path = fsspec.core.url_to_fs(f"nk://{nk_meta}{nk_dir}/a/")
    assert isinstance(fs, NodeKernelFileSystem)
    assert fs.meta == nk_meta
    assert path == f"{nk_dir}/a"
    # No host: NK_META (set by the cluster fixture).
    fs2, path2 = fsspec.core.url_to_fs(f"nk://{nk_dir}/b")
    assert fs2.meta is None and path2 == f"{nk_dir}/b"
    fs2.pipe_file(path2, b"via NK_META")
    assert fs.cat_file(f"{nk_dir}/b") == b"via NK_META"

    strip = NodeKernelFileSystem._strip_protocol
    assert strip("nk:///") == "/"
    assert strip(f"nk://{nk_meta}") == "/"
    assert strip("nk:///a/b/") == "/a/b"
    assert strip("/a//b/./c/") == "/a/b/c"
    # A relative path is relative to the root and keeps its form.
    assert strip("a//b/./c/") == "a/b/c"
    assert strip("a/../../b") == "b"
    assert [strip(p) for p in ("", ".", "/", "/..")] == ["", "", "/", "/"]
    assert strip(["nk:///x", "/y/", "z"]) == ["/x", "/y", "z"]
    parent = NodeKernelFileSystem._parent
    assert [parent(p) for p in ("/a/b", "/a", "/", "a/b", "a", "")] == ["/a", "/", "/", "a", "", ""]
    assert fs.unstrip_protocol("/a/b") == f"nk://{nk_meta}/a/b"
    assert fs2.unstrip_protocol("/a/b") == "nk:///a/b"


def test_relative_paths_answer_in_their_form(fs, nk_dir):
    """A path without its leading `/` names the same node (`a/b` is `/a/b`,
    "" the root), and every name ls, info, find, glob and walk return has
    the form of the path asked about, as Arrow's own filesystems do (which
    PyArrow's FSSpecHandler relies on: see test_ecosystem.py)."""
    rel = nk_dir[1:]

    def relative(names):
        return [n[1:] for n in names]

    def unnamed(infos):
        return [{**i, "name": None} for i in infos]

    fs.pipe_file(f"{rel}/d/f1", b"1")
    fs.pipe_file(f"{nk_dir}/d/sub/f2", b"22")
    fs.mkdir(f"{rel}/t", type="table")
    fs.pipe_file(f"{rel}/t/k", b"kv")
    assert fs.cat_file(f"{nk_dir}/d/f1") == b"1"
    assert fs.cat_file(f"{rel}/d/sub/f2") == b"22"
    assert fs.info(f"{nk_dir}/t/k")["nk_type"] == "kv"

    for sub in ("", "/d", "/d/sub", "/d/f1", "/t", "/t/k"):
        a, r = nk_dir + sub, rel + sub
        assert fs.ls(r, detail=False) == relative(fs.ls(a, detail=False))
        ls_a, ls_r = fs.ls(a, detail=True), fs.ls(r, detail=True)
        assert [i["name"] for i in ls_r] == relative([i["name"] for i in ls_a])
        assert unnamed(ls_r) == unnamed(ls_a)
        info_a, info_r = fs.info(a), fs.info(r)
        assert (info_a["name"], info_r["name"]) == (a, r)
        assert unnamed([info_r]) == unnamed([info_a])
        assert fs.find(r) == relative(fs.find(a))
        found_a = fs.find(a, withdirs=True, detail=True)
        found_r = fs.find(r, withdirs=True, detail=True)
        assert list(found_r) == relative(found_a)
        assert unnamed(found_r.values()) == unnamed(found_a.values())
        assert fs.ukey(r) == fs.ukey(a)
        assert fs.exists(r) and fs.isdir(r) == fs.isdir(a)
    assert fs.glob(f"{rel}/d/*") == [f"{rel}/d/f1", f"{rel}/d/sub"]
    assert fs.glob(f"{nk_dir}/d/*") == [f"{nk_dir}/d/f1", f"{nk_dir}/d/sub"]
    assert fs.glob(f"{rel}/**/f2") == [f"{rel}/d/sub/f2"]
    assert [w[0] for w in fs.walk(rel)] == relative(w[0] for w in fs.walk(nk_dir))

    # The root: "" (or ".") relative, "/" absolute; a URL's path is absolute.
    assert rel in fs.ls("", detail=False) and nk_dir in fs.ls("/", detail=False)
    assert fs.ls(".", detail=False) == relative(fs.ls("/", detail=False))
    assert (fs.info("")["name"], fs.info("/")["name"]) == ("", "/")
    top = fs.glob(f"{rel}*")  # the pattern's root is the relative root
    assert rel in top and not any(p.startswith("/") for p in top)
    assert fs.ls(f"nk://{nk_dir}/t", detail=False) == [f"{nk_dir}/t/k"]

    # Changes through relative paths.
    fs.mv(f"{rel}/d/f1", f"{rel}/moved")
    fs.cp_file(f"{rel}/moved", f"{rel}/copied")
    with fs.transaction, fs.open(f"{rel}/tx", "wb") as f:
        f.write(b"in a transaction")
    fs.rm(f"{rel}/d", recursive=True)
    fs.makedirs(f"{rel}/e/f", exist_ok=True)
    fs.rmdir(f"{rel}/e/f")
    fs.rm_file(f"{rel}/t/k")
    assert fs.ls(nk_dir, detail=False) == [
        f"{nk_dir}/{n}" for n in ("copied", "e", "moved", "t", "tx")
    ]
    assert fs.cat_file(f"{nk_dir}/copied") == b"1"
    assert fs.cat_file(f"{nk_dir}/tx") == b"in a transaction"


def test_open_url_round_trip(nk_meta, nk_dir):
    url = f"nk://{nk_meta}{nk_dir}/new/deeper/text.txt"
    with fsspec.open(url, "wt") as f:
        f.write("line 1\nline 2\n")
    with fsspec.open(url, "rt") as f:
        assert f.readlines() == ["line 1\n", "line 2\n"]


def test_node_types_in_listings(fs, nk_dir):
    c = fs.client
    c.mkdir(f"{nk_dir}/table", type="table")
    c.mkdir(f"{nk_dir}/bag", type="bag")
    c.put(f"{nk_dir}/table/key", b"value")
    fs.pipe_file(f"{nk_dir}/file", b"12345")
    listing = {i["name"]: i for i in fs.ls(nk_dir, detail=True)}
    assert sorted(listing) == [f"{nk_dir}/{n}" for n in ("bag", "file", "table")]
    assert listing[f"{nk_dir}/table"]["type"] == "directory"
    assert listing[f"{nk_dir}/table"]["nk_type"] == "table"
    assert listing[f"{nk_dir}/bag"]["type"] == "directory"
    assert listing[f"{nk_dir}/file"] == fs.info(f"{nk_dir}/file")
    assert listing[f"{nk_dir}/file"]["size"] == 5
    kv = fs.info(f"{nk_dir}/table/key")
    assert (kv["type"], kv["nk_type"], kv["size"]) == ("file", "kv", 5)
    assert fs.cat_file(f"{nk_dir}/table/key") == b"value"
    assert fs.ls(f"{nk_dir}/file", detail=False) == [f"{nk_dir}/file"]
    assert fs.isdir("/") and fs.info("/")["type"] == "directory"
    assert fs.find(nk_dir) == [f"{nk_dir}/file", f"{nk_dir}/table/key"]


def test_write_under_table_stores_keyvalue(fs, nk_dir):
    fs.mkdir(f"{nk_dir}/t", type="table")
    fs.pipe_file(f"{nk_dir}/t/a", b"one")
    with fs.open(f"{nk_dir}/t/b", "wb") as f:
        f.write(b"two")
    fs.pipe_file(f"{nk_dir}/t/a", b"one again")
    assert fs.client.get(f"{nk_dir}/t/a") == b"one again"
    assert fs.client.get(f"{nk_dir}/t/b") == b"two"
    assert fs.info(f"{nk_dir}/t/b")["nk_type"] == "kv"
    with pytest.raises(FileExistsError):
        fs.pipe_file(f"{nk_dir}/t/a", b"x", mode="create")
    fs.cp_file(f"{nk_dir}/t/a", f"{nk_dir}/copied")
    assert fs.info(f"{nk_dir}/copied")["nk_type"] == "file"
    assert fs.cat_file(f"{nk_dir}/copied") == b"one again"


def test_missing_paths_and_errors(fs, nk_dir):
    fs.pipe_file(f"{nk_dir}/f", b"x")
    missing = f"{nk_dir}/nope"
    for call in (fs.info, fs.ls, fs.cat_file, fs.open, fs.rm, fs.rm_file):
        with pytest.raises(FileNotFoundError):
            call(missing)
    with pytest.raises(FileNotFoundError):
        fs.info(f"{nk_dir}/f/below-a-file")
    assert not fs.exists(f"{nk_dir}/f/below-a-file")
    assert not fs.exists(missing)
    with pytest.raises(FileExistsError):
        fs.mkdir(nk_dir)
    with pytest.raises(FileNotFoundError):
        fs.mkdir(f"{nk_dir}/a/b", create_parents=False)
    fs.makedirs(f"{nk_dir}/a/b", exist_ok=True)
    fs.makedirs(f"{nk_dir}/a/b", exist_ok=True)
    with pytest.raises(FileExistsError):
        fs.makedirs(f"{nk_dir}/a/b")
    with pytest.raises(FileExistsError):
        fs.makedirs(f"{nk_dir}/f", exist_ok=True)
    with pytest.raises(IsADirectoryError):
        fs.cat_file(f"{nk_dir}/a")
    with pytest.raises(IsADirectoryError):
        fs.pipe_file(f"{nk_dir}/a", b"x")
    with pytest.raises(NotADirectoryError):
        fs.pipe_file(f"{nk_dir}/f/child", b"x")
    with pytest.raises(NotADirectoryError):
        fs.rmdir(f"{nk_dir}/f")
    with pytest.raises(OSError) as err:
        fs.rmdir(f"{nk_dir}/a")  # not empty
    assert isinstance(err.value, nodekernel.errors.NotEmpty)
    fs.rmdir(f"{nk_dir}/a/b")
    fs.rmdir(f"{nk_dir}/a")
    assert not fs.exists(f"{nk_dir}/a")


def test_cat_ranges_and_buffered_reads(fs, nk_dir):
    data = bytes(range(256)) * 40_000  # 10 MB, several blocks
    path = f"{nk_dir}/big"
    with fs.open(path, "wb", block_size=1 << 20) as f:
        for i in range(0, len(data), 777_777):
            f.write(data[i : i + 777_777])
    assert fs.size(path) == len(data)
    assert fs.cat_file(path) == data
    assert fs.cat_file(path, start=5, end=10) == data[5:10]
    assert fs.cat_file(path, start=-10) == data[-10:]
    assert fs.cat_file(path, start=100, end=-100) == data[100:-100]
    assert fs.cat_file(path, start=len(data) + 5) == b""
    assert fs.cat_file(path, start=len(data) - 3, end=len(data) + 100) == data[-3:]
    assert fs.cat_ranges([path, path], [0, 1_048_570], [3, 1_048_580]) == [
        data[:3],
        data[1_048_570:1_048_580],
    ]
    with fs.open(path, "rb", block_size=65536) as f:
        f.seek(3_000_000)
        assert f.read(100) == data[3_000_000:3_000_100]
        f.seek(-50, 2)
        assert f.read() == data[-50:]
        assert f.read(10) == b""
        f.seek(len(data) + 10)
        assert f.read(10) == b""
    assert fs.read_block(path, 1_000_000, 500) == data[1_000_000:1_000_500]
    # Reads of a block or more bypass the read-ahead cache (one copy);
    # mixed with small reads, every byte still comes from the right place.
    with fs.open(path, "rb", block_size=1 << 20) as f:
        assert f.read(10) == data[:10]  # small: fills the cache
        assert f.read(3 << 20) == data[10 : 10 + (3 << 20)]  # starts in the cache
        pos = f.tell()
        assert f.read(2 << 20) == data[pos : pos + (2 << 20)]  # straight from the handle
        f.seek(5_000_001)
        buf = bytearray(2 << 20)
        assert f.readinto(buf) == len(buf)
        assert bytes(buf) == data[5_000_001 : 5_000_001 + len(buf)]
        assert f.tell() == 5_000_001 + len(buf)
        f.seek(len(data) - 100)
        assert f.readinto(bytearray(2 << 20)) == 100  # small at the end: the cache path
        f.seek(len(data) - (1 << 20) - 7)
        assert f.read() == data[-(1 << 20) - 7 :]


def test_append_and_exclusive_open(fs, nk_dir):
    path = f"{nk_dir}/log"
    with fs.open(path, "ab") as f:
        f.write(b"one,")
    with fs.open(path, "ab") as f:
        f.write(b"two")
    assert fs.cat_file(path) == b"one,two"
    with pytest.raises(FileExistsError):
        fs.open(path, "xb")
    with fs.open(path, "wb") as f:
        f.write(b"replaced")
    assert fs.cat_file(path) == b"replaced"


def test_mv_renames_files_and_directories(fs, nk_dir):
    fs.pipe_file(f"{nk_dir}/src/sub/f1", b"1")
    fs.pipe_file(f"{nk_dir}/src/f2", b"2")
    id_before = fs.info(f"{nk_dir}/src/sub/f1")["id"]
    # A whole directory, into a new path with missing parents.
    fs.mv(f"{nk_dir}/src", f"{nk_dir}/x/y/dst")
    assert not fs.exists(f"{nk_dir}/src")
    assert fs.find(f"{nk_dir}/x") == [f"{nk_dir}/x/y/dst/f2", f"{nk_dir}/x/y/dst/sub/f1"]
    assert fs.info(f"{nk_dir}/x/y/dst/sub/f1")["id"] == id_before  # renamed, not copied
    # A file into an existing directory.
    fs.mkdir(f"{nk_dir}/into")
    fs.mv(f"{nk_dir}/x/y/dst/f2", f"{nk_dir}/into")
    assert fs.cat_file(f"{nk_dir}/into/f2") == b"2"
    # A file over an existing file.
    fs.pipe_file(f"{nk_dir}/other", b"old")
    fs.mv(f"{nk_dir}/into/f2", f"{nk_dir}/other")
    assert fs.cat_file(f"{nk_dir}/other") == b"2"
    assert not fs.exists(f"{nk_dir}/into/f2")
    # A file into a Table becomes a KeyValue (copy + delete).
    fs.mkdir(f"{nk_dir}/t", type="table")
    fs.mv(f"{nk_dir}/other", f"{nk_dir}/t/k")
    assert fs.client.get(f"{nk_dir}/t/k") == b"2"
    assert not fs.exists(f"{nk_dir}/other")
    # Globs go through copy + delete.
    fs.pipe_file(f"{nk_dir}/g/a.csv", b"a")
    fs.pipe_file(f"{nk_dir}/g/b.csv", b"b")
    fs.pipe_file(f"{nk_dir}/g/c.txt", b"c")
    fs.mkdir(f"{nk_dir}/csv")
    fs.mv(f"{nk_dir}/g/*.csv", f"{nk_dir}/csv/")
    assert fs.ls(f"{nk_dir}/csv", detail=False) == [f"{nk_dir}/csv/a.csv", f"{nk_dir}/csv/b.csv"]
    assert fs.ls(f"{nk_dir}/g", detail=False) == [f"{nk_dir}/g/c.txt"]
    with pytest.raises(FileNotFoundError):
        fs.mv(f"{nk_dir}/missing", f"{nk_dir}/anything")


def test_rm_non_recursive_keeps_non_empty_directories(fs, nk_dir):
    for p in ("d/a", "d/sub/c"):
        fs.pipe_file(f"{nk_dir}/{p}", b".")
    with pytest.raises(nodekernel.errors.NotEmpty):
        fs.rm(f"{nk_dir}/d")
    with pytest.raises(nodekernel.errors.NotEmpty):
        fs.rm(f"{nk_dir}/d/*")  # children first: `d/sub` fails before `d/a`
    assert fs.find(f"{nk_dir}/d") == [f"{nk_dir}/d/a", f"{nk_dir}/d/sub/c"]
    fs.rm(f"{nk_dir}/d/sub/c")
    fs.rm(f"{nk_dir}/d/sub")  # empty now
    assert fs.ls(f"{nk_dir}/d", detail=False) == [f"{nk_dir}/d/a"]


def test_rm_glob_and_recursive(fs, nk_dir):
    for p in ("d/a", "d/b", "d/sub/c", "e/x"):
        fs.pipe_file(f"{nk_dir}/{p}", b".")
    fs.rm(f"{nk_dir}/d/[ab]")
    assert fs.ls(f"{nk_dir}/d", detail=False) == [f"{nk_dir}/d/sub"]
    fs.rm([f"{nk_dir}/d", f"{nk_dir}/e"], recursive=True)
    assert fs.ls(nk_dir) == []


def test_touch_and_ukey(fs, nk_dir):
    path = f"{nk_dir}/t"
    fs.touch(path)
    assert fs.cat_file(path) == b""
    key = fs.ukey(path)
    assert fs.ukey(path) == key
    fs.pipe_file(path, b"changed")
    assert fs.ukey(path) != key
    fs.touch(path, truncate=False)  # exists: left as it is
    assert fs.cat_file(path) == b"changed"
    fs.touch(path)
    assert fs.cat_file(path) == b""
    with pytest.raises(NotImplementedError):
        fs.created(path)


def test_modification_times_and_modes(fs, nk_dir):
    path = f"{nk_dir}/m"
    before = time.time()
    fs.pipe_file(path, b"first")
    info = fs.info(path)
    assert info["mode"] == 0o644
    assert before - 1 <= info["mtime"] <= time.time() + 1
    t = fs.modified(path)
    assert t.tzinfo == datetime.timezone.utc
    assert abs(t.timestamp() - info["mtime"]) < 1e-3
    time.sleep(0.01)
    fs.pipe_file(path, b"second")  # a new File: a later time
    assert fs.info(path)["mtime"] > info["mtime"]
    assert fs.info(nk_dir)["mode"] == 0o755


def test_transaction_commits_on_exit_and_discards_on_error(fs, nk_dir):
    with fs.transaction:
        with fs.open(f"{nk_dir}/a", "wb") as f:
            f.write(b"committed")
        assert not fs.exists(f"{nk_dir}/a")
    assert fs.cat_file(f"{nk_dir}/a") == b"committed"
    with pytest.raises(RuntimeError, match="abort"), fs.transaction:
        with fs.open(f"{nk_dir}/b", "wb") as f:
            f.write(b"discarded")
        raise RuntimeError("abort")
    assert fs.ls(nk_dir, detail=False) == [f"{nk_dir}/a"]


def test_pickled_filesystem_and_file_reconnect(fs, nk_dir):
    fs.pipe_file(f"{nk_dir}/p", b"pickled")
    fs2 = pickle.loads(pickle.dumps(fs))
    assert fs2.cat_file(f"{nk_dir}/p") == b"pickled"
    with fs.open(f"{nk_dir}/p", "rb") as f:
        f.seek(2)
        f2 = pickle.loads(pickle.dumps(f))
    assert f2.read() == b"ckled"
    f2.close()


def test_bag_reads_as_one_stream(fs, nk_dir):
    bag = f"{nk_dir}/bag"
    fs.mkdir(bag, type="bag")
    fs.pipe_file(f"{bag}/p0", b"first,")
    fs.pipe_file(f"{bag}/p1", b"second")
    assert fs.isdir(bag)
    assert fs.ls(bag, detail=False) == [f"{bag}/p0", f"{bag}/p1"]
    assert fs.cat_file(f"{bag}/p1") == b"second"
    with fs.client.open(bag) as f:
        assert f.read() == b"first,second"


def test_environment_meta_is_used(nk_meta, nk_dir):
    assert os.environ["NK_META"] == nk_meta
    fs = fsspec.filesystem("nk")
    fs.pipe_file(f"{nk_dir}/env", b"env")
    assert fsspec.filesystem("nk", meta=nk_meta).cat_file(f"{nk_dir}/env") == b"env"
