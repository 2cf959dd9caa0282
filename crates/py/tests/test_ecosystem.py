"""pandas, PyArrow and Dask use `nk://` unchanged: each round trip on the
session's NodeKernel cluster gives the same result as on the local disk."""

from __future__ import annotations

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from conftest import run_script

HANG_TIMEOUT_S = 300  # only catches a hang


def _frame(n: int = 2_000, seed: int = 7) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "id": np.arange(n, dtype="int64"),
            "k": rng.choice(["alpha", "beta", "gamma", "delta"], size=n),
            "v": rng.integers(-1_000, 1_000, size=n, dtype="int64"),
            "w": rng.random(n),
            "flag": rng.random(n) < 0.3,
        }
    )


def _sorted(df: pd.DataFrame, by: str = "id") -> pd.DataFrame:
    return df.sort_values(by).reset_index(drop=True)


def _same_columns(df: pd.DataFrame) -> pd.DataFrame:
    # Partition columns come back as categoricals; compare their values.
    out = df.copy()
    for col in out.columns:
        if isinstance(out[col].dtype, pd.CategoricalDtype):
            out[col] = out[col].astype(str)
    return out[sorted(out.columns)]


# A script that ends right after PyArrow read a dataset through nk://:
# PyArrow's threads still wind the read down, and the last of them drops
# the filesystem object, which takes the GIL (see test below).
SCAN_THEN_EXIT = """
import sys
import fsspec
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs

base = sys.argv[1]
arrow_fs = pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fsspec.filesystem("nk")))
t = pa.table({"k": ["a", "b", "a"], "v": [1, 2, 3]})
ds.write_dataset(t, base, format="parquet", filesystem=arrow_fs, partitioning=["k"])
del arrow_fs
ds.dataset(base, format="parquet", filesystem=pyarrow.fs.PyFileSystem(
    pyarrow.fs.FSSpecHandler(fsspec.filesystem("nk"))), partitioning=["k"]).to_table()
"""


def test_a_script_ending_right_after_a_pyarrow_read_exits_cleanly(nk_dir, tmp_path):
    """PyArrow's scanner threads may still hold the GIL-taking filesystem
    object when the script ends; on Python before 3.14 such a thread that
    gets the GIL while Python finalizes aborts the process ("terminate
    called without an active exception"; apache/arrow#36389). Before
    nodekernel's exit hook let them finish, 15 of 20 such runs aborted."""
    script = tmp_path / "scan_then_exit.py"
    script.write_text(SCAN_THEN_EXIT)
    for i in range(8):
        proc = run_script(script, f"{nk_dir}/run{i}", cwd=tmp_path)
        assert proc.returncode == 0, (i, proc.returncode, proc.stderr[-2000:])


# ---------------------------------------------------------------------------
# pandas


def test_pandas_parquet_file_round_trip(nk_dir, tmp_path):
    df = _frame()
    url = f"nk://{nk_dir}/pandas/x.parquet"  # parent directory does not exist yet
    df.to_parquet(url)
    local = tmp_path / "x.parquet"
    df.to_parquet(local)

    back = pd.read_parquet(url)
    pd.testing.assert_frame_equal(back, pd.read_parquet(local))
    pd.testing.assert_frame_equal(back, df)
    fs = fsspec.filesystem("nk")
    assert fs.cat_file(f"{nk_dir}/pandas/x.parquet") == local.read_bytes()


def test_pandas_partitioned_parquet_round_trip(nk_dir, tmp_path):
    df = _frame()
    url = f"nk://{nk_dir}/pandas/dataset"
    df.to_parquet(url, partition_cols=["k"])
    local = tmp_path / "dataset"
    df.to_parquet(local, partition_cols=["k"])

    fs = fsspec.filesystem("nk")
    parts = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{nk_dir}/pandas/dataset", detail=False))
    assert parts == sorted(p.name for p in local.iterdir())
    assert parts == ["k=alpha", "k=beta", "k=delta", "k=gamma"]

    back = _sorted(pd.read_parquet(url))
    local_back = _sorted(pd.read_parquet(local))
    pd.testing.assert_frame_equal(back, local_back)
    pd.testing.assert_frame_equal(_same_columns(back), _same_columns(df))


def test_pandas_csv_round_trip(nk_dir, tmp_path):
    df = _frame(500)
    url = f"nk://{nk_dir}/pandas/x.csv.gz"
    df.to_csv(url, index=False)  # compression inferred from the name
    df.to_csv(tmp_path / "x.csv.gz", index=False)
    back = pd.read_csv(url)
    pd.testing.assert_frame_equal(back, pd.read_csv(tmp_path / "x.csv.gz"))
    pd.testing.assert_frame_equal(back, df)


# ---------------------------------------------------------------------------
# PyArrow


def _arrow_table(n: int = 3_000) -> pa.Table:
    return pa.Table.from_pandas(_frame(n), preserve_index=False)


def test_pyarrow_dataset_round_trip(nk_meta, nk_dir, tmp_path):
    table = _arrow_table()
    nk = pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem("nk", meta=nk_meta)))
    local = pafs.LocalFileSystem()
    base_nk = f"{nk_dir}/arrow/ds"
    base_local = str(tmp_path / "ds")

    for fs, base in ((nk, base_nk), (local, base_local)):
        ds.write_dataset(
            table,
            base,
            format="parquet",
            filesystem=fs,
            partitioning=ds.partitioning(pa.schema([("k", pa.string())]), flavor="hive"),
            max_rows_per_file=500,
            max_rows_per_group=250,
        )

    def read(fs, base):
        d = ds.dataset(base, format="parquet", filesystem=fs, partitioning="hive")
        return d, d.to_table().sort_by("id")

    nk_ds, nk_table = read(nk, base_nk)
    local_ds, local_table = read(local, base_local)
    assert nk_table.equals(local_table)
    assert nk_table.num_rows == table.num_rows
    assert sorted(f[len(base_nk) :] for f in nk_ds.files) == sorted(
        f[len(base_local) :] for f in local_ds.files
    )
    assert len(nk_ds.files) >= 8  # several files per partition

    # Filter pushdown and column projection read only parts of the files.
    expr = (ds.field("k") == "beta") & (ds.field("v") > 0)
    got = nk_ds.to_table(columns=["id", "v"], filter=expr).sort_by("id")
    want = local_ds.to_table(columns=["id", "v"], filter=expr).sort_by("id")
    assert got.equals(want) and got.num_rows > 0


@pytest.mark.parametrize("form", ["relative", "absolute"])
def test_pyarrow_partitioned_dataset_by_relative_or_absolute_base(nk_meta, nk_dir, form):
    """`PyFileSystem(FSSpecHandler(fs))` reads back a partitioned dataset
    written under a base dir with or without its leading `/`: the handler
    checks that every file the filesystem finds starts with the base dir
    as given (the relative form failed: "GetFileInfo() yielded path
    '/...', which is outside base dir '...'")."""
    base = f"{nk_dir}/arrowds" if form == "absolute" else f"{nk_dir[1:]}/arrowds"
    table = _arrow_table(1_000)
    want = table.sort_by("id")
    fs = fsspec.filesystem("nk", meta=nk_meta)
    nk = pafs.PyFileSystem(pafs.FSSpecHandler(fs))

    ds.write_dataset(
        table,
        f"{base}/ds",
        format="parquet",
        filesystem=nk,
        partitioning=ds.partitioning(pa.schema([("k", pa.string())]), flavor="hive"),
        max_rows_per_file=300,
        max_rows_per_group=150,
    )
    d = ds.dataset(f"{base}/ds", format="parquet", filesystem=nk, partitioning="hive")
    assert len(d.files) >= 4 and all(f.startswith(f"{base}/ds/k=") for f in d.files)
    # The partition column comes back as `string` (pandas made it `large_string`).
    assert d.to_table().select(table.column_names).cast(table.schema).sort_by("id").equals(want)

    # pq.write_to_dataset and pq.read_table, given the fsspec filesystem
    # itself (PyArrow wraps it in the same handler).
    pq.write_to_dataset(table, f"{base}/pq", partition_cols=["k"], filesystem=fs)
    back = pq.read_table(f"{base}/pq", filesystem=fs)  # `k` comes back dictionary-encoded
    assert back.select(table.column_names).cast(table.schema).sort_by("id").equals(want)
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{base}/pq", detail=False)) == [
        "k=alpha",
        "k=beta",
        "k=delta",
        "k=gamma",
    ]
    assert all(p.startswith(f"{base}/") for p in fs.find(base))


def test_pyarrow_parquet_with_fsspec_filesystem(nk_dir, tmp_path):
    table = _arrow_table(1_000)
    fs = fsspec.filesystem("nk")
    pq.write_table(table, f"{nk_dir}/arrow/t.parquet", filesystem=fs, row_group_size=100)
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=100)
    back = pq.read_table(f"{nk_dir}/arrow/t.parquet", filesystem=fs)
    assert back.equals(pq.read_table(tmp_path / "t.parquet"))
    with fs.open(f"{nk_dir}/arrow/t.parquet", "rb") as f:
        meta = pq.ParquetFile(f).metadata
        assert (meta.num_rows, meta.num_row_groups) == (1_000, 10)
        one = pq.ParquetFile(f).read_row_group(3)
    assert one.equals(table.slice(300, 100))


# ---------------------------------------------------------------------------
# Dask


@pytest.fixture(scope="module")
def dask_client(cluster):
    """Two worker processes (they inherit NK_META from the test process)."""
    distributed = pytest.importorskip("distributed")
    lc = distributed.LocalCluster(
        n_workers=2,
        processes=True,
        threads_per_worker=1,
        dashboard_address=":0",
        death_timeout=HANG_TIMEOUT_S,
    )
    client = distributed.Client(lc, timeout=HANG_TIMEOUT_S)
    try:
        yield client
    finally:
        client.close(timeout=HANG_TIMEOUT_S)
        try:
            lc.close(timeout=HANG_TIMEOUT_S)
        except TimeoutError:
            # distributed waits only 5 s for a worker process to exit; on a
            # loaded 2-core machine that can run out after the job's results
            # were checked. The nanny has killed the process by then.
            pass


def _dask_job(client, src: str, dst: str) -> pd.DataFrame:
    import dask.dataframe as dd

    df = dd.read_csv(f"{src}/part-*.csv")
    out = df.groupby("k").agg({"v": "sum", "w": "mean", "id": "count"})
    out = out.rename(columns={"id": "n"})
    out.to_parquet(dst)
    back = dd.read_parquet(dst).compute()
    return back.sort_index()


def test_dask_groupby_over_nk(dask_client, nk_dir, tmp_path):
    df = _frame(4_000)
    fs = fsspec.filesystem("nk")
    local_in = tmp_path / "in"
    local_in.mkdir()
    for i in range(4):
        part = df.iloc[i * 1_000 : (i + 1) * 1_000]
        with fs.open(f"{nk_dir}/dask/in/part-{i}.csv", "w") as f:
            part.to_csv(f, index=False)
        part.to_csv(local_in / f"part-{i}.csv", index=False)

    # The tasks run in the worker processes, which open nk:// themselves.
    pids = dask_client.run(lambda: __import__("os").getpid())
    assert len(pids) == 2

    nk_result = _dask_job(dask_client, f"nk://{nk_dir}/dask/in", f"nk://{nk_dir}/dask/out")
    local_result = _dask_job(dask_client, str(local_in), str(tmp_path / "out"))

    pd.testing.assert_frame_equal(nk_result, local_result)
    expected = df.groupby("k").agg(v=("v", "sum"), w=("w", "mean"), n=("id", "count"))
    pd.testing.assert_frame_equal(
        nk_result, expected, check_dtype=False, check_index_type=False, check_names=False
    )
    out_files = fs.find(f"{nk_dir}/dask/out")  # the output is on NodeKernel
    assert out_files and all(p.endswith(".parquet") for p in out_files)
    # The workers connected their own NodeKernel clients to read and write.
    clients = dask_client.run(
        lambda: sum(
            k[0] == __import__("os").getpid()
            for k in __import__("nodekernel.fsspec", fromlist=["_clients"])._clients
        )
    )
    assert sum(clients.values()) >= 1
