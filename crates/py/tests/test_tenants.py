"""Tenants through the Python client and fsspec (docs/security.md, Tenants):
`nk up` with `[[security.tenant]]` entries; a tenant's client, configured
with its own token, sees its root as `/`, nothing outside it, and gets
PermissionError beyond its rights and OSError EDQUOT at its root's quota."""

from __future__ import annotations

import errno
import subprocess

import fsspec
import pytest

import nodekernel
from conftest import Cluster, nk_binary
from nodekernel.errors import NotFound, QuotaExceeded, Unauthenticated


def token(path) -> str:
    subprocess.run([nk_binary(), "token", "new", str(path)], check=True, capture_output=True)
    return str(path)


@pytest.fixture(scope="module")
def tenants(tmp_path_factory):
    d = tmp_path_factory.mktemp("tenants")
    cfg = d / "nk.toml"
    cfg.write_text(
        f"""
[[security.tenant]]
name = "a"
token_file = "{token(d / "a.token")}"
root = "/tenants/a"
rights = ["read", "write"]

[[security.tenant]]
name = "ro"
token_file = "{token(d / "ro.token")}"
root = "/tenants/a"
rights = ["read"]
"""
    )
    cluster = Cluster(dram="96MiB", extra=("--config", str(cfg)))
    configs = {}
    for name in ("a", "ro"):
        c = d / f"{name}.toml"
        c.write_text(f'[security]\ntoken_file = "{d / (name + ".token")}"\n')
        configs[name] = str(c)
    yield cluster, configs
    cluster.stop()


def test_a_tenant_sees_its_root_as_slash(tenants):
    cluster, configs = tenants
    with (
        nodekernel.connect(cluster.meta) as admin,
        nodekernel.connect(cluster.meta, config=configs["a"]) as a,
    ):
        admin.mkdir("/private")
        with admin.create("/private/f") as f:
            f.write(b"the admin's")
        assert a.ls("/") == []
        a.mkdir("/t", type="table")
        a.put("/t/k", b"a's value")
        assert admin.get("/tenants/a/t/k") == b"a's value"
        assert a.ls("/") == ["t"]
        with pytest.raises(NotFound) as e:
            a.stat("/private/f")
        assert "/tenants/a" not in str(e.value)
        # fsspec, with the tenant's settings: the same view.
        fs = fsspec.filesystem("nk", meta=cluster.meta, config=configs["a"])
        assert fs.ls("/", detail=False) == ["/t"]
        assert fs.cat("/t/k") == b"a's value"
        assert not fs.exists("/private")
        a.delete("/t", recursive=True)


def test_rights_and_the_roots_quota_hold(tenants):
    cluster, configs = tenants
    with (
        nodekernel.connect(cluster.meta) as admin,
        nodekernel.connect(cluster.meta, config=configs["a"]) as a,
        nodekernel.connect(cluster.meta, config=configs["ro"]) as ro,
    ):
        a.mkdir("/q", type="table")
        a.put("/q/k", b"x" * 100)
        assert ro.get("/q/k") == b"x" * 100
        with pytest.raises(Unauthenticated) as e:
            ro.put("/q/other", b"y")
        assert isinstance(e.value, PermissionError)
        assert e.value.errno == errno.EACCES
        admin.set_quota("/tenants/a", nodes=a.du("/")["nodes"])
        try:
            with pytest.raises(QuotaExceeded) as e:
                a.put("/q/more", b"z")
            assert e.value.errno == errno.EDQUOT
            assert "/tenants" not in str(e.value)
            with pytest.raises(NotFound):
                a.stat("/q/more")
        finally:
            admin.set_quota("/tenants/a", nodes=None)
        a.delete("/q", recursive=True)
