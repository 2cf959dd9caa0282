//! Crash loop, the metadata server's half (issue #13): a persistent
//! `nk meta` is killed with SIGKILL at a random moment under a writer that
//! creates Files, puts, replaces, renames and deletes at random, then
//! started again on the same address and directory, 20 times over. Every
//! change acknowledged before a kill must be there after it, byte for byte,
//! and nothing acknowledged as deleted may come back. The storage server
//! keeps running (storage persistence is not built yet), so the data is
//! still there: this checks the log.
//!
//! `NK_CRASH_SEED` replays a run (the seed is printed).

mod common;

use common::{start_meta_and_store, start_role};
use nodekernel_client::{Client, ClientConfig, CreateOptions, ErrorCode, NodeType};
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

/// What the cluster must hold: acknowledged values by path, paths
/// acknowledged as deleted, and paths whose last change had no answer (the
/// kill came first): either outcome is right for those.
#[derive(Default)]
struct Model {
    values: BTreeMap<String, Vec<u8>>,
    deleted: BTreeSet<String>,
    unknown: BTreeSet<String>,
}

impl Model {
    fn acked(&mut self, path: &str, value: Option<Vec<u8>>) {
        self.unknown.remove(path);
        match value {
            Some(v) => {
                self.deleted.remove(path);
                self.values.insert(path.to_string(), v);
            }
            None => {
                self.values.remove(path);
                self.deleted.insert(path.to_string());
            }
        }
    }

    fn unanswered(&mut self, path: &str) {
        self.values.remove(path);
        self.deleted.remove(path);
        self.unknown.insert(path.to_string());
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
    let mut cfg = ClientConfig::new(vec![addr.to_string()]);
    cfg.timeout = timeout;
    Client::connect(cfg).await.expect("connects")
}

/// Changes things at random until a request fails (the kill).
async fn write_until_killed(addr: &str, m: &mut Model, rng: &mut Rng) {
    let c = client(addr, Duration::from_secs(2)).await;
    loop {
        let key = rng.below(40);
        let r = match rng.below(10) {
            0..=3 => {
                let path = format!("/t/k{key}");
                let v = value(rng);
                m.unanswered(&path);
                c.put(&path, &v).await.map(|()| m.acked(&path, Some(v)))
            }
            4..=6 => {
                // Never the same name twice: a create whose answer was lost
                // may or may not have made its File.
                let path = format!("/d/f{}", rng.next());
                let v = value(rng);
                m.unanswered(&path);
                let made = async {
                    let mut f = c
                        .create(&path, NodeType::File, CreateOptions::default())
                        .await?;
                    f.append(&v).await?;
                    f.close().await
                };
                made.await.map(|()| m.acked(&path, Some(v)))
            }
            7 => {
                let to = format!("/d/r{}", rng.next());
                match m.values.keys().find(|p| p.starts_with("/d/")).cloned() {
                    Some(from) => {
                        let v = m.values[&from].clone();
                        m.unanswered(&from);
                        m.unanswered(&to);
                        c.rename(&from, &to).await.map(|()| {
                            m.acked(&from, None);
                            m.acked(&to, Some(v));
                        })
                    }
                    None => Ok(()),
                }
            }
            _ => {
                let pick = rng.below(m.values.len() as u64) as usize;
                match m.values.keys().nth(pick).cloned() {
                    Some(path) => {
                        m.unanswered(&path);
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

async fn verify(addr: &str, m: &Model, iteration: u64, seed: u64) {
    let c = client(addr, Duration::from_secs(120)).await;
    let at = format!("iteration {iteration} (NK_CRASH_SEED={seed})");
    for (path, v) in &m.values {
        let got = c
            .get(path)
            .await
            .unwrap_or_else(|e| panic!("{at}: {path} was acknowledged, now: {e}"));
        assert!(
            got == *v,
            "{at}: {path} does not hold its last acknowledged value"
        );
    }
    for path in &m.deleted {
        let e = c.lookup(path).await.err();
        assert_eq!(
            e.map(|e| e.code),
            Some(ErrorCode::NotFound),
            "{at}: {path} was acknowledged as deleted and is back"
        );
    }
}

fn kill(child: &mut Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn acknowledged_changes_survive_sigkill_of_the_metadata_server() {
    let seed = std::env::var("NK_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::process::id() as u64);
    eprintln!("crash loop: NK_CRASH_SEED={seed}");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("meta");
    let data = data.to_str().unwrap();
    let meta_args = |listen: &str| {
        [
            "meta".to_string(),
            "--listen".into(),
            listen.into(),
            "--data-dir".into(),
            data.into(),
        ]
    };
    let (mut meta, addr, mut store) = start_meta_and_store(&["--data-dir", data], "256MiB");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = client(&addr, Duration::from_secs(120)).await;
        c.mkdir("/d", false).await.unwrap();
        c.create("/t", NodeType::Table, CreateOptions::default())
            .await
            .unwrap();
    });
    let mut m = Model::default();
    let args = meta_args(&addr);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    for iteration in 0..ITERATIONS {
        let pid = meta.id().to_string();
        let after = Duration::from_millis(20 + rng.below(400));
        let killer = std::thread::spawn(move || {
            std::thread::sleep(after);
            let killed = std::process::Command::new("kill")
                .args(["-KILL", &pid])
                .status()
                .unwrap();
            assert!(killed.success());
        });
        rt.block_on(write_until_killed(&addr, &mut m, &mut rng));
        killer.join().unwrap();
        meta.wait().unwrap();
        let (again, at) = start_role(&args, &[], "metadata server listening on");
        assert_eq!(at, addr);
        meta = again;
        rt.block_on(verify(&addr, &m, iteration, seed));
    }
    assert!(
        m.values.len() + m.deleted.len() > 20,
        "the writer did too little to check: {} values, {} deletes",
        m.values.len(),
        m.deleted.len()
    );
    kill(&mut meta);
    kill(&mut store);
}
