"""Several hosts on one machine for the Spark cluster test: the topology of
crates/cli/tests/cli/common/netns.rs, in Python. One network namespace per
host with `lo` up and one veth link (`eth0`) to a bridge in a "switch"
namespace of its own (the root namespace is never changed), and permanent
neighbour entries between the hosts.

Names are `nkpy<pid>x<n>sw` and `nkpy<pid>x<n>h<i>`, host `i` at
`10.A.B.(i+1)`. The Rust harness's stale-namespace sweep parses `nk<pid>x`
and so leaves these alone; this module sweeps its own.

Teardown (`Net.close`, also as a context manager) must leave nothing behind
even when a test fails or a process forked children the test never saw (a
Spark worker's executors, their Python workers): every process still in one
of the namespaces (`ip netns pids`) gets SIGKILL, then the namespaces are
deleted. Processes started here also get SIGKILL when the test process dies
(PR_SET_PDEATHSIG), and the next `Net` sweeps namespaces of test processes
that no longer run.

Needs root and `ip netns`: `Net.create` returns None after printing why,
unless NK_REQUIRE_NETNS is set, when it raises instead."""

from __future__ import annotations

import ctypes
import itertools
import os
import signal
import subprocess
import sys
import time

PREFIX = "nkpy"
_counter = itertools.count()
_PR_SET_PDEATHSIG = 1


class Unavailable(Exception):
    """This machine cannot make network namespaces."""


def required() -> bool:
    v = os.environ.get("NK_REQUIRE_NETNS", "")
    return v not in ("", "0")


def ip(*args: str) -> str:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def _kill_all_in(ns: str) -> None:
    """SIGKILL every process in namespace `ns`, until none is left (a
    dying JVM's children may still be starting)."""
    for _ in range(50):
        try:
            pids = [int(p) for p in ip("netns", "pids", ns).split()]
        except RuntimeError:
            return
        if not pids:
            return
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def _sweep_stale() -> None:
    """Deletes namespaces of earlier test processes that no longer run."""
    try:
        names = os.listdir("/var/run/netns")
    except FileNotFoundError:
        return
    for name in names:
        if not name.startswith(PREFIX) or "x" not in name[len(PREFIX) :]:
            continue
        pid = name[len(PREFIX) :].split("x", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or os.path.exists(f"/proc/{pid}"):
            continue
        _kill_all_in(name)
        try:
            ip("netns", "del", name)
        except RuntimeError:
            pass


def _die_with_parent() -> None:
    # Runs in the child between fork and exec.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Host:
    def __init__(self, index: int, ns: str, addr: str, mac: str):
        self.index = index
        self.ns = ns
        self.ip = addr
        self.mac = mac
        self.port = f"p{index}"

    def argv(self, *argv: str) -> list[str]:
        """`argv` run inside this host."""
        return ["ip", "netns", "exec", self.ns, *argv]


class Net:
    """Hosts joined by one switch; see the module docs."""

    def __init__(self, n: int):
        if os.geteuid() != 0:
            raise Unavailable("not root")
        _sweep_stale()
        k = next(_counter)
        self.prefix = f"{PREFIX}{os.getpid()}x{k}"
        self.switch = f"{self.prefix}sw"
        self.made: list[str] = []
        self.procs: list[subprocess.Popen] = []
        try:
            ip("netns", "add", self.switch)
        except (RuntimeError, FileNotFoundError) as e:
            raise Unavailable(str(e)) from e
        self.made.append(self.switch)
        try:
            self._build(n, k)
        except BaseException:
            self.close()
            raise

    def _build(self, n: int, k: int) -> None:
        sw = self.switch
        ip("-n", sw, "link", "add", "br0", "type", "bridge")
        ip("-n", sw, "link", "set", "br0", "up")
        a, b = 20 + os.getpid() % 200, k % 256
        self.hosts = []
        for i in range(n):
            ns = f"{self.prefix}h{i}"
            ip("netns", "add", ns)
            self.made.append(ns)
            self.hosts.append(Host(i, ns, f"10.{a}.{b}.{i + 1}", f"02:4e:4b:01:00:{i:02x}"))
        for h in self.hosts:
            ip("-n", h.ns, "link", "set", "lo", "up")
            # The host's end is created straight in its namespace.
            ip(*f"-n {sw} link add {h.port} type veth peer name eth0 netns {h.ns}".split())
            ip("-n", sw, "link", "set", h.port, "master", "br0")
            ip("-n", sw, "link", "set", h.port, "up")
            ip("-n", h.ns, "link", "set", "eth0", "address", h.mac)
            ip("-n", h.ns, "addr", "add", f"{h.ip}/24", "dev", "eth0")
            ip("-n", h.ns, "link", "set", "eth0", "up")
        for h in self.hosts:
            for o in self.hosts:
                if o is not h:
                    ip(
                        *f"-n {h.ns} neigh replace {o.ip} lladdr {o.mac} dev eth0 nud permanent".split()
                    )

    @classmethod
    def create(cls, n: int) -> Net | None:
        """`n` hosts, or None (after printing why) when this machine cannot
        make namespaces and NK_REQUIRE_NETNS is not set."""
        try:
            return cls(n)
        except Unavailable as e:
            if required():
                raise RuntimeError(
                    f"NK_REQUIRE_NETNS is set but network namespaces are unavailable: {e}"
                ) from e
            print(
                f"SKIPPED: needs root and ip netns ({e}); set NK_REQUIRE_NETNS=1 to fail instead",
                file=sys.stderr,
            )
            return None

    def spawn(self, host: Host, argv: list[str], log: str, env: dict[str, str]) -> subprocess.Popen:
        """Starts `argv` in `host`, stdout and stderr to the file `log`; a
        process group of its own, killed at close."""
        with open(log, "ab") as out:
            p = subprocess.Popen(
                host.argv(*argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.procs.append(p)
        return p

    def cut(self, host: Host) -> None:
        """Cuts `host`'s link at the switch: its packets are dropped, nothing
        is refused (its processes keep running and see no error)."""
        ip("-n", self.switch, "link", "set", host.port, "down")

    def mend(self, host: Host) -> None:
        """Mends a link cut by `cut`."""
        ip("-n", self.switch, "link", "set", host.port, "up")

    def pids(self, host: Host) -> list[int]:
        """Every process in `host`, whoever started it."""
        return [int(p) for p in ip("netns", "pids", host.ns).split()]

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        # What the processes forked (executors, Python workers), wherever
        # their process group is.
        for ns in self.made:
            _kill_all_in(ns)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        for ns in reversed(self.made):
            try:
                ip("netns", "del", ns)
            except RuntimeError as e:
                print(f"teardown: {e}", file=sys.stderr)
        self.made = []

    def __enter__(self) -> Net:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
