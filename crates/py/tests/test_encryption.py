"""Client-side encryption (`docs/encryption.md`) from Python: a class with
`encrypt = true` round-trips through the client holding the key, its block
file holds no plaintext, a changed stored byte raises `nodekernel.Integrity`
(an OSError, EIO), and a client without the key gets `Unauthenticated`."""

from __future__ import annotations

import errno
import pathlib
import subprocess

import pytest

import nodekernel

LINE = b"plaintext that the encrypted file class must never hold\n"


def test_an_encrypted_class_round_trips_and_a_tamper_raises_integrity(tmp_path, monkeypatch):
    from conftest import Cluster, nk_binary

    key = tmp_path / "key"
    subprocess.run([nk_binary(), "key", "new", str(key)], check=True, capture_output=True)
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    cfg = tmp_path / "nk.toml"
    cfg.write_text(
        '[[class]]\nid = 0\nname = "dram"\n'
        '[[class]]\nid = 1\nname = "file"\nencrypt = true\n'
        "[client]\ntimeout_ms = 120000\n"
    )
    monkeypatch.setenv("NK_ENCRYPTION_KEY_FILE", str(key))
    # The file tier only: the bytes live in its block file.
    cluster = Cluster(dram="0", file="64MiB", extra=("--config", str(cfg)))
    try:
        blocks = pathlib.Path(cluster.dir) / "data" / "store-0" / "blocks"
        with nodekernel.connect(cluster.meta, str(cfg)) as c:
            # A non-enumerable Table writes no child records: the only
            # bytes a put changes are the value's.
            c.mkdir("/t", type="table", enumerable=False)
            small = LINE * 3
            c.put("/t/small", small)
            assert c.get("/t/small") == small
            before = blocks.read_bytes()
            value = LINE * 6000  # whole blocks, not a piece
            c.put("/t/k", value)
            assert c.get("/t/k") == value
            assert c.get("/t/small") == small
            assert c.stat("/t/k")["encrypted"] is True
            after = blocks.read_bytes()
            assert LINE[:24] not in after, "plaintext in the encrypted class's block file"
            changed = next(i for i in range(len(after)) if after[i] != before[i])

            # One flipped byte of the stored ciphertext: Integrity, no bytes.
            with open(blocks, "r+b") as f:
                f.seek(changed + 1000)
                b = f.read(1)
                f.seek(changed + 1000)
                f.write(bytes([b[0] ^ 0x01]))
            with pytest.raises(nodekernel.Integrity) as e:
                c.get("/t/k")
            assert isinstance(e.value, OSError) and isinstance(e.value, nodekernel.Error)
            assert e.value.errno == errno.EIO
            assert e.value.code == "Integrity" and "authentication" in str(e.value)
            assert c.get("/t/small") == small, "other values are unharmed"

        # Without the key: a clear refusal, not ciphertext.
        monkeypatch.delenv("NK_ENCRYPTION_KEY_FILE")
        with nodekernel.connect(cluster.meta, str(cfg)) as c:
            with pytest.raises(nodekernel.Unauthenticated) as e:
                c.get("/t/small")
            assert "encryption_key_file" in str(e.value)
    finally:
        cluster.stop()
