//! Several hosts on one machine, for multi-host tests: one network
//! namespace per host, each with `lo` up and one veth link (`eth0`) to a
//! bridge that lives in a "switch" namespace of its own, so the root
//! namespace is never changed. Processes (`nk meta`, `nk store`, clients)
//! run inside a host with `ip netns exec`.
//!
//! Every [`Net`] takes a fresh name prefix and subnet from the process id
//! and a counter (tests run in parallel in one binary): the namespaces
//! are `nk<pid>x<n>sw` and `nk<pid>x<n>h<i>`, the subnet `10.A.B.0/24`
//! with host `i` at `.i+1`. Hosts know each other's link addresses
//! statically (permanent neighbour entries), so a cut link
//! ([`Net::cut`]) silently drops packets: nothing answers, not even an
//! ARP failure, and a peer sees its own timeout.
//!
//! Teardown is a drop guard: [`Net`]'s `Drop` kills every process started
//! through it (`SIGKILL`) and deletes its namespaces, also when the test
//! panics. Processes also get `SIGKILL` when the thread that started them
//! ends (`PR_SET_PDEATHSIG`), in case the test process itself is killed;
//! namespaces left behind by a test process that no longer runs are
//! deleted by the next [`Net::new`].
//!
//! Needs root and `ip netns`. [`Net::new`] returns `None` after printing
//! `SKIPPED: needs root and ip netns` when they are missing, unless
//! `NK_REQUIRE_NETNS=1`, which makes it panic instead.
#![allow(dead_code)] // not every test binary uses every helper

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// One host: a network namespace with one address.
#[derive(Debug, Clone)]
pub struct Host {
    pub index: usize,
    /// The namespace's name.
    pub ns: String,
    /// Its address on the shared link.
    pub ip: String,
    /// The name of its switch port (in the switch namespace).
    port: String,
    mac: String,
}

impl Host {
    /// `program` run inside this host (`ip netns exec NS program`).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns]).arg(program);
        c
    }

    /// `nk args` inside this host with the config file `config`, the
    /// tests' cluster token and no other cluster settings from the
    /// environment.
    pub fn nk(&self, config: &std::path::Path, args: &[&str]) -> Command {
        let mut c = self.command(super::NK);
        c.args(args)
            .env_remove("NK_META")
            .env("NK_CONFIG", config)
            .env("NK_TOKEN_FILE", super::token_file())
            .env("NK_RUNTIME_DIR", super::runtime_dir());
        c
    }
}

/// A process started in a host; killed when dropped (and by [`Net`]'s
/// drop).
pub struct Proc {
    child: Arc<Mutex<Child>>,
    pub host: usize,
}

impl Proc {
    /// `kill -9`, and waits for it to be gone.
    pub fn sigkill(&self) {
        let mut c = self.child.lock().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    pub fn id(&self) -> u32 {
        self.child.lock().unwrap().id()
    }

    /// Its stdin, stdout (taken once).
    pub fn take_stdio(
        &self,
    ) -> (
        Option<std::process::ChildStdin>,
        Option<std::process::ChildStdout>,
    ) {
        let mut c = self.child.lock().unwrap();
        (c.stdin.take(), c.stdout.take())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let mut c = self.child.lock().unwrap_or_else(|p| p.into_inner());
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Hosts joined by one switch; see the module docs.
pub struct Net {
    pub prefix: String,
    switch: String,
    pub hosts: Vec<Host>,
    procs: Mutex<Vec<Arc<Mutex<Child>>>>,
    /// Namespaces created so far (deleted on drop).
    made: Vec<String>,
}

/// Runs `ip args`; `Err` with its stderr when it fails.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip {args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Whether this is a test that cannot run here: prints the skip notice,
/// or panics with `why` when `NK_REQUIRE_NETNS` is set.
fn skip(why: &str) -> Option<Net> {
    if std::env::var_os("NK_REQUIRE_NETNS").is_some_and(|v| !v.is_empty() && v != "0") {
        panic!("NK_REQUIRE_NETNS is set but network namespaces are unavailable: {why}");
    }
    // Straight to the process's stderr: the test harness captures
    // `eprintln!`, and a skip must be seen.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: needs root and ip netns ({why}); set NK_REQUIRE_NETNS=1 to fail instead"
    );
    None
}

/// Deletes namespaces of earlier test processes that no longer run
/// (left behind when such a process was killed before its drop guards).
fn remove_stale() {
    let Ok(dir) = std::fs::read_dir("/var/run/netns") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("nk")
            .and_then(|r| r.split_once('x'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

impl Net {
    /// `n` hosts on one switch, or `None` (after printing why) when this
    /// machine cannot make namespaces and `NK_REQUIRE_NETNS` is not set.
    pub fn new(n: usize) -> Option<Net> {
        assert!((1..=200).contains(&n));
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return skip("not root");
        }
        remove_stale();
        let pid = std::process::id();
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("nk{pid}x{k}");
        let switch = format!("{prefix}sw");
        let mut net = Net {
            prefix: prefix.clone(),
            switch: switch.clone(),
            hosts: Vec::new(),
            procs: Mutex::new(Vec::new()),
            made: Vec::new(),
        };
        if let Err(e) = ip(&["netns", "add", &switch]) {
            return skip(&e);
        }
        net.made.push(switch.clone());
        // From here on a failure is a bug, not a missing feature: panic,
        // and the drop guard removes what was made.
        let must = |args: &[&str]| ip(args).unwrap_or_else(|e| panic!("setting up {prefix}: {e}"));
        must(&["-n", &switch, "link", "add", "br0", "type", "bridge"]);
        must(&["-n", &switch, "link", "set", "br0", "up"]);
        // A subnet of this net's own (namespaces are isolated anyway).
        let (a, b) = (20 + (pid % 200) as u8, (k % 256) as u8);
        let mut hosts = Vec::new();
        for i in 0..n {
            let ns = format!("{prefix}h{i}");
            must(&["netns", "add", &ns]);
            net.made.push(ns.clone());
            hosts.push(Host {
                index: i,
                ns,
                ip: format!("10.{a}.{b}.{}", i + 1),
                port: format!("p{i}"),
                mac: format!("02:4e:4b:00:{:02x}:{:02x}", i / 256, i % 256),
            });
        }
        for h in &hosts {
            let ns = h.ns.as_str();
            let cidr = format!("{}/24", h.ip);
            let steps: [&[&str]; 7] = [
                &["-n", ns, "link", "set", "lo", "up"],
                // The host's end is created straight in its namespace.
                &[
                    "-n", &switch, "link", "add", &h.port, "type", "veth", "peer", "name", "eth0",
                    "netns", ns,
                ],
                &["-n", &switch, "link", "set", &h.port, "master", "br0"],
                &["-n", &switch, "link", "set", &h.port, "up"],
                &["-n", ns, "link", "set", "eth0", "address", &h.mac],
                &["-n", ns, "addr", "add", &cidr, "dev", "eth0"],
                &["-n", ns, "link", "set", "eth0", "up"],
            ];
            for s in steps {
                must(s);
            }
        }
        for h in &hosts {
            for o in hosts.iter().filter(|o| o.index != h.index) {
                must(&[
                    "-n",
                    &h.ns,
                    "neigh",
                    "replace",
                    &o.ip,
                    "lladdr",
                    &o.mac,
                    "dev",
                    "eth0",
                    "nud",
                    "permanent",
                ]);
            }
        }
        net.hosts = hosts;
        Some(net)
    }

    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    /// Starts `cmd` (made by [`Host::command`] or [`Host::nk`]) as a
    /// process this net kills at teardown. Call it from the test's own
    /// thread: the process is killed when the starting thread ends.
    pub fn spawn(&self, host: usize, mut cmd: Command) -> Proc {
        // SAFETY: only async-signal-safe calls (prctl) between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = Arc::new(Mutex::new(cmd.spawn().expect("spawn in a host")));
        self.procs.lock().unwrap().push(child.clone());
        Proc { child, host }
    }

    /// Starts a long-running `nk` role in `host` with the config file
    /// `config`, and returns it once it printed a first line containing
    /// `ready`, with the last word of that line (the address). Later
    /// output is drained so the role never blocks on it.
    pub fn start_role(
        &self,
        host: usize,
        config: &std::path::Path,
        args: &[&str],
        ready: &str,
    ) -> (Proc, String) {
        let mut cmd = self.hosts[host].nk(config, args);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let p = self.spawn(host, cmd);
        let (_, out) = p.take_stdio();
        let mut lines = BufReader::new(out.expect("piped stdout")).lines();
        let line = match lines.next() {
            Some(Ok(l)) => l,
            other => panic!("nk {args:?} in host {host} printed no first line: {other:?}"),
        };
        assert!(line.contains(ready), "unexpected first line: {line}");
        std::thread::spawn(move || for _ in lines {});
        let last = line.rsplit(' ').next().unwrap().to_string();
        (p, last)
    }

    /// Runs `nk args` in `host` to its end.
    pub fn nk(&self, host: usize, config: &std::path::Path, args: &[&str]) -> Output {
        self.hosts[host]
            .nk(config, args)
            .stdin(Stdio::null())
            .output()
            .expect("run nk in a host")
    }

    /// Cuts `host`'s link at the switch: its packets are dropped, nothing
    /// is refused.
    pub fn cut(&self, host: usize) {
        let h = &self.hosts[host];
        ip(&["-n", &self.switch, "link", "set", &h.port, "down"]).unwrap();
    }

    /// Mends a link cut by [`Net::cut`].
    pub fn mend(&self, host: usize) {
        let h = &self.hosts[host];
        ip(&["-n", &self.switch, "link", "set", &h.port, "up"]).unwrap();
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for c in self.procs.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let mut c = c.lock().unwrap_or_else(|p| p.into_inner());
            // A child already waited for is not signalled again.
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in self.made.iter().rev() {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("teardown: {e}");
            }
        }
    }
}
