//! Crash loops (issue #13, `docs/persistence.md`, *Restart*):
//! a writer creates, puts, replaces, appends, renames and deletes at random;
//! a server is killed with SIGKILL at a random moment and started again on
//! the same address and directories; every change acknowledged before a
//! kill must be there after it, byte for byte, nothing acknowledged as
//! deleted may come back, and enumeration lists exactly what is there.
//!
//! - `acknowledged_changes_survive_sigkill_of_the_metadata_server`: only a
//!   persistent `nk meta` is killed; its volatile storage server keeps
//!   running, so this checks the operation log alone.
//! - `a_persistent_cluster_survives_sigkill_of_everything`: a persistent
//!   `nk up` (operation log with `fsync = always`, a file-backed DRAM tier
//!   and a file tier) is killed whole and started again: the log, the kept
//!   blocks and the storage servers' re-registration together.
//!
//! A change whose answer the kill cut off may or may not have happened:
//! the model then allows both outcomes for that path, and the check after
//! the restart finds out which one it was (it must be one of them).
//!
//! `NK_CRASH_SEED` replays a run (the seed is printed).

use crate::common;

use common::{start_meta_and_store, start_role};
use nodekernel_client::{Client, CreateOptions, ErrorCode, NodeType};
use std::collections::{BTreeMap, BTreeSet};
use std::process::Child;
use std::time::Duration;

const ITERATIONS: u64 = 20;

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The outcomes each path may show: one after an acknowledged change,
/// several after a change that got no answer. `None` is "absent".
#[derive(Default)]
struct Model {
    paths: BTreeMap<String, Vec<Option<Vec<u8>>>>,
}

impl Model {
    /// The one value `path` is known to hold, if it is known and present.
    fn known(&self, path: &str) -> Option<&Vec<u8>> {
        match self.paths.get(path).map(Vec::as_slice) {
            Some([Some(v)]) => Some(v),
            _ => None,
        }
    }

    /// Paths known to hold a value, under `prefix`.
    fn present(&self, prefix: &str) -> Vec<String> {
        self.paths
            .keys()
            .filter(|p| p.starts_with(prefix) && self.known(p).is_some())
            .cloned()
            .collect()
    }

    fn acked(&mut self, path: &str, value: Option<Vec<u8>>) {
        self.paths.insert(path.to_string(), vec![value]);
    }

    /// A change to `value` was sent and not answered.
    fn unanswered(&mut self, path: &str, value: Option<Vec<u8>>) {
        let outcomes = self.paths.entry(path.to_string()).or_insert(vec![None]);
        if !outcomes.contains(&value) {
            outcomes.push(value);
        }
    }

    fn changes(&self) -> usize {
        self.paths.len()
    }
}

fn value(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.below(4) {
        0 => rng.below(64) as usize,
        1 => 100 + rng.below(2000) as usize,
        _ => 70_000 + rng.below(200_000) as usize,
    };
    let seed = rng.next();
    (0..len)
        .map(|i| (seed.wrapping_add(i as u64 * 31) >> 3) as u8)
        .collect()
}

async fn client(addr: &str, timeout: Duration) -> Client {
    let mut cfg = common::client_config(addr);
    cfg.timeout = timeout;
    Client::connect(cfg).await.expect("connects")
}

/// Changes things at random until a request fails (the kill).
async fn write_until_killed(addr: &str, m: &mut Model, rng: &mut Rng) {
    let c = client(addr, Duration::from_secs(2)).await;
    loop {
        let key = rng.below(40);
        let r = match rng.below(12) {
            0..=3 => {
                let path = format!("/t/k{key}");
                let v = value(rng);
                m.unanswered(&path, Some(v.clone()));
                c.put(&path, &v).await.map(|()| m.acked(&path, Some(v)))
            }
            4..=5 => {
                // Never the same name twice: a create whose answer was lost
                // may or may not have made its File, and a File whose close
                // got no answer may have kept its last synced size, 0.
                let path = format!("/d/f{}", rng.next());
                let v = value(rng);
                m.unanswered(&path, Some(Vec::new()));
                m.unanswered(&path, Some(v.clone()));
                let made = async {
                    let mut f = c
                        .create(&path, NodeType::File, CreateOptions::default())
                        .await?;
                    f.append(&v).await?;
                    f.close().await
                };
                made.await.map(|()| m.acked(&path, Some(v)))
            }
            6..=7 => {
                // Appends to a closed File: the File keeps its old bytes
                // until the close publishes the new size.
                let files = m.present("/d/");
                match files.get(rng.below(files.len() as u64) as usize) {
                    Some(path) => {
                        let mut v = m.known(path).cloned().unwrap_or_default();
                        v.extend_from_slice(&value(rng));
                        m.unanswered(path, Some(v.clone()));
                        let appended = async {
                            let mut f = c.open_write(path).await?;
                            let at = f.size();
                            f.append(&v[at as usize..]).await?;
                            f.close().await
                        };
                        appended.await.map(|()| m.acked(path, Some(v)))
                    }
                    None => Ok(()),
                }
            }
            8 => {
                let to = format!("/d/r{}", rng.next());
                match m.present("/d/").first().cloned() {
                    Some(from) => {
                        let v = m.known(&from).cloned();
                        m.unanswered(&from, None);
                        m.unanswered(&to, v.clone());
                        c.rename(&from, &to).await.map(|()| {
                            m.acked(&from, None);
                            m.acked(&to, v);
                        })
                    }
                    None => Ok(()),
                }
            }
            _ => {
                let all = m.present("/");
                match all.get(rng.below(all.len() as u64) as usize).cloned() {
                    Some(path) => {
                        m.unanswered(&path, None);
                        c.delete(&path, false).await.map(|()| m.acked(&path, None))
                    }
                    None => Ok(()),
                }
            }
        };
        if r.is_err() {
            return;
        }
    }
}

/// Checks the cluster against the model, then settles every path whose
/// last change got no answer to what the cluster holds (one of the
/// outcomes the model allowed).
async fn verify(addr: &str, m: &mut Model, iteration: u64, seed: u64) {
    let c = client(addr, Duration::from_secs(120)).await;
    let at = format!("iteration {iteration} (NK_CRASH_SEED={seed})");
    for (path, outcomes) in m.paths.iter_mut() {
        let found = match c.get(path).await {
            Ok(v) => Some(v),
            Err(e) if e.code == ErrorCode::NotFound => None,
            Err(e) => panic!("{at}: {path}: {e}"),
        };
        if !outcomes.contains(&found) {
            let what = |o: &Option<Vec<u8>>| match o {
                Some(v) => format!("{} bytes", v.len()),
                None => "absent".into(),
            };
            panic!(
                "{at}: {path} is {} after the restart; acknowledged or possible: {}",
                what(&found),
                outcomes.iter().map(what).collect::<Vec<_>>().join(" or ")
            );
        }
        *outcomes = vec![found];
    }
    // Enumeration is exact: the listing is what is there, nothing else.
    for dir in ["/d", "/t"] {
        let listed: BTreeSet<String> = c
            .enumerate(dir)
            .await
            .unwrap_or_else(|e| panic!("{at}: enumerate {dir}: {e}"))
            .into_iter()
            .map(|name| format!("{dir}/{name}"))
            .collect();
        let want: BTreeSet<String> = m.present(&format!("{dir}/")).into_iter().collect();
        assert_eq!(listed, want, "{at}: enumeration of {dir}");
    }
}

fn kill(child: &mut Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

fn seed() -> u64 {
    let seed = std::env::var("NK_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::process::id() as u64);
    eprintln!("crash loop: NK_CRASH_SEED={seed}");
    seed
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn make_containers(addr: &str) {
    let c = client(addr, Duration::from_secs(120)).await;
    c.mkdir("/d", false).await.unwrap();
    c.create("/t", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
}

/// Runs `ITERATIONS` rounds of: write until `victim` is killed at a random
/// moment, start it again with `restart`, check.
fn crash_loop(addr: &str, mut victim: Child, restart: impl Fn() -> Child) -> Child {
    let seed = seed();
    let mut rng = Rng(seed);
    let rt = runtime();
    rt.block_on(make_containers(addr));
    let mut m = Model::default();
    for iteration in 0..ITERATIONS {
        let pid = victim.id().to_string();
        let after = Duration::from_millis(20 + rng.below(400));
        let killer = std::thread::spawn(move || {
            std::thread::sleep(after);
            let killed = std::process::Command::new("kill")
                .args(["-KILL", &pid])
                .status()
                .unwrap();
            assert!(killed.success());
        });
        rt.block_on(write_until_killed(addr, &mut m, &mut rng));
        killer.join().unwrap();
        victim.wait().unwrap();
        victim = restart();
        rt.block_on(verify(addr, &mut m, iteration, seed));
    }
    assert!(
        m.changes() > 20,
        "the writer did too little to check: {} paths",
        m.changes()
    );
    victim
}

#[test]
fn acknowledged_changes_survive_sigkill_of_the_metadata_server() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("meta");
    let data = data.to_str().unwrap();
    let (meta, addr, mut store) = start_meta_and_store(&["--data-dir", data], "256MiB");
    let restart = || {
        let args = ["meta", "--listen", &addr, "--data-dir", data];
        let (again, at) = start_role(&args, &[], "metadata server listening on");
        assert_eq!(at, addr);
        again
    };
    let mut meta = crash_loop(&addr, meta, restart);
    kill(&mut meta);
    kill(&mut store);
}

#[test]
fn a_persistent_cluster_survives_sigkill_of_everything() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("nk.toml");
    // A small DRAM tier, so values spill to the file tier; hang-only
    // client bounds; the storage servers must come back well within the
    // liveness timeout.
    std::fs::write(
        &config,
        "[meta]\npersistence = true\nfsync = \"always\"\ndead_after_ms = 600000\n\
         retire_after_ms = 600000\nclaim_timeout_ms = 120000\n\
         [up]\ndram = \"4MiB\"\nfile = \"256MiB\"\n[client]\ntimeout_ms = 120000\n",
    )
    .unwrap();
    let data = dir.path().join("up");
    let (config, data) = (config.to_str().unwrap(), data.to_str().unwrap());
    let up = |port: &str| {
        let args = ["up", "--config", config, "--data-dir", data, "--port", port];
        start_role(&args, &[], "NodeKernel is up")
    };
    let (nk_up, addr) = up("0");
    let port = addr.rsplit(':').next().unwrap().to_string();
    let restart = || {
        let (again, at) = up(&port);
        assert_eq!(at, addr);
        again
    };
    let mut nk_up = crash_loop(&addr, nk_up, restart);
    // Both tiers held data through the kills: the DRAM tier's file and the
    // file tier's block file were both put to the test.
    let st = runtime().block_on(async {
        let c = client(&addr, Duration::from_secs(120)).await;
        c.status().await.unwrap()
    });
    assert_eq!(st.servers.len(), 2, "one registration per server: {st:?}");
    for s in &st.servers {
        assert!(
            s.used_blocks > 0,
            "nothing on the {} tier: {st:?}",
            s.medium
        );
    }
    kill(&mut nk_up);
}
