//! Multi-host behaviour (`docs/deployment.md`), end to end: several hosts on one
//! machine (network namespaces joined by a bridge, `common::netns`), each
//! running `nk meta`, `nk store` and clients as separate processes, with
//! a location class per host. Faults are real: `kill -9` of storage
//! servers, clients and metadata servers, and a cut link that drops
//! packets.
//!
//! Needs root and `ip netns`; each test prints `SKIPPED: ...` and passes
//! without them unless `NK_REQUIRE_NETNS=1`.
//!
//! Besides `nk` commands, some steps need a client that lives across
//! steps (a writer killed while it holds a lease, data-path counters, a
//! client that was connected before a partition died): the test binary
//! runs itself inside a host as such a client ([`child_client`], driven
//! by one JSON request per line).

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{ChildStdin, ChildStdout, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common;

use common::netns::{Net, Proc};

/// Generous bound that only catches hangs.
const HANG: Duration = Duration::from_secs(120);

/// Deterministic bytes that differ at every offset and between seeds, so
/// a block read from the wrong place or node never matches.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// FNV-1a of `b` (what the child client reports of what it read).
fn fnv(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in b {
        h ^= *x as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Waits for `cond`, polling; panics only on a hang.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < HANG, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

/// Top-level names `/{stem}N`, `per` owned by each of two partitions
/// (the client's hash), in partition order: `[p0 names, p1 names]`.
fn names(stem: &str, per: usize) -> [Vec<String>; 2] {
    let mut out: [Vec<String>; 2] = [Vec::new(), Vec::new()];
    for k in 0.. {
        let n = format!("/{stem}{k}");
        let p = nodekernel_proto::path::partition_of(&n, 2);
        if out[p].len() < per {
            out[p].push(n);
        }
        if out.iter().all(|v| v.len() == per) {
            break;
        }
    }
    out
}

/// One storage server of a test cluster.
#[derive(Clone)]
struct StoreSpec {
    host: usize,
    class: u8,
    file: bool,
    size: &'static str,
}

/// Timeouts of a test cluster, short so that faults show quickly.
#[derive(Clone)]
struct Timing {
    heartbeat_ms: u64,
    dead_after_ms: u64,
    retire_after_ms: u64,
    lease_timeout_ms: u64,
    client_timeout_ms: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            // Dead after 15 missed heartbeats: declaring a killed server
            // dead is under test, live ones must stay alive on a loaded
            // machine.
            heartbeat_ms: 200,
            dead_after_ms: 3_000,
            retire_after_ms: 60_000,
            lease_timeout_ms: 30_000,
            client_timeout_ms: 20_000,
        }
    }
}

/// A cluster spread over the hosts of a [`Net`]: metadata partition `p`
/// on host `metas[p]`, storage servers as listed; every host has a
/// client config (`location = "host<i>"`).
struct Cluster {
    /// Running storage servers (by index in `stores`), killed on drop.
    store_procs: Vec<Option<Proc>>,
    meta_procs: Vec<Option<Proc>>,
    stores: Vec<StoreSpec>,
    /// Registered addresses of the storage servers (latest start).
    store_addrs: Vec<String>,
    meta_addrs: Vec<String>,
    meta_hosts: Vec<usize>,
    dir: tempfile::TempDir,
    timing: Timing,
    /// Dropped last: kills whatever is left and deletes the namespaces.
    net: Net,
}

impl Cluster {
    /// Starts the cluster, or `None` when this machine cannot make
    /// network namespaces (see `common::netns`).
    fn start(hosts: usize, metas: &[usize], stores: &[StoreSpec], timing: Timing) -> Option<Self> {
        let net = Net::new(hosts)?;
        let dir = tempfile::tempdir().unwrap();
        let meta_addrs: Vec<String> = metas
            .iter()
            .map(|h| format!("{}:7000", net.host(*h).ip))
            .collect();
        let list = meta_addrs
            .iter()
            .map(|a| format!("{a:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        let t = &timing;
        let meta_section = format!(
            "dead_after_ms = {}\nretire_after_ms = {}\nlease_timeout_ms = {}\n",
            t.dead_after_ms, t.retire_after_ms, t.lease_timeout_ms
        );
        for (p, _) in metas.iter().enumerate() {
            std::fs::write(
                dir.path().join(format!("meta{p}.toml")),
                format!(
                    "[meta]\n{meta_section}partition = {p}\npartitions = {}\n",
                    metas.len()
                ),
            )
            .unwrap();
        }
        for h in 0..hosts {
            std::fs::write(
                dir.path().join(format!("client-h{h}.toml")),
                format!(
                    "[client]\nmeta = [{list}]\ntimeout_ms = {}\nlocation = \"host{h}\"\n",
                    t.client_timeout_ms
                ),
            )
            .unwrap();
        }
        let mut c = Cluster {
            store_procs: Vec::new(),
            meta_procs: Vec::new(),
            stores: stores.to_vec(),
            store_addrs: Vec::new(),
            meta_addrs,
            meta_hosts: metas.to_vec(),
            dir,
            timing,
            net,
        };
        for p in 0..metas.len() {
            c.meta_procs.push(Some(c.start_meta(p)));
        }
        for (i, s) in stores.iter().enumerate() {
            let cfg = c.dir.path().join(format!("store{i}.toml"));
            let data = c.dir.path().join(format!("store{i}"));
            std::fs::write(
                &cfg,
                format!(
                    "[meta]\n{meta_section}[client]\nmeta = [{list}]\ntimeout_ms = {}\n\
                     [[store]]\nclass = {}\nclass_name = {:?}\nmedium = {:?}\nsize = {:?}\n\
                     listen = \"{}:0\"\nlocation = \"host{}\"\nheartbeat_ms = {}\ndata_dir = {:?}\n",
                    c.timing.client_timeout_ms,
                    s.class,
                    if s.file { "file" } else { "dram" },
                    if s.file { "file" } else { "dram" },
                    s.size,
                    c.net.host(s.host).ip,
                    s.host,
                    c.timing.heartbeat_ms,
                    data.to_str().unwrap(),
                ),
            )
            .unwrap();
            let (proc, addr) = c.start_store_proc(i);
            c.store_procs.push(Some(proc));
            c.store_addrs.push(addr);
        }
        Some(c)
    }

    fn start_meta(&self, p: usize) -> Proc {
        let cfg = self.dir.path().join(format!("meta{p}.toml"));
        let (proc, addr) = self.net.start_role(
            self.meta_hosts[p],
            &cfg,
            &["meta", "--listen", &self.meta_addrs[p]],
            "metadata server listening on",
        );
        assert_eq!(addr, self.meta_addrs[p]);
        proc
    }

    /// Starts storage server `i` (registered with every partition once
    /// it printed its line); its process and registered address.
    fn start_store_proc(&self, i: usize) -> (Proc, String) {
        let cfg = self.dir.path().join(format!("store{i}.toml"));
        self.net
            .start_role(self.stores[i].host, &cfg, &["store"], "storage server 0")
    }

    fn client_config(&self, host: usize) -> PathBuf {
        self.dir.path().join(format!("client-h{host}.toml"))
    }

    /// `nk args` as a client on `host`.
    fn nk(&self, host: usize, args: &[&str]) -> Output {
        self.net.nk(host, &self.client_config(host), args)
    }

    /// `nk args` on `host`, which must succeed; its stdout.
    fn ok(&self, host: usize, args: &[&str]) -> Vec<u8> {
        let o = self.nk(host, args);
        assert!(
            o.status.success(),
            "nk {args:?} on host {host} failed: {}",
            stderr(&o)
        );
        o.stdout
    }

    fn json(&self, host: usize, args: &[&str]) -> Value {
        serde_json::from_slice(&self.ok(host, args)).unwrap()
    }

    /// `nk put [extra] LOCAL path` of `bytes` from `host`.
    fn put(&self, host: usize, path: &str, bytes: &[u8], extra: &[&str]) {
        let local = self
            .dir
            .path()
            .join(format!("put-{}", path.replace('/', "_")));
        std::fs::write(&local, bytes).unwrap();
        let mut args = vec!["put"];
        args.extend_from_slice(extra);
        args.extend([local.to_str().unwrap(), path]);
        self.ok(host, &args);
    }

    /// `nk kv put path -` of `bytes` from `host`.
    fn kv_put(&self, host: usize, path: &str, bytes: &[u8]) {
        let mut p = self
            .net
            .host(host)
            .nk(&self.client_config(host), &["kv", "put", path, "-"]);
        p.stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = p.spawn().unwrap();
        child.stdin.take().unwrap().write_all(bytes).unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "kv put {path}: {}", stderr(&o));
    }

    /// `nk cat path` on `host`: the bytes, or the error (stdout must then
    /// be empty: no partial or wrong bytes).
    fn cat(&self, host: usize, path: &str) -> Result<Vec<u8>, String> {
        let o = self.nk(host, &["cat", path]);
        if o.status.success() {
            Ok(o.stdout)
        } else {
            assert!(
                o.stdout.is_empty(),
                "a failed cat of {path} printed {} bytes",
                o.stdout.len()
            );
            Err(stderr(&o))
        }
    }

    /// The registered address of every block of `path`.
    fn block_addrs(&self, host: usize, path: &str) -> Vec<String> {
        let st = self.json(host, &["stat", path, "--blocks", "--json"]);
        st["block_list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["addr"].as_str().unwrap().to_string())
            .collect()
    }

    fn status(&self, host: usize) -> Value {
        self.json(host, &["status", "--json"])
    }

    /// A long-lived client process on `host` (see [`child_client`]).
    fn child(&self, host: usize) -> Child {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = self.net.host(host).command(exe);
        cmd.args([
            "--exact",
            "multihost::child_client",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("NK_MH_CHILD", "1")
        .env_remove("NK_META")
        .env("NK_CONFIG", self.client_config(host))
        .env("NK_TOKEN_FILE", common::token_file())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        let proc = self.net.spawn(host, cmd);
        let (stdin, stdout) = proc.take_stdio();
        let mut c = Child {
            proc,
            stdin: stdin.unwrap(),
            stdout: BufReader::new(stdout.unwrap()),
        };
        let hello = c.reply();
        assert_eq!(
            hello["ok"], "connected",
            "child client on host {host}: {hello}"
        );
        c
    }
}

/// Used blocks over every storage server in a `nk status --json`.
fn used_blocks(st: &Value) -> u64 {
    st["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["used_blocks"].as_u64().unwrap())
        .sum()
}

/// A client process started by [`Cluster::child`].
struct Child {
    proc: Proc,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Child {
    fn reply(&mut self) -> Value {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "the child client exited");
            // libtest may have printed part of a line before it.
            if let Some(at) = line.find("NKCHILD ") {
                return serde_json::from_str(&line[at + 8..]).unwrap();
            }
        }
    }

    /// Sends one request; its reply: `{"ok": ...}` or
    /// `{"err": {"code", "message"}}`, with `"ms"` it took.
    fn call(&mut self, req: Value) -> Value {
        writeln!(self.stdin, "{req}").unwrap();
        self.stdin.flush().unwrap();
        self.reply()
    }

    /// A request that must succeed; its `ok` value.
    fn ok(&mut self, req: Value) -> Value {
        let r = self.call(req.clone());
        assert!(r.get("err").is_none(), "{req} failed: {r}");
        r["ok"].clone()
    }
}

/// Not a test of its own: the client process of [`Cluster::child`] (this
/// binary run again inside a host with `NK_MH_CHILD=1`). Reads one JSON
/// request per line from stdin and prints one `NKCHILD {json}` reply
/// line per request; stops at the end of stdin.
#[test]
fn child_client() {
    if std::env::var_os("NK_MH_CHILD").is_none() {
        return;
    }
    use nodekernel_client::{Client, CreateOptions, Node, NodeType};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let say = |v: Value| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "NKCHILD {v}").unwrap();
        out.flush().unwrap();
    };
    let err = |e: nodekernel_client::Error| json!({"code": e.code.name(), "message": e.message});
    let cfg = nodekernel_client::discover(None, None).unwrap();
    let client = match rt.block_on(Client::connect(cfg)) {
        Ok(c) => c,
        Err(e) => return say(json!({ "err": err(e) })),
    };
    say(json!({"ok": "connected"}));
    let mut open: std::collections::HashMap<String, Node> = Default::default();
    for line in std::io::stdin().lock().lines() {
        let req: Value = serde_json::from_str(&line.unwrap()).unwrap();
        let path = req["path"].as_str().unwrap_or("").to_string();
        let start = Instant::now();
        let r: Result<Value, nodekernel_client::Error> = rt.block_on(async {
            match req["op"].as_str().unwrap() {
                "create" => {
                    let opts = CreateOptions {
                        local: req["local"].as_bool().unwrap_or(false),
                        ..CreateOptions::default()
                    };
                    let n = client.create(&path, NodeType::File, opts).await?;
                    open.insert(path, n);
                    Ok(json!(null))
                }
                "open_write" => {
                    let n = client.open_write(&path).await?;
                    let size = n.size();
                    open.insert(path, n);
                    Ok(json!(size))
                }
                "append" => {
                    let bytes = pattern(req["seed"].as_u64().unwrap(), req["len"].as_u64().unwrap() as usize);
                    open.get_mut(&path).expect("an open node").append(&bytes).await?;
                    Ok(json!(null))
                }
                "sync" => {
                    open.get_mut(&path).expect("an open node").sync().await?;
                    Ok(json!(null))
                }
                "close" => {
                    open.remove(&path).expect("an open node").close().await?;
                    Ok(json!(null))
                }
                "read" => {
                    let v = client.get(&path).await?;
                    Ok(json!({"len": v.len(), "fnv": fnv(&v).to_string()}))
                }
                "put" => {
                    let bytes = pattern(req["seed"].as_u64().unwrap(), req["len"].as_u64().unwrap() as usize);
                    client.put(&path, &bytes).await?;
                    Ok(json!(null))
                }
                "status" => {
                    let st = client.status().await?;
                    let servers: Vec<Value> = st
                        .servers
                        .iter()
                        .map(|s| json!({"addr": s.addr, "alive": s.alive, "used_blocks": s.used_blocks}))
                        .collect();
                    let down: Vec<Value> = st
                        .unreachable
                        .iter()
                        .map(|d| json!({"partition": d.partition, "addr": d.addr, "error": d.error}))
                        .collect();
                    Ok(json!({"nodes": st.nodes, "servers": servers, "unreachable": down}))
                }
                "stats" => {
                    let s = client.data_path_stats();
                    let colocated: serde_json::Map<String, Value> = req["addrs"]
                        .as_array()
                        .map(|a| a.iter().filter_map(|x| x.as_str()).map(|x| (x.to_string(), json!(client.is_colocated(x)))).collect())
                        .unwrap_or_default();
                    Ok(json!({
                        "mapped_reads": s.mapped_reads,
                        "mapped_writes": s.mapped_writes,
                        "network_reads": s.network_reads,
                        "network_writes": s.network_writes,
                        "colocated": colocated,
                    }))
                }
                op => panic!("unknown op {op}"),
            }
        });
        let ms = start.elapsed().as_millis() as u64;
        say(match r {
            Ok(v) => json!({"ok": v, "ms": ms}),
            Err(e) => json!({"err": err(e), "ms": ms}),
        });
    }
}

/// Host 0: metadata partition 0 and a DRAM server; host 1: partition 1
/// and a DRAM server; host 2: a file server (class 1). Every host has a
/// client.
fn three_hosts(timing: Timing) -> Option<Cluster> {
    let dram = |host| StoreSpec {
        host,
        class: 0,
        file: false,
        size: "64MiB",
    };
    let file = StoreSpec {
        host: 2,
        class: 1,
        file: true,
        size: "64MiB",
    };
    Cluster::start(3, &[0, 1], &[dram(0), dram(1), file], timing)
}

/// Acceptance 1: files and KeyValues written under top-level names of
/// both partitions from clients on two hosts read back byte-identical
/// from the other host; a write that prefers its location lands on the
/// writer's host (storage class first); the shared-memory path is taken
/// only where the client shares a host with the DRAM server.
#[test]
fn two_hosts_write_and_read_each_others_data_across_partitions() {
    let Some(c) = three_hosts(Timing::default()) else {
        return;
    };
    let (dram0, dram1, file2) = (&c.store_addrs[0], &c.store_addrs[1], &c.store_addrs[2]);
    let dirs = names("dir", 2);
    let tables = names("tab", 1);
    // Host 0 makes the directories, host 1 the tables (both partitions).
    for d in dirs.iter().flatten() {
        c.ok(0, &["mkdir", d]);
    }
    for t in tables.iter().flatten() {
        c.ok(1, &["mkdir", "--type", "table", t]);
    }
    // Each writer puts a 2.5-block file in every directory and a large
    // and a small value in every table.
    let mut written: Vec<(String, Vec<u8>, usize)> = Vec::new();
    for w in [0usize, 1] {
        for (i, d) in dirs.iter().flatten().enumerate() {
            let p = format!("{d}/from{w}");
            let b = pattern((w * 100 + i) as u64, (5 << 19) + 123);
            c.put(w, &p, &b, &[]);
            written.push((p, b, w));
        }
        for (i, t) in tables.iter().flatten().enumerate() {
            for (k, len) in [("big", (3 << 19) + 7), ("small", 100)] {
                let p = format!("{t}/{k}{w}");
                let b = pattern((w * 100 + 50 + i) as u64 ^ len as u64, len);
                c.kv_put(w, &p, &b);
                written.push((p, b, w));
            }
        }
    }
    for (p, b, w) in &written {
        let other = 1 - w;
        let got = c
            .cat(other, p)
            .unwrap_or_else(|e| panic!("{p} on host {other}: {e}"));
        assert!(
            got == *b,
            "{p} (written on host {w}) read on host {other} differs"
        );
    }
    let small = format!("{}/small1", tables[1][0]);
    let kv = c.ok(0, &["kv", "get", &small]);
    let (_, want, _) = written.iter().find(|(p, _, _)| *p == small).unwrap();
    assert!(kv == *want, "kv get of a value written on the other host");

    // Location: both DRAM servers take blocks of a write that prefers no
    // location (round-robin); one that does lands on the writer's host.
    let four = pattern(7, 4 << 20);
    let spread = format!("{}/spread", dirs[0][0]);
    c.put(0, &spread, &four, &[]);
    let addrs: BTreeSet<String> = c.block_addrs(0, &spread).into_iter().collect();
    assert_eq!(
        addrs,
        BTreeSet::from([dram0.clone(), dram1.clone()]),
        "a write without a location preference uses both DRAM servers"
    );
    for (w, own) in [(0usize, dram0), (1, dram1)] {
        for d in [&dirs[0][0], &dirs[1][0]] {
            let p = format!("{d}/near{w}");
            c.put(w, &p, &four, &["--local-placement"]);
            let blocks = c.block_addrs(1 - w, &p);
            assert_eq!(blocks.len(), 4);
            assert!(
                blocks.iter().all(|a| a == own),
                "{p}, written on host {w} preferring its location, has blocks on {blocks:?}, not all on {own}"
            );
            assert!(c.cat(1 - w, &p).unwrap() == four);
        }
    }
    // Storage class outranks location: class 1 is only on host 2.
    let p = format!("{}/file-tier", dirs[1][1]);
    c.put(0, &p, &four, &["--class", "1", "--local-placement"]);
    let blocks = c.block_addrs(1, &p);
    assert!(blocks.iter().all(|a| a == file2), "{blocks:?}");
    assert!(c.cat(1, &p).unwrap() == four);

    // The shared-memory path: a client maps the DRAM server of its own
    // host and reaches the other host's over the network.
    let near0 = format!("{}/near0", dirs[0][0]);
    let near1 = format!("{}/near1", dirs[0][0]);
    let addrs = json!([dram0, dram1]);
    let mut h0 = c.child(0);
    let r = h0.ok(json!({"op": "read", "path": near0}));
    assert_eq!(r["fnv"], fnv(&four).to_string());
    let s = h0.ok(json!({"op": "stats", "addrs": addrs}));
    println!("host 0 client after reading its own host's DRAM: {s}");
    assert!(s["mapped_reads"].as_u64().unwrap() >= 4, "{s}");
    assert_eq!(s["network_reads"], 0, "{s}");
    assert_eq!(s["colocated"][dram0], true, "{s}");
    let r = h0.ok(json!({"op": "read", "path": near1}));
    assert_eq!(r["fnv"], fnv(&four).to_string());
    let s2 = h0.ok(json!({"op": "stats", "addrs": addrs}));
    println!("... and then host 1's: {s2}");
    assert!(s2["network_reads"].as_u64().unwrap() >= 4, "{s2}");
    assert_eq!(s2["mapped_reads"], s["mapped_reads"], "{s2}");
    assert_eq!(s2["colocated"][dram1], false, "{s2}");
    // A host without a DRAM server maps nothing.
    let mut h2 = c.child(2);
    h2.ok(json!({"op": "read", "path": near0}));
    h2.ok(json!({"op": "read", "path": near1}));
    let s = h2.ok(json!({"op": "stats", "addrs": addrs}));
    println!("host 2 client: {s}");
    assert_eq!(s["mapped_reads"], 0, "{s}");
    assert!(s["network_reads"].as_u64().unwrap() >= 8, "{s}");
}

/// `ls /` on a host: the names, checked to have no duplicates.
fn ls_root(c: &Cluster, host: usize) -> BTreeSet<String> {
    let v = c.json(host, &["ls", "/", "--json"]);
    let list: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    let set: BTreeSet<String> = list.iter().cloned().collect();
    assert_eq!(
        set.len(),
        list.len(),
        "ls / on host {host} repeats names: {list:?}"
    );
    set
}

/// Acceptance 2: `ls /` lists exactly the names of both partitions, from
/// either host; a move across partitions is done whole or refused with
/// `CrossPartition` with nothing changed, a move within one is done.
#[test]
fn root_listing_merges_partitions_and_cross_partition_moves_change_nothing() {
    let Some(c) = three_hosts(Timing::default()) else {
        return;
    };
    let dirs = names("top", 3);
    let mut expected = BTreeSet::new();
    for (i, d) in dirs.iter().flatten().enumerate() {
        c.ok(i % 2, &["mkdir", d]);
        expected.insert(d[1..].to_string());
    }
    let t = names("kv", 1);
    for tt in t.iter().flatten() {
        c.ok(1, &["mkdir", "--type", "table", tt]);
        expected.insert(tt[1..].to_string());
    }
    for h in [0, 1, 2] {
        assert_eq!(ls_root(&c, h), expected, "ls / on host {h}");
    }
    let a = pattern(1, (3 << 19) + 5);
    let src = format!("{}/f", dirs[0][0]);
    c.put(0, &src, &a, &[]);
    let v = pattern(2, 300);
    let key = format!("{}/k", t[0][0]);
    c.kv_put(1, &key, &v);

    // What a move that was refused must leave: the source with its bytes
    // and no destination, seen from both hosts.
    let unchanged = |src: &str, bytes: &[u8], dst: &str, what: &str| {
        for h in [0, 1] {
            let got = c
                .cat(h, src)
                .unwrap_or_else(|e| panic!("{what}: {src} on host {h}: {e}"));
            assert!(got == bytes, "{what}: {src} on host {h} changed");
            let o = c.nk(h, &["stat", dst]);
            assert!(
                stderr(&o).contains("NotFound"),
                "{what}: {dst} on host {h}: {}",
                stderr(&o)
            );
        }
    };
    // A file, a KeyValue and a whole top-level directory, each to the
    // other partition.
    let moves = [
        (src.clone(), format!("{}/moved", dirs[1][0]), a.clone()),
        (key.clone(), format!("{}/k", t[1][0]), v.clone()),
    ];
    for (from, to, bytes) in &moves {
        let o = c.nk(0, &["mv", from, to]);
        println!("mv {from} {to}: {:?} {}", o.status, stderr(&o).trim());
        if o.status.success() {
            // Done whole: the bytes under the new name only.
            for h in [0, 1] {
                assert!(c.cat(h, to).unwrap() == *bytes, "{to} on host {h}");
                assert!(stderr(&c.nk(h, &["stat", from])).contains("NotFound"));
            }
        } else {
            assert!(
                stderr(&o).contains("CrossPartition"),
                "mv {from} {to}: {}",
                stderr(&o)
            );
            unchanged(from, bytes, to, "refused move");
        }
    }
    let dst_top = names("elsewhere", 1)[1][0].clone();
    let o = c.nk(1, &["mv", &dirs[0][1], &dst_top]);
    println!(
        "mv {} {dst_top}: {:?} {}",
        dirs[0][1],
        o.status,
        stderr(&o).trim()
    );
    if o.status.success() {
        expected.remove(&dirs[0][1][1..]);
        expected.insert(dst_top[1..].to_string());
    } else {
        assert!(stderr(&o).contains("CrossPartition"), "{}", stderr(&o));
        for h in [0, 1] {
            assert!(stderr(&c.nk(h, &["stat", &dst_top])).contains("NotFound"));
            assert!(c.nk(h, &["stat", &dirs[0][1]]).status.success());
        }
    }
    for h in [0, 1] {
        assert_eq!(ls_root(&c, h), expected, "ls / on host {h} after the moves");
    }
    // Within one partition a move is done.
    let within = format!("{}/moved", dirs[0][2]);
    c.ok(1, &["mv", &src, &within]);
    for h in [0, 1] {
        assert!(c.cat(h, &within).unwrap() == a, "{within} on host {h}");
        assert!(stderr(&c.nk(h, &["stat", &src])).contains("NotFound"));
    }
}

/// The error code an `nk` failure names (`nk: Code: ...`), if any of
/// `codes`.
fn code_in<'a>(err: &str, codes: &[&'a str]) -> Option<&'a str> {
    codes
        .iter()
        .copied()
        .find(|c| err.contains(&format!("{c}:")))
}

/// Acceptance 3, storage server killed: reads of its blocks fail at once
/// (`Unavailable` while it is not yet declared dead, then `DataLost`),
/// other servers' data stays readable, its capacity leaves `nk status`
/// once it is retired, and a server that comes back with the same
/// identity but without the data (before or after it was retired) never
/// brings back the old bytes.
#[test]
fn a_killed_storage_server_loses_its_blocks_and_never_serves_them_again() {
    let timing = Timing {
        retire_after_ms: 5_000,
        client_timeout_ms: 10_000,
        ..Timing::default()
    };
    let Some(mut c) = three_hosts(timing.clone()) else {
        return;
    };
    let dirs: Vec<String> = names("k", 1).into_iter().flatten().collect();
    let mut files = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        c.ok(0, &["mkdir", d]);
        // On host 0's DRAM (survives), host 1's DRAM and host 2's file
        // server (both killed).
        for (what, host, extra) in [
            ("on0", 0, &["--local-placement"][..]),
            ("on1", 1, &["--local-placement"][..]),
            ("onfile", 0, &["--class", "1"][..]),
        ] {
            let p = format!("{d}/{what}");
            let b = pattern(
                i as u64 * 10 + host as u64 + what.len() as u64,
                (5 << 19) + 1,
            );
            c.put(host, &p, &b, extra);
            let want = &c.store_addrs[match what {
                "on0" => 0,
                "on1" => 1,
                _ => 2,
            }];
            assert!(c.block_addrs(2, &p).iter().all(|a| a == want), "{p}");
            files.push((p, b, what));
        }
    }
    let of = |what: &str| -> Vec<(String, Vec<u8>)> {
        files
            .iter()
            .filter(|f| f.2 == what)
            .map(|f| (f.0.clone(), f.1.clone()))
            .collect()
    };
    let lost_codes = ["Unavailable", "DataLost"];

    // The file server: killed, and at once started again on the same
    // data directory (same identity, a new incarnation, its old block
    // file still on disk, nothing kept).
    let file_addr = c.store_addrs[2].clone();
    c.store_procs[2].take().unwrap().sigkill();
    let killed = Instant::now();
    for (p, _) in of("onfile") {
        let t = Instant::now();
        let e = c
            .cat(2, &p)
            .expect_err("a read of a killed server's block fails");
        println!(
            "killed file server: read of {p} failed after {:?} ({:?} after the kill): {}",
            t.elapsed(),
            killed.elapsed(),
            e.trim()
        );
        assert!(code_in(&e, &lost_codes).is_some(), "{e}");
    }
    let (proc, addr) = c.start_store_proc(2);
    c.store_procs[2] = Some(proc);
    c.store_addrs[2] = addr;
    let restarted = Instant::now();
    for (p, b) in of("onfile") {
        let waited = eventually(&format!("{p} to be reported lost"), || match c.cat(1, &p) {
            Ok(got) => panic!(
                "{p}: the restarted server without data served {} bytes ({})",
                got.len(),
                if got == b {
                    "the old ones"
                } else {
                    "wrong ones"
                }
            ),
            Err(e) => e.contains("DataLost:"),
        });
        println!(
            "file server back without its data: {p} reported DataLost {waited:?} after the restart"
        );
    }
    println!(
        "(restart to every read DataLost: {:?})",
        restarted.elapsed()
    );
    // The same identity is one server in status, at its new address.
    let st = c.status(0);
    let files_in_status: Vec<&Value> = st["servers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["class"] == 1)
        .collect();
    assert_eq!(files_in_status.len(), 1, "{st}");
    assert_eq!(files_in_status[0]["addr"], c.store_addrs[2].as_str());
    assert_ne!(c.store_addrs[2], file_addr);
    assert_eq!(files_in_status[0]["used_blocks"], 0, "{st}");

    // Host 1's DRAM server: killed and left dead.
    let dram1 = c.store_addrs[1].clone();
    c.store_procs[1].take().unwrap().sigkill();
    let killed = Instant::now();
    for (p, _) in of("on1") {
        let t = Instant::now();
        let e = c
            .cat(2, &p)
            .expect_err("a read of a killed server's block fails");
        println!(
            "killed DRAM server: read of {p} failed after {:?} ({:?} after the kill): {}",
            t.elapsed(),
            killed.elapsed(),
            e.trim()
        );
        assert!(code_in(&e, &lost_codes).is_some(), "{e}");
    }
    for (p, _) in of("on1") {
        eventually(&format!("{p} to be reported lost"), || {
            c.cat(2, &p)
                .expect_err("never served")
                .contains("DataLost:")
        });
    }
    println!(
        "killed DRAM server: its blocks DataLost {:?} after the kill (meta.dead_after_ms = {})",
        killed.elapsed(),
        timing.dead_after_ms
    );
    let st = c.status(2);
    let dead: Vec<&Value> = st["servers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["addr"] == dram1.as_str())
        .collect();
    assert_eq!(dead.len(), 1, "{st}");
    assert_eq!(dead[0]["alive"], false, "{st}");
    // The other servers' data is unaffected, from every host.
    for (p, b) in of("on0") {
        for h in [1, 2] {
            assert!(c.cat(h, &p).unwrap() == b, "{p} on host {h}");
        }
    }
    // Retired: it leaves status, and its capacity with it.
    eventually("the dead server to be retired", || {
        let st = c.status(2);
        !st["servers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["addr"] == dram1.as_str())
    });
    println!(
        "killed DRAM server retired {:?} after the kill (meta.retire_after_ms = {})",
        killed.elapsed(),
        timing.retire_after_ms
    );
    let st = c.status(2);
    let dram = st["classes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["class"] == 0)
        .unwrap()
        .clone();
    assert_eq!(dram["servers"], 1, "{st}");
    assert_eq!(dram["capacity_bytes"], 64u64 << 20, "{st}");
    for (p, _) in of("on1") {
        assert!(c.cat(2, &p).unwrap_err().contains("DataLost:"));
    }
    // Back with the same identity after its retirement: still no data.
    let (proc, addr) = c.start_store_proc(1);
    c.store_procs[1] = Some(proc);
    c.store_addrs[1] = addr.clone();
    for (p, _) in of("on1") {
        let e = c.cat(2, &p).expect_err("never served again");
        assert!(e.contains("DataLost:"), "{e}");
    }
    let st = c.status(2);
    let back: Vec<&Value> = st["servers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["addr"] == addr.as_str())
        .collect();
    assert_eq!(back.len(), 1, "{st}");
    assert_eq!(back[0]["used_blocks"], 0, "{st}");
    assert_eq!(back[0]["alive"], true, "{st}");
    // And it takes new blocks.
    let p = format!("{}/again", dirs[1]);
    let b = pattern(99, 3 << 20);
    c.put(1, &p, &b, &["--local-placement"]);
    assert!(c.block_addrs(0, &p).iter().all(|a| *a == addr));
    assert!(c.cat(0, &p).unwrap() == b);
}

/// Acceptance 3, client killed mid-write: a writer that synced part of a
/// file and wrote more is killed while it holds the lease; the lease
/// expires, the file keeps the synced size and bytes, and deleting it
/// frees every block.
#[test]
fn a_writer_killed_holding_its_lease_leaves_the_synced_bytes_and_leaks_nothing() {
    let timing = Timing {
        lease_timeout_ms: 2_000,
        ..Timing::default()
    };
    let Some(c) = three_hosts(timing.clone()) else {
        return;
    };
    let dir = names("w", 1)[1][0].clone();
    c.ok(1, &["mkdir", &dir]);
    // The directory's child records stay where its first children put
    // them: two children take the pieces of slots 0 to 2 (`f` is slot 2).
    c.ok(1, &["mkdir", &format!("{dir}/warm")]);
    c.ok(1, &["mkdir", &format!("{dir}/warm2")]);
    let before = used_blocks(&c.status(1));
    let f = format!("{dir}/f");
    let synced = (3 << 19) + 11;
    let mut writer = c.child(0);
    writer.ok(json!({"op": "create", "path": f}));
    writer.ok(json!({"op": "append", "path": f, "seed": 1, "len": synced}));
    writer.ok(json!({"op": "sync", "path": f}));
    // The append's maps renew the lease: it holds at least until
    // `lease_timeout_ms` after the append was sent.
    let sent = Instant::now();
    writer.ok(json!({"op": "append", "path": f, "seed": 2, "len": 2 << 20}));
    let mut other = c.child(1);
    let r = other.call(json!({"op": "open_write", "path": f}));
    if sent.elapsed() < Duration::from_millis(timing.lease_timeout_ms) {
        assert_eq!(r["err"]["code"], "Busy", "the writer holds the lease: {r}");
    }
    // On a machine too slow to tell, the lease may have expired already
    // and `other` took over: then it keeps the synced size too.
    let taken_early = r["err"].is_null();
    if taken_early {
        assert_eq!(r["ok"], synced, "the node keeps the synced size: {r}");
        println!("the lease expired before the writer was killed (slow machine)");
    }
    // Readers on another host see the synced bytes only.
    let st = c.json(1, &["stat", &f, "--json"]);
    assert_eq!(st["size"], synced, "{st}");
    assert!(c.cat(1, &f).unwrap() == pattern(1, synced));
    assert!(
        used_blocks(&c.status(1)) >= before + 4,
        "the unsynced bytes have blocks too"
    );

    writer.proc.sigkill();
    let took_over = eventually("the lease to expire", || {
        if taken_early {
            return true;
        }
        let r = other.call(json!({"op": "open_write", "path": f}));
        match r["err"]["code"].as_str() {
            Some("Busy") => false,
            None => {
                assert_eq!(r["ok"], synced, "the node keeps the synced size: {r}");
                true
            }
            Some(_) => panic!("open_write after the writer died: {r}"),
        }
    });
    println!(
        "writer killed: its lease expired, another writer took over after {took_over:?} \
         (meta.lease_timeout_ms = {})",
        timing.lease_timeout_ms
    );
    other.ok(json!({"op": "close", "path": f}));
    assert_eq!(c.json(0, &["stat", &f, "--json"])["size"], synced);
    assert!(c.cat(0, &f).unwrap() == pattern(1, synced));
    c.ok(0, &["rm", &f]);
    let start = Instant::now();
    loop {
        let now = used_blocks(&c.status(2));
        if now == before {
            break;
        }
        assert!(
            start.elapsed() < HANG,
            "blocks leaked: {now} used, {before} before the file"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let freed = start.elapsed();
    println!("deleted: every block free {freed:?} later");
}

/// Acceptance 3, metadata partition killed: requests for the names it
/// owns fail fast with `Unavailable` (the connection is refused; well
/// under the client timeout), the other partition keeps serving reads
/// and writes, and the client's status is the reachable partition's view
/// naming the unreachable one.
#[test]
fn a_killed_metadata_partition_fails_fast_and_the_other_keeps_serving() {
    let timing = Timing::default();
    let Some(mut c) = three_hosts(timing.clone()) else {
        return;
    };
    let dirs = names("m", 1);
    let tables = names("mt", 1);
    let mut files = Vec::new();
    for p in 0..2 {
        c.ok(0, &["mkdir", &dirs[p][0]]);
        c.ok(0, &["mkdir", "--type", "table", &tables[p][0]]);
        let f = format!("{}/f", dirs[p][0]);
        let b = pattern(p as u64 + 7, (3 << 19) + 3);
        c.put(0, &f, &b, &[]);
        files.push((f, b));
    }
    let mut client = c.child(2);
    c.meta_procs[1].take().unwrap().sigkill();
    // A client connected before: the dead partition's names fail fast —
    // `Unavailable` (the connection is refused), not `Timeout`, which is
    // what waiting out `client.timeout_ms` gives (times are printed; the
    // machine may be too loaded for a bound on them).
    for req in [
        json!({"op": "read", "path": files[1].0}),
        json!({"op": "put", "path": format!("{}/k", tables[1][0]), "seed": 1, "len": 10}),
    ] {
        let r = client.call(req.clone());
        println!("dead partition, connected client: {req} -> {r}");
        assert_eq!(r["err"]["code"], "Unavailable", "{r}");
    }
    // ... and the other partition serves reads and writes.
    let r = client.ok(json!({"op": "read", "path": files[0].0}));
    assert_eq!(r["fnv"], fnv(&files[0].1).to_string());
    let k = format!("{}/k", tables[0][0]);
    client.ok(json!({"op": "put", "path": k, "seed": 3, "len": 5000}));
    let r = client.ok(json!({"op": "read", "path": k}));
    assert_eq!(r["fnv"], fnv(&pattern(3, 5000)).to_string());
    let f = format!("{}/new", dirs[0][0]);
    client.ok(json!({"op": "create", "path": f}));
    client.ok(json!({"op": "append", "path": f, "seed": 4, "len": 3 << 19}));
    client.ok(json!({"op": "close", "path": f}));
    let r = client.ok(json!({"op": "read", "path": f}));
    assert_eq!(r["fnv"], fnv(&pattern(4, 3 << 19)).to_string());
    // Status: the reachable partition's view, naming the other.
    let st = client.ok(json!({"op": "status"}));
    println!("status with partition 1 dead: {st}");
    let down = st["unreachable"].as_array().unwrap();
    assert_eq!(down.len(), 1, "{st}");
    assert_eq!(down[0]["partition"], 1);
    assert_eq!(down[0]["addr"], c.meta_addrs[1].as_str());
    assert!(
        down[0]["error"].as_str().unwrap().contains("Unavailable"),
        "{st}"
    );
    assert_eq!(st["servers"].as_array().unwrap().len(), 3, "{st}");
    // A new `nk` process: the dead partition's names fail fast too.
    let t = Instant::now();
    let e = c.cat(2, &files[1].0).unwrap_err();
    println!(
        "dead partition, new nk: failed after {:?}: {}",
        t.elapsed(),
        e.trim()
    );
    assert!(e.contains("Unavailable:"), "{e}");
    // With no partition left, status fails, naming both.
    c.meta_procs[0].take().unwrap().sigkill();
    let r = client.call(json!({"op": "status"}));
    assert_eq!(r["err"]["code"], "Unavailable", "{r}");
    let msg = r["err"]["message"].as_str().unwrap();
    for a in &c.meta_addrs {
        assert!(msg.contains(a.as_str()), "{r}");
    }
}

/// `nk` commands started while a metadata partition is dead: the other
/// partition's names work, and `nk status` shows the reachable partition,
/// names the unreachable one and exits nonzero.
#[test]
fn nk_commands_keep_working_with_a_dead_partition() {
    let Some(mut c) = three_hosts(Timing::default()) else {
        return;
    };
    let dirs = names("n", 1);
    for d in dirs.iter().flatten() {
        c.ok(0, &["mkdir", d]);
    }
    let f0 = format!("{}/f", dirs[0][0]);
    let b = pattern(5, 1 << 20);
    c.put(0, &f0, &b, &[]);
    c.meta_procs[1].take().unwrap().sigkill();
    assert!(c.cat(2, &f0).unwrap() == b);
    let f1 = format!("{}/g", dirs[0][0]);
    c.put(2, &f1, &b, &[]);
    assert!(c.cat(0, &f1).unwrap() == b);
    for json in [false, true] {
        let args: &[&str] = if json {
            &["status", "--json"]
        } else {
            &["status"]
        };
        let o = c.nk(2, args);
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        println!(
            "nk {args:?} with partition 1 dead: {:?}\n{out}{}",
            o.status,
            stderr(&o)
        );
        assert!(
            !o.status.success(),
            "exits nonzero while a partition is unreachable"
        );
        assert!(
            stderr(&o).contains("1 of 2 metadata partitions unreachable"),
            "{}",
            stderr(&o)
        );
        if json {
            let st: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(st["partitions"][0]["reachable"], true, "{st}");
            assert_eq!(st["partitions"][1]["reachable"], false, "{st}");
            assert_eq!(st["unreachable"][0]["partition"], 1, "{st}");
            assert_eq!(st["unreachable"][0]["addr"], c.meta_addrs[1].as_str());
            assert!(st["unreachable"][0]["error"]
                .as_str()
                .unwrap()
                .contains("Unavailable"));
            assert_eq!(st["ready"], false, "{st}");
            assert_eq!(st["servers"].as_array().unwrap().len(), 3, "{st}");
        } else {
            assert!(
                out.contains(&format!("partition 0 at {}: reachable", c.meta_addrs[0])),
                "{out}"
            );
            assert!(
                out.contains(&format!(
                    "partition 1 at {}: UNREACHABLE: Unavailable",
                    c.meta_addrs[1]
                )),
                "{out}"
            );
        }
    }
    let o = c.nk(2, &["ls", "/"]);
    // Listing / needs every partition.
    assert!(!o.status.success());
}

/// Acceptance 3, a cut link: with the host of a metadata partition and a
/// storage server unreachable (packets dropped, nothing refused), a
/// client gets `Timeout` (or `Unavailable`) no sooner than its configured
/// timeout and without hanging; data on other hosts stays readable; once
/// the link is back, so is everything.
#[test]
fn a_cut_link_times_out_after_the_client_timeout_and_heals() {
    let timing = Timing {
        client_timeout_ms: 1_500,
        ..Timing::default()
    };
    let Some(c) = three_hosts(timing.clone()) else {
        return;
    };
    let dirs = names("c", 1);
    let mut files = Vec::new();
    for (p, d) in dirs.iter().flatten().enumerate() {
        c.ok(1, &["mkdir", d]);
        for (w, what) in [(0usize, "on0"), (1, "on1")] {
            let f = format!("{d}/{what}");
            let b = pattern((p * 2 + w) as u64, 3 << 19);
            c.put(w, &f, &b, &["--local-placement"]);
            files.push((f, b, p, w));
        }
    }
    let timeout = Duration::from_millis(timing.client_timeout_ms);
    let mut client = c.child(1);
    // Host 0 holds partition 0 and a DRAM server.
    c.net.cut(0);
    let cut = Instant::now();
    // A block on host 0, of a name partition 1 owns.
    let (f, _, _, _) = files.iter().find(|f| f.2 == 1 && f.3 == 0).unwrap();
    let r = client.call(json!({"op": "read", "path": f}));
    println!("cut link, block on the cut host: {r}");
    let ms = Duration::from_millis(r["ms"].as_u64().unwrap());
    assert!(
        matches!(r["err"]["code"].as_str(), Some("Timeout" | "Unavailable")),
        "{r}"
    );
    assert!(ms >= timeout, "failed before the client timeout: {r}");
    assert!(ms < HANG, "{r}");
    // A name the cut host's partition owns.
    let (f, _, _, _) = files.iter().find(|f| f.2 == 0).unwrap();
    let r = client.call(json!({"op": "read", "path": f}));
    println!("cut link, name of the cut partition: {r}");
    let ms = Duration::from_millis(r["ms"].as_u64().unwrap());
    assert!(
        matches!(r["err"]["code"].as_str(), Some("Timeout" | "Unavailable")),
        "{r}"
    );
    assert!(ms >= timeout, "failed before the client timeout: {r}");
    // A new `nk` process, which must reach partition 0 first.
    let t = Instant::now();
    let e = c.cat(1, f).unwrap_err();
    let took = t.elapsed();
    println!("cut link, new nk: failed after {took:?}: {}", e.trim());
    assert!(code_in(&e, &["Timeout", "Unavailable"]).is_some(), "{e}");
    assert!(took >= timeout, "failed before the client timeout");
    assert!(took < HANG);
    // Data on the other hosts of the partition that answers.
    let (f, b, _, _) = files.iter().find(|f| f.2 == 1 && f.3 == 1).unwrap();
    let r = client.ok(json!({"op": "read", "path": f}));
    assert_eq!(r["fnv"], fnv(b).to_string());
    println!("(link cut for {:?})", cut.elapsed());
    c.net.mend(0);
    for (f, b, _, _) in &files {
        let healed = eventually(&format!("{f} to be readable again"), || {
            client.call(json!({"op": "read", "path": f}))["ok"]["fnv"].as_str()
                == Some(fnv(b).to_string().as_str())
        });
        println!("link back: {f} readable after {healed:?}");
    }
}
