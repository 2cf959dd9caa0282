"""Every wire error code maps to a `nodekernel.Error` subclass and, where one
matches, a builtin; real failures raise the right class with path and code."""

from __future__ import annotations

import errno
import pathlib
import socket

import pytest

import nodekernel
from nodekernel import _native, errors

BUILTIN = {
    "NotFound": (FileNotFoundError, errno.ENOENT),
    "AlreadyExists": (FileExistsError, errno.EEXIST),
    "NotEmpty": (OSError, errno.ENOTEMPTY),
    "TypeMismatch": (OSError, errno.EINVAL),
    "InvalidPath": (ValueError, None),
    "Busy": (OSError, errno.EBUSY),
    "Stale": (OSError, errno.ESTALE),
    "NoSpace": (OSError, errno.ENOSPC),
    "OutOfRange": (ValueError, None),
    "CrossPartition": (OSError, errno.EXDEV),
    "Unavailable": (ConnectionError, errno.ECONNREFUSED),
    "DataLost": (OSError, errno.EIO),
    "Protocol": (OSError, errno.EPROTO),
    "Timeout": (TimeoutError, errno.ETIMEDOUT),
    "InvalidArgument": (ValueError, None),
    "Internal": (Exception, None),
    "LeaseExpired": (OSError, errno.ESTALE),
    "UnknownServer": (ConnectionError, errno.ECONNREFUSED),
    "TryAgain": (BlockingIOError, errno.EAGAIN),
    "WrongPartition": (Exception, None),
    "VersionMismatch": (ConnectionError, errno.EPROTO),
    "Unauthenticated": (PermissionError, errno.EACCES),
    "Integrity": (OSError, errno.EIO),
    "QuotaExceeded": (OSError, errno.EDQUOT),
}


def test_the_table_covers_every_wire_code():
    assert sorted(name for _, name in _native.error_codes()) == sorted(BUILTIN)


@pytest.mark.parametrize("code", sorted(BUILTIN))
def test_code_maps_to_its_class(code):
    exc = errors._from_code(code, "message text", "/some/path")
    builtin, errno_value = BUILTIN[code]
    assert type(exc) is errors.BY_CODE[code]
    assert type(exc).__name__ == code and getattr(nodekernel, code) is type(exc)
    assert isinstance(exc, nodekernel.Error) and isinstance(exc, builtin)
    assert exc.code == code and exc.path == "/some/path" and exc.message == "message text"
    if errno_value is not None:
        assert exc.errno == errno_value and exc.filename == "/some/path"
    assert code in str(exc) and "message text" in str(exc)
    with pytest.raises(builtin):
        raise exc


@pytest.fixture
def nk(nk_meta):
    with nodekernel.connect(nk_meta) as c:
        yield c


def test_real_failures_raise_their_class(nk, nk_dir):
    with pytest.raises(nodekernel.NotFound) as e:
        nk.get(f"{nk_dir}/missing")
    assert e.value.path == f"{nk_dir}/missing" and e.value.code == "NotFound"
    nk.mkdir(f"{nk_dir}/d")
    with pytest.raises(FileExistsError):
        nk.mkdir(f"{nk_dir}/d")
    with nk.create(f"{nk_dir}/d/f") as f:
        f.write(b"x")
    with pytest.raises(nodekernel.NotEmpty) as e:
        nk.delete(f"{nk_dir}/d")
    assert e.value.errno == errno.ENOTEMPTY
    with pytest.raises(nodekernel.TypeMismatch):
        nk.put(f"{nk_dir}/d/kv", b"KeyValues live in Tables")
    with pytest.raises(nodekernel.TypeMismatch):
        nk.get(f"{nk_dir}/d")
    with pytest.raises(nodekernel.InvalidPath):
        nk.mkdir("relative/path")
    with pytest.raises(ValueError):
        nk.stat(f"{nk_dir}//double")


def test_second_writer_is_busy(nk, nk_dir):
    p = f"{nk_dir}/f"
    with nk.open(p, "wb") as w:
        w.write(b"x")
        with pytest.raises(nodekernel.Busy):
            nk.open(p, "ab")


def test_replaced_value_is_stale_for_an_old_handle(nk, nk_dir):
    t = f"{nk_dir}/t"
    nk.mkdir(t, type="table")
    nk.put(f"{t}/k", b"old")
    handle = nk.lookup(f"{t}/k")
    nk.put(f"{t}/k", b"new")
    with pytest.raises(nodekernel.Stale) as e:
        handle.read()
    assert e.value.errno == errno.ESTALE
    assert nk.get(f"{t}/k") == b"new"


def test_unreachable_server_is_unavailable(short_wait_config):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionError) as e:
        nodekernel.connect(f"127.0.0.1:{port}", config=short_wait_config)
    assert isinstance(e.value, nodekernel.Error)


def test_a_default_cluster_takes_clients_of_its_user_without_a_setting(cluster, monkeypatch):
    """`nk up` with no token configured makes its own (secure by default,
    docs/security.md); a client of the same user on this host finds it
    without a setting, one elsewhere is refused naming the setting."""
    monkeypatch.delenv("NK_TOKEN_FILE", raising=False)
    token = pathlib.Path(cluster.dir) / "data" / "token"
    assert token.stat().st_mode & 0o777 == 0o600
    with nodekernel.connect(cluster.meta) as c:
        assert c.status()["servers"]
    monkeypatch.setenv("NK_RUNTIME_DIR", cluster.dir + "/elsewhere")
    with pytest.raises(nodekernel.Unauthenticated) as e:
        nodekernel.connect(cluster.meta)
    assert "NK_TOKEN_FILE" in str(e.value)
    monkeypatch.setenv("NK_TOKEN_FILE", str(token))
    with nodekernel.connect(cluster.meta) as c:
        assert c.status()["servers"]


def test_a_cluster_with_a_token_refuses_clients_without_it(tmp_path, monkeypatch):
    """With `[security] token_file`, a client without the token (or with
    another one) gets `Unauthenticated`, a `PermissionError`; with
    `NK_TOKEN_FILE` it works."""
    from conftest import Cluster

    token = tmp_path / "token"
    token.write_text("a cluster token for the Python tests\n")
    token.chmod(0o600)
    other = tmp_path / "other"
    other.write_text("another token, just as long as that\n")
    other.chmod(0o600)
    cfg = tmp_path / "nk.toml"
    cfg.write_text(f'[security]\ntoken_file = "{token}"\n')
    # The fixture's own `nk status --wait` needs the token too.
    monkeypatch.setenv("NK_TOKEN_FILE", str(token))
    cluster = Cluster(dram="64MiB", extra=("--config", str(cfg)))
    try:
        # As on another host: no runtime directory tells where the token is.
        monkeypatch.setenv("NK_RUNTIME_DIR", str(tmp_path / "elsewhere"))
        for env in (None, str(other)):
            if env is None:
                monkeypatch.delenv("NK_TOKEN_FILE")
            else:
                monkeypatch.setenv("NK_TOKEN_FILE", env)
            with pytest.raises(nodekernel.Unauthenticated) as e:
                nodekernel.connect(cluster.meta)
            assert isinstance(e.value, PermissionError)
            assert e.value.errno == errno.EACCES
            assert "cluster token" in str(e.value)
        monkeypatch.setenv("NK_TOKEN_FILE", str(token))
        with nodekernel.connect(cluster.meta) as c:
            c.mkdir("/t", type="table")
            c.put("/t/k", b"v")
            assert c.get("/t/k") == b"v"
    finally:
        cluster.stop()


def test_a_tls_cluster_serves_clients_trusting_its_authority(tmp_path, monkeypatch):
    """With `[security.tls]` (certificates from `nk tls new`), a client
    with the cluster's authority works over TCP; one without TLS gets
    `Unauthenticated` saying the server requires TLS."""
    import subprocess

    from conftest import Cluster, nk_binary

    pki = tmp_path / "pki"
    subprocess.run(
        [nk_binary(), "tls", "new", str(pki), "--host", "127.0.0.1"],
        check=True,
        capture_output=True,
    )
    # TCP only: no Unix socket and no shared memory, so TLS carries it all.
    tcp_only = "[client]\nunix_socket = false\nshared_memory = false\n"
    cfg = tmp_path / "nk.toml"
    cfg.write_text(
        tcp_only
        + "[security.tls]\n"
        + f'ca_file = "{pki}/ca.pem"\ncert_file = "{pki}/node.pem"\nkey_file = "{pki}/node.key"\n'
    )
    plain = tmp_path / "plain.toml"
    plain.write_text(tcp_only)
    # The fixture's own `nk status --wait` needs TLS too.
    monkeypatch.setenv("NK_CONFIG", str(cfg))
    cluster = Cluster(dram="64MiB", extra=("--config", str(cfg)))
    try:
        value = bytes(range(256)) * 1000
        with nodekernel.connect(cluster.meta) as c:
            c.mkdir("/t", type="table")
            c.put("/t/k", value)
            assert c.get("/t/k") == value
        with pytest.raises(nodekernel.Unauthenticated) as e:
            nodekernel.connect(cluster.meta, config=str(plain))
        assert isinstance(e.value, PermissionError)
        assert "requires TLS" in str(e.value)
    finally:
        cluster.stop()
