//! The co-located zero-copy data path against the network path: one random
//! workload, run through a client that maps the DRAM storage server and
//! through one that does not, on the same cluster, must give the same
//! bytes (those of a model), and each path must be the one really taken.

use crate::common;
use common::PutFile;

use common::pattern;
use nodekernel_client::{Client, CreateOptions, ErrorCode, Node, NodeType};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};

const BS: u64 = common::BS;

#[derive(Debug)]
enum Op {
    Create(usize),
    Append(usize, Vec<u8>),
    Overwrite(usize, u64, Vec<u8>),
    Sync(usize),
    Close(usize),
    /// Read through the writer's handle while open, a fresh lookup after.
    Read(usize, u64, u64),
    Delete(usize),
    Put(String, Vec<u8>),
    Get(String),
    DeleteKey(String),
    List,
}

/// What a file looks like in the model.
#[derive(Default, Clone)]
struct FileModel {
    data: Vec<u8>,
    open: bool,
    deleted: bool,
}

/// Sizes from one byte to several blocks, so pieces start and end
/// everywhere relative to block boundaries.
fn size(rng: &mut SmallRng) -> usize {
    match rng.gen_range(0..10) {
        0..=2 => rng.gen_range(1..100),
        3..=5 => rng.gen_range(100..BS as usize),
        6..=7 => BS as usize + rng.gen_range(0..3),
        _ => rng.gen_range(BS as usize..5 * BS as usize),
    }
}

/// A random workload, with the bytes every read must return.
fn plan(seed: u64, steps: usize) -> (Vec<Op>, Vec<Vec<u8>>, Vec<FileModel>) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut files: Vec<FileModel> = Vec::new();
    let mut kv: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut ops = Vec::new();
    let mut expect = Vec::new();
    let mut next_seed = seed << 20;
    let mut data = |rng: &mut SmallRng| {
        next_seed += 1;
        pattern(next_seed, size(rng))
    };
    for _ in 0..steps {
        let live: Vec<usize> = (0..files.len()).filter(|&i| !files[i].deleted).collect();
        let open: Vec<usize> = live.iter().copied().filter(|&i| files[i].open).collect();
        let readable: Vec<usize> = live
            .iter()
            .copied()
            .filter(|&i| !files[i].data.is_empty())
            .collect();
        match rng.gen_range(0..100) {
            0..=7 => {
                ops.push(Op::Create(files.len()));
                files.push(FileModel {
                    open: true,
                    ..FileModel::default()
                });
            }
            8..=29 if !open.is_empty() => {
                let f = open[rng.gen_range(0..open.len())];
                let d = data(&mut rng);
                files[f].data.extend_from_slice(&d);
                ops.push(Op::Append(f, d));
            }
            30..=37 if !open.is_empty() => {
                let f = open[rng.gen_range(0..open.len())];
                let len = files[f].data.len() as u64;
                if len > 0 {
                    let off = rng.gen_range(0..len);
                    let mut d = data(&mut rng);
                    d.truncate((len - off) as usize);
                    files[f].data[off as usize..off as usize + d.len()].copy_from_slice(&d);
                    ops.push(Op::Overwrite(f, off, d));
                }
            }
            38..=40 if !open.is_empty() => ops.push(Op::Sync(open[rng.gen_range(0..open.len())])),
            41..=47 if !open.is_empty() => {
                let f = open[rng.gen_range(0..open.len())];
                files[f].open = false;
                ops.push(Op::Close(f));
            }
            48..=67 if !readable.is_empty() => {
                let f = readable[rng.gen_range(0..readable.len())];
                let len = files[f].data.len() as u64;
                let off = rng.gen_range(0..len);
                let n = if rng.gen_bool(0.2) {
                    len - off
                } else {
                    rng.gen_range(1..=(len - off).min(3 * BS))
                };
                expect.push(files[f].data[off as usize..(off + n) as usize].to_vec());
                ops.push(Op::Read(f, off, n));
            }
            68..=70 if !live.is_empty() => {
                let f = live[rng.gen_range(0..live.len())];
                if !files[f].open {
                    files[f].deleted = true;
                    ops.push(Op::Delete(f));
                }
            }
            71..=82 => {
                let key = format!("k{}", rng.gen_range(0..12));
                let v = data(&mut rng);
                kv.insert(key.clone(), v.clone());
                ops.push(Op::Put(key, v));
            }
            83..=92 if !kv.is_empty() => {
                let keys: Vec<&String> = kv.keys().collect();
                let key = keys[rng.gen_range(0..keys.len())].clone();
                expect.push(kv[&key].clone());
                ops.push(Op::Get(key));
            }
            93..=95 if !kv.is_empty() => {
                let keys: Vec<&String> = kv.keys().collect();
                let key = keys[rng.gen_range(0..keys.len())].clone();
                kv.remove(&key);
                ops.push(Op::DeleteKey(key));
            }
            96..=99 => {
                expect.push(
                    kv.keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(",")
                        .into_bytes(),
                );
                ops.push(Op::List);
            }
            _ => {}
        }
    }
    // Close whatever is still open, so everything can be read back.
    for (i, f) in files.iter_mut().enumerate() {
        if f.open && !f.deleted {
            f.open = false;
            ops.push(Op::Close(i));
        }
    }
    (ops, expect, files)
}

/// Runs the workload under `root` and returns what every read returned.
async fn run(c: &Client, root: &str, ops: &[Op]) -> Vec<Vec<u8>> {
    let hot = CreateOptions {
        storage_class: Some(0),
        ..CreateOptions::default()
    };
    c.create(root, NodeType::Directory, hot.clone())
        .await
        .unwrap();
    // Class 0 keeps the table's child records on DRAM, so record writes,
    // clears and enumeration go through the mapping too.
    let table = format!("{root}/t");
    c.create(&table, NodeType::Table, hot).await.unwrap();
    let mut writers: HashMap<usize, Node> = HashMap::new();
    let mut out = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let file = |f: &usize| format!("{root}/f{f}");
        match op {
            Op::Create(f) => {
                let n = c
                    .create(&file(f), NodeType::File, CreateOptions::default())
                    .await
                    .unwrap();
                writers.insert(*f, n);
            }
            Op::Append(f, d) => writers.get_mut(f).unwrap().append(d).await.unwrap(),
            Op::Overwrite(f, off, d) => {
                writers.get_mut(f).unwrap().write_at(*off, d).await.unwrap()
            }
            Op::Sync(f) => writers.get_mut(f).unwrap().sync().await.unwrap(),
            Op::Close(f) => writers.remove(f).unwrap().close().await.unwrap(),
            Op::Read(f, off, n) => {
                let got = match writers.get(f) {
                    Some(w) => w.read(*off, *n).await,
                    None => c.lookup(&file(f)).await.unwrap().read(*off, *n).await,
                };
                out.push(got.unwrap_or_else(|e| panic!("step {step} {op:?}: {e}")));
            }
            Op::Delete(f) => c.delete(&file(f), false).await.unwrap(),
            Op::Put(k, v) => c.put(&format!("{table}/{k}"), v).await.unwrap(),
            Op::Get(k) => out.push(c.get(&format!("{table}/{k}")).await.unwrap()),
            Op::DeleteKey(k) => c.delete(&format!("{table}/{k}"), false).await.unwrap(),
            Op::List => {
                let mut keys = c.enumerate(&table).await.unwrap();
                keys.sort();
                out.push(keys.join(",").into_bytes());
            }
        }
    }
    out
}

fn first_difference(a: &[Vec<u8>], b: &[Vec<u8>]) -> Option<usize> {
    (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mapped_and_network_clients_return_identical_bytes() {
    // Most data lands on DRAM; the last seed's spills into the file tier.
    let t = common::start(400 * BS, 2048 * BS).await;
    let client_on = |shared_memory: bool| {
        let mut cfg = t.cluster.client_config();
        cfg.shared_memory = shared_memory;
        Client::connect(cfg)
    };
    let mapped = client_on(true).await.unwrap();
    let network = client_on(false).await.unwrap();
    let dram = t.cluster.stores[0].advertised_addr().to_string();
    let file = t.cluster.stores[1].advertised_addr().to_string();
    assert!(t.cluster.stores[0].shared_memory_name().is_some());
    assert!(t.cluster.stores[1].shared_memory_name().is_none());

    for seed in [1u64, 2, 3] {
        let (ops, expect, files) = plan(seed, 400);
        let on = run(&mapped, &format!("/mapped{seed}"), &ops).await;
        let off = run(&network, &format!("/network{seed}"), &ops).await;
        assert_eq!(on.len(), expect.len());
        assert!(
            first_difference(&on, &off).is_none(),
            "seed {seed}: the paths differ at read {:?}",
            first_difference(&on, &off)
        );
        assert!(
            first_difference(&on, &expect).is_none(),
            "seed {seed}: read {:?} differs from the model",
            first_difference(&on, &expect)
        );
        // Each reads what the other wrote.
        for (i, f) in files.iter().enumerate().filter(|(_, f)| !f.deleted) {
            for (reader, root) in [(&mapped, "network"), (&network, "mapped")] {
                let got = reader.get(&format!("/{root}{seed}/f{i}")).await.unwrap();
                assert!(
                    got == f.data,
                    "seed {seed}: /{root}{seed}/f{i} read across paths"
                );
            }
        }
    }

    // Each client took the path it was configured for.
    assert!(mapped.is_colocated(&dram), "the DRAM server is mapped");
    assert!(!mapped.is_colocated(&file), "the file tier is not");
    let on = mapped.data_path_stats();
    assert!(on.mapped_reads > 100 && on.mapped_writes > 100, "{on:?}");
    assert!(
        on.network_reads > 0 && on.network_writes > 0,
        "file tier: {on:?}"
    );
    let off = network.data_path_stats();
    assert!(!network.is_colocated(&dram));
    assert_eq!((off.mapped_reads, off.mapped_writes), (0, 0), "{off:?}");
    assert!(
        off.network_reads >= on.mapped_reads,
        "every transfer over the network: {off:?} vs {on:?}"
    );
}

/// A client whose storage server stops uses its mapping no longer: it gets
/// the network path's error (the faults tests cover the rest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_is_not_read_through_its_old_mapping() {
    let t = common::start(32 * BS, 0).await;
    let c = &t.client;
    let data = pattern(5, 3 * BS as usize + 17);
    c.put_file("/f", &data).await;
    let reader = c.lookup("/f").await.unwrap();
    assert_eq!(reader.read(0, data.len() as u64).await.unwrap(), data);
    let dram = t.cluster.stores[0].advertised_addr().to_string();
    assert!(c.is_colocated(&dram));

    t.cluster.stores[0].shutdown();
    assert!(!c.is_colocated(&dram), "a closed region is not used");
    let e = reader.read(0, 10).await.unwrap_err();
    assert!(
        matches!(e.code, ErrorCode::Unavailable | ErrorCode::Timeout),
        "{e}"
    );
    assert!(e.message.contains("/f"), "{e}");
}

/// Metadata requests of a client on the metadata server's host go over the
/// server's abstract Unix socket; switched off (on either side) they go
/// over TCP, with the same results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_requests_take_the_unix_socket_on_the_same_host() {
    let t = common::start(64 * BS, 0).await;
    let name = t.cluster.meta.local_socket().expect("meta listens locally");
    assert!(name.starts_with("nodekernel-meta-"), "{name}");
    let tcp = t.cluster.meta_addr().to_string();
    let local = t.client.clone();
    assert_eq!(local.meta_route(0).unwrap(), format!("unix:@{name}"));
    let mut cfg = t.cluster.client_config();
    cfg.unix_sockets = false;
    let remote = Client::connect(cfg).await.unwrap();
    assert_eq!(remote.meta_route(0).unwrap(), tcp);

    // Each sees what the other did.
    local
        .create("/d", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
    local.put("/d/a", b"from unix").await.unwrap();
    remote.put("/d/b", b"from tcp").await.unwrap();
    for c in [&local, &remote] {
        assert_eq!(c.get("/d/a").await.unwrap(), b"from unix");
        assert_eq!(c.get("/d/b").await.unwrap(), b"from tcp");
        let mut names = c.enumerate("/d").await.unwrap();
        names.sort();
        assert_eq!(names, ["a", "b"]);
    }
    let e = local.lookup("/d/none").await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "errors cross the socket: {e}");

    // A stopped server fails the local client at once, which then falls
    // back to the configured address.
    t.cluster.meta.shutdown();
    let e = local.lookup("/d/a").await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable, "not a timeout: {e}");
    assert_eq!(local.meta_route(0).unwrap(), tcp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_server_without_a_unix_socket_is_reached_over_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(16 * BS, 0, &dir);
    cfg.meta.unix_socket = false;
    let t = common::start_with(cfg, dir).await;
    assert_eq!(t.cluster.meta.local_socket(), None);
    assert_eq!(
        t.client.meta_route(0).unwrap(),
        t.cluster.meta_addr().to_string()
    );
    let c = &t.client;
    c.create("/t", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
    c.put("/t/k", b"v").await.unwrap();
    assert_eq!(c.get("/t/k").await.unwrap(), b"v");
}
