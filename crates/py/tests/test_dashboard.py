"""The admin dashboard (`/` of the metadata server's admin endpoint) in
headless Chromium: it must render the cluster's servers and classes, draw
its charts from live traffic, and log no console or page error.

Needs Debian's Chromium (`/usr/bin/chromium`, or `NK_CHROMIUM`) and the
`playwright` package; skipped without them (scripts/test.sh installs both).
With `NK_DASHBOARD_SCREENSHOT=PATH` it also writes a screenshot there
(docs/img/dashboard.png is made that way).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
import time

import pytest

from conftest import HANG_S, Cluster, nk_binary

CHROMIUM = os.environ.get("NK_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _traffic(cluster: Cluster, stop: threading.Event, errors: list[str]) -> None:
    """Writes and reads files over the network (no shared memory, so the
    storage servers see every byte) until `stop` is set."""
    cfg = os.path.join(cluster.dir, "net-client.toml")
    with open(cfg, "w") as f:
        f.write(f"[client]\nshared_memory = false\ntimeout_ms = {HANG_S * 1000}\n")
    env = {**os.environ, "NK_META": cluster.meta, "NK_CONFIG": cfg}
    src = os.path.join(cluster.dir, "payload")
    with open(src, "wb") as f:
        f.write(os.urandom(6 << 20))
    i = 0
    while not stop.is_set():
        path = f"/traffic{i % 4}"
        for args in (
            ["rm", path],
            ["put", "--class", str(i % 2), src, path],
            ["get", "-f", path, os.path.join(cluster.dir, "back")],
        ):
            r = subprocess.run([cluster.bin, *args], env=env, capture_output=True, text=True)
            if r.returncode != 0 and args[0] != "rm":
                errors.append(f"nk {' '.join(args)}: {r.stderr}")
                return
        i += 1


def _missing(why: str) -> None:
    """Skips, or fails where the browser is required (scripts/test.sh)."""
    if os.environ.get("NK_REQUIRE_BROWSER", "0") not in ("", "0"):
        pytest.fail(f"NK_REQUIRE_BROWSER is set but {why}")
    pytest.skip(why)


def test_dashboard_renders_live_data_without_errors():
    try:
        from playwright import sync_api
    except ImportError:
        _missing("the playwright package is not installed")
    if not os.path.exists(CHROMIUM):
        _missing(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    # A tenant, and below a quota root: the quotas-and-tenants table.
    setup = tempfile.mkdtemp(prefix="nk-dashboard-")
    token = os.path.join(setup, "a.token")
    subprocess.run([nk_binary(), "token", "new", token], check=True, capture_output=True)
    cfg = os.path.join(setup, "nk.toml")
    with open(cfg, "w") as f:
        f.write(
            f'[[security.tenant]]\nname = "a"\ntoken_file = "{token}"\n'
            'root = "/tenants/a"\nrights = ["read", "write"]\n'
        )
    cluster = Cluster(dram="64MiB", file="128MiB", extra=("--config", cfg))
    env = {**os.environ, "NK_META": cluster.meta}
    for args in (["mkdir", "/q"], ["quota", "set", "/q", "--bytes", "32MiB", "--nodes", "1000"]):
        subprocess.run([cluster.bin, *args], env=env, check=True, capture_output=True)
    stop = threading.Event()
    errors: list[str] = []
    traffic = threading.Thread(target=_traffic, args=(cluster, stop, errors), daemon=True)
    try:
        assert cluster.admin, "nk up printed no admin URL"
        traffic.start()
        problems: list[str] = []
        profile = tempfile.mkdtemp(prefix="nk-chromium-")
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.on(
                    "console",
                    lambda m: (
                        problems.append(f"console {m.type}: {m.text}")
                        if m.type in ("error", "warning")
                        else None
                    ),
                )
                page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
                page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
                page.goto(cluster.admin, timeout=HANG_S * 1000)
                # Both storage servers and both classes appear.
                page.wait_for_function(
                    "document.querySelectorAll('#servers tbody tr.server').length === 2",
                    timeout=HANG_S * 1000,
                )
                page.wait_for_function(
                    "document.querySelectorAll('#classes tbody tr').length === 2",
                    timeout=HANG_S * 1000,
                )
                # The traffic shows up as throughput (from the heartbeats).
                page.wait_for_function(
                    "document.getElementById('c-write').textContent.match(/[1-9]/) !== null"
                    " && !document.getElementById('c-write').textContent.startsWith('0 B')",
                    timeout=HANG_S * 1000,
                )
                assert page.text_content("#ready") == "ready"
                # The lifecycle cards read the metadata server's counters.
                assert re.fullmatch(r"\d+ / \d+", page.text_content("#c-sessions"))
                assert re.fullmatch(r"[\d,]+", page.text_content("#c-expired"))
                assert re.fullmatch(r"[\d,]+", page.text_content("#c-quota"))
                # Each quota root's and each tenant's usage and limits.
                page.wait_for_function(
                    "document.querySelector('#usage tr[data-root=\"/q\"]') !== null"
                    " && document.querySelector('#usage tr[data-tenant=\"a\"]') !== null",
                    timeout=HANG_S * 1000,
                )
                cells = page.locator('#usage tr[data-root="/q"] td').all_text_contents()
                assert cells[0] == "/q" and cells[3] == "32.0 MiB" and cells[5] == "1,000", cells
                assert page.text_content('#usage tr[data-tenant="a"] td') == "tenant a"
                rows = page.locator("#servers tbody tr.server")
                addrs = {rows.nth(i).get_attribute("data-addr") for i in range(2)}
                assert all(a and ":" in a for a in addrs), addrs
                # Let the charts gather some history (more for a screenshot).
                shot = os.environ.get("NK_DASHBOARD_SCREENSHOT")
                time.sleep(45 if shot else 5)
                if shot:
                    page.screenshot(path=shot, full_page=True)
                assert page.text_content("#error") == ""
            finally:
                browser.close()
                shutil.rmtree(profile, ignore_errors=True)
        assert not errors, errors
        assert not problems, problems
    finally:
        stop.set()
        traffic.join(timeout=HANG_S)
        cluster.stop()
        shutil.rmtree(setup, ignore_errors=True)
