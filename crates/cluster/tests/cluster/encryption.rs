//! Client-side encryption per storage class (`docs/encryption.md`): no
//! plaintext written through a client reaches an encrypted class (its
//! DRAM region or its block file), a changed stored byte reads as
//! `Integrity`, byte ranges and overwrites keep working, a client without
//! the key gets a clear error, and nodes that are not encrypted never go
//! to an encrypted class, by placement or by tier migration.

use crate::common;

use common::{blocks_of, config, start_with, TestCluster, BS};
use nodekernel_client::{
    BufferedWriter, Client, CreateOptions, EncryptionKey, ErrorCode, NodeType, StreamOptions,
};
use nodekernel_cluster::config::{ClassSection, Medium, StoreSection};
use nodekernel_cluster::{ByteSize, Config};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

/// A line no stored byte may show where it is encrypted.
const MARK: &[u8] = b"NodeKernel plaintext that an encrypted class must never hold\n";

fn marked(len: usize) -> Vec<u8> {
    MARK.iter().copied().cycle().take(len).collect()
}

fn key(secret: u8) -> Arc<EncryptionKey> {
    Arc::new(EncryptionKey::from_secret(&[secret; 32], "test").unwrap())
}

fn class(id: u8, name: &str, encrypt: bool) -> ClassSection {
    ClassSection {
        id,
        name: name.into(),
        price_per_gib: 0.0,
        high_watermark: None,
        low_watermark: None,
        encrypt,
    }
}

fn store(class: u8, medium: Medium, blocks: u64) -> StoreSection {
    StoreSection {
        class,
        class_name: format!("c{class}"),
        medium,
        size: ByteSize(blocks * BS),
        ..StoreSection::default()
    }
}

/// A cluster of `stores` in `classes`, and a client holding key 1.
async fn cluster(
    classes: Vec<ClassSection>,
    stores: Vec<StoreSection>,
    tweak: impl FnOnce(&mut Config),
) -> (TestCluster, Client) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(0, 0, &dir);
    cfg.class = classes;
    cfg.store = stores;
    tweak(&mut cfg);
    let t = start_with(cfg, dir).await;
    let c = keyed(&t, key(1), true).await;
    (t, c)
}

/// A client of `t` holding `key`, mapping co-located DRAM or not.
async fn keyed(t: &TestCluster, key: Arc<EncryptionKey>, shared_memory: bool) -> Client {
    let mut cc = t.cluster.client_config();
    cc.encryption_key = Some(key);
    cc.shared_memory = shared_memory;
    Client::connect(cc).await.unwrap()
}

/// Every byte store `i` holds: its DRAM region (the whole memfd or file)
/// or its block file.
fn stored_bytes(t: &TestCluster, i: usize) -> Vec<u8> {
    let s = &t.cluster.stores[i];
    let file = match (s.store().shared_region(), s.block_file()) {
        (Some(r), _) => r.file().try_clone().unwrap(),
        (None, Some(p)) => std::fs::File::open(p).unwrap(),
        (None, None) => panic!("store {i} has neither a region nor a block file"),
    };
    let len = file.metadata().unwrap().len() as usize;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, 0).unwrap();
    buf
}

fn holds_mark(bytes: &[u8]) -> bool {
    // Any 24 bytes of the line: a chunk boundary cuts it nowhere else.
    bytes.windows(24).any(|w| MARK.windows(24).any(|m| m == w))
}

/// Flips one bit of the stored byte at `offset` of block `block` of store
/// `i`, behind the storage server's back (as a disk or a hostile server
/// would).
fn flip(t: &TestCluster, i: usize, block: u32, offset: u64) {
    let s = &t.cluster.stores[i];
    let (file, at) = match (s.store().shared_region(), s.block_file()) {
        (Some(r), _) => (
            r.file().try_clone().unwrap(),
            r.layout().data_offset + u64::from(block) * BS + offset,
        ),
        (None, Some(p)) => (
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .unwrap(),
            u64::from(block) * BS + offset,
        ),
        (None, None) => panic!("store {i} has neither a region nor a block file"),
    };
    let mut b = [0u8; 1];
    file.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0x20;
    file.write_all_at(&b, at).unwrap();
    file.sync_data().unwrap();
}

async fn put_in(c: &Client, path: &str, data: &[u8], class: Option<u8>) {
    let opts = CreateOptions {
        storage_class: class,
        ..CreateOptions::default()
    };
    let mut n = c.create(path, NodeType::File, opts).await.unwrap();
    n.append(data).await.unwrap();
    n.close().await.unwrap();
}

/// A small value (a piece of a shared block) of `class`.
async fn put_small(c: &Client, path: &str, data: &[u8], class: Option<u8>) {
    let opts = CreateOptions {
        storage_class: class,
        size_hint: data.len() as u64,
        ..CreateOptions::default()
    };
    let mut n = c.create(path, NodeType::KeyValue, opts).await.unwrap();
    n.append(data).await.unwrap();
    n.close().await.unwrap();
}

/// A Table for the test's KeyValues (non-enumerable: no child records).
async fn table(c: &Client, path: &str) {
    let opts = CreateOptions {
        enumerable: false,
        ..CreateOptions::default()
    };
    c.create(path, NodeType::Table, opts).await.unwrap();
}

async fn read_all(c: &Client, path: &str) -> nodekernel_client::Result<Vec<u8>> {
    let n = c.lookup(path).await?;
    n.read(0, n.info().size).await
}

/// Encrypted DRAM (class 0) and file (class 1) classes, and a plain DRAM
/// class 2 to show the scan finds plaintext where there is some.
async fn sealed_cluster() -> (TestCluster, Client) {
    sealed_cluster_with(|_| {}).await
}

/// [`sealed_cluster`], its configuration changed by `tweak` first.
async fn sealed_cluster_with(tweak: impl FnOnce(&mut Config)) -> (TestCluster, Client) {
    cluster(
        vec![
            class(0, "dram", true),
            class(1, "file", true),
            class(2, "plain", false),
        ],
        vec![
            store(0, Medium::Dram, 8),
            store(1, Medium::File, 64),
            store(2, Medium::Dram, 16),
        ],
        tweak,
    )
    .await
}

/// Acceptance 4: a known pattern written through the client (a File
/// spilling from DRAM to the file class, appended, overwritten at odd
/// offsets, streamed; small and larger values) reads back whole, and
/// appears nowhere in the encrypted classes' DRAM region or block file,
/// while the plain class holds it.
async fn no_plaintext_in_an_encrypted_class(shared_memory: bool) {
    let (t, _) = sealed_cluster().await;
    let c = keyed(&t, key(1), shared_memory).await;
    let big = marked(12 * BS as usize + 1234);
    put_in(&c, "/f", &big, None).await;
    let mut expect = big.clone();
    {
        let mut n = c.open_write("/f").await.unwrap();
        for (at, len) in [
            (5u64, 100usize),
            (4090, 20),
            (BS - 7, 5000),
            (3 * BS + 1, 9000),
        ] {
            let patch = marked(len + 13)[13..].to_vec();
            n.write_at(at, &patch).await.unwrap();
            expect[at as usize..at as usize + len].copy_from_slice(&patch);
        }
        let tail = marked(777);
        n.append(&tail).await.unwrap();
        expect.extend_from_slice(&tail);
        n.close().await.unwrap();
    }
    let classes: std::collections::BTreeSet<u8> =
        blocks_of(&c, "/f").await.iter().map(|b| b.class).collect();
    assert_eq!(
        classes,
        [0, 1].into(),
        "the File spans both encrypted classes"
    );
    assert_eq!(read_all(&c, "/f").await.unwrap(), expect);
    table(&c, "/t").await;
    for (i, len) in [(0, 100usize), (1, 5000), (2, 60_000)] {
        let v = marked(len + i);
        c.put(&format!("/t/kv{i}"), &v).await.unwrap();
        assert_eq!(c.get(&format!("/t/kv{i}")).await.unwrap(), v);
    }
    let streamed = marked(3 * BS as usize + 99);
    let node = c
        .create("/s", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    let mut w = BufferedWriter::new(node, StreamOptions::new(4 * 5000, 5000).unwrap()).unwrap();
    for piece in streamed.chunks(3333) {
        w.write_all(piece).await.unwrap();
    }
    w.close().await.unwrap();
    assert_eq!(read_all(&c, "/s").await.unwrap(), streamed);
    // The control: the same bytes in the plain class are found.
    put_in(&c, "/plain", &marked(5000), Some(2)).await;
    assert!(!c.lookup("/plain").await.unwrap().info().encrypted);
    assert!(c.lookup("/f").await.unwrap().info().encrypted);

    for (i, what) in [(0, "encrypted DRAM region"), (1, "encrypted block file")] {
        assert!(!holds_mark(&stored_bytes(&t, i)), "plaintext in the {what}");
    }
    assert!(holds_mark(&stored_bytes(&t, 2)), "the scan finds plaintext");
    if shared_memory {
        let dram = t.cluster.stores[0].advertised_addr();
        assert!(c.is_colocated(dram), "the encrypted DRAM server is mapped");
        assert!(c.data_path_stats().mapped_reads > 0);
    }
}

on_both_paths!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] no_plaintext_reaches_an_encrypted_class => no_plaintext_in_an_encrypted_class);

/// Acceptance 4: flipping one stored byte (of a nonce, a ciphertext or a
/// tag; in DRAM, in the block file, in a small value's piece) makes the
/// read fail with `Integrity`, never give other bytes; flipped back, the
/// read works again.
async fn a_flipped_byte_is_integrity(shared_memory: bool) {
    // The bytes are changed where the blocks were when the test began: tier
    // migration (the DRAM class starts above its high watermark) would move
    // them away meanwhile, and a slower build lost that race.
    let (t, _) = sealed_cluster_with(|cfg| cfg.meta.migration = false).await;
    let c = keyed(&t, key(1), shared_memory).await;
    let data = marked(10 * BS as usize);
    put_in(&c, "/f", &data, None).await;
    table(&c, "/t").await;
    c.put("/t/kv", &marked(300)).await.unwrap();
    let locs = blocks_of(&c, "/f").await;
    let dram = locs.iter().position(|b| b.class == 0).unwrap();
    let file = locs.iter().position(|b| b.class == 1).unwrap();
    let kv = blocks_of(&c, "/t/kv").await.remove(0);
    let cases = [
        // (store, block, byte in it, block index of /f or None for /kv)
        (0, locs[dram].block, 3, Some(dram)), // a nonce byte
        (0, locs[dram].block, 4136 + 24 + 99, Some(dram)), // chunk 1's ciphertext
        (1, locs[file].block, 4136 - 1, Some(file)), // chunk 0's tag
        (1, locs[file].block, 60_000, Some(file)), // a later chunk
        (
            usize::from(kv.class),
            kv.block,
            u64::from(kv.offset) + 50,
            None,
        ),
    ];
    for (i, block, offset, index) in cases {
        let what = format!("store {i}, block {block}, byte {offset}");
        flip(&t, i, block, offset);
        let e = match index {
            Some(b) => {
                let n = c.lookup("/f").await.unwrap();
                let bs = n.info().block_size as u64;
                let start = b as u64 * bs;
                // Only the chunks a read covers are opened: a chunk two
                // away reads fine; the flipped one does not, whole or in
                // part.
                let chunk = offset / 4136;
                let away = if chunk >= 2 { chunk - 2 } else { chunk + 2 };
                n.read(start + away * 4096, 10).await.unwrap();
                let part = n.read(start + chunk * 4096 + 1, 3).await.unwrap_err();
                assert_eq!(part.code, ErrorCode::Integrity, "{what}: {part}");
                n.read(start, bs).await.unwrap_err()
            }
            None => c.get("/t/kv").await.unwrap_err(),
        };
        assert_eq!(e.code, ErrorCode::Integrity, "{what}: {e}");
        assert!(e.message.contains("authentication"), "{e}");
        flip(&t, i, block, offset);
        match index {
            Some(_) => assert_eq!(read_all(&c, "/f").await.unwrap(), data, "{what}"),
            None => assert_eq!(c.get("/t/kv").await.unwrap(), marked(300)),
        }
    }
    // A chunk moved to another place does not open there either: swap
    // two chunks of one block.
    let s = &t.cluster.stores[0];
    let r = s.store().shared_region().unwrap();
    let base = r.layout().data_offset + u64::from(locs[dram].block) * BS;
    let (mut a, mut b) = (vec![0u8; 4136], vec![0u8; 4136]);
    r.file().read_exact_at(&mut a, base).unwrap();
    r.file().read_exact_at(&mut b, base + 4136).unwrap();
    r.file().write_all_at(&b, base).unwrap();
    r.file().write_all_at(&a, base + 4136).unwrap();
    let e = read_all(&c, "/f").await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Integrity, "{e}");
}

on_both_paths!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] a_flipped_stored_byte_reads_as_integrity => a_flipped_byte_is_integrity);

/// A client without the key gets `Unauthenticated` naming the key setting
/// (reading or writing an encrypted node), a client with another key
/// `Integrity`; both keep using plain classes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_the_key_gets_a_clear_error() {
    let (t, c) = sealed_cluster().await;
    put_in(&c, "/f", &marked(70_000), None).await;
    table(&c, "/t").await;
    c.put("/t/kv", b"a small encrypted value").await.unwrap();
    let keyless = &t.client;
    for p in ["/f", "/t/kv"] {
        let e = read_all(keyless, p).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
        assert!(
            e.message.contains(p) && e.message.contains("encryption_key_file"),
            "{e}"
        );
    }
    let e = keyless.put("/t/kv2", b"value").await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
    assert!(
        keyless.lookup("/t/kv2").await.is_err(),
        "the failed put left nothing"
    );
    // Plain classes still work without a key.
    put_in(keyless, "/plain", b"plain bytes", Some(2)).await;
    assert_eq!(read_all(keyless, "/plain").await.unwrap(), b"plain bytes");

    let other = keyed(&t, key(2), true).await;
    for p in ["/f", "/t/kv"] {
        let e = read_all(&other, p).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Integrity, "{p}: {e}");
    }
}

/// One operation of the proptest.
#[derive(Debug, Clone)]
enum Op {
    Append(usize),
    Overwrite(u64, usize),
    Read(u64, usize),
    /// Publish, and read what was published through a new handle.
    Sync,
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    let len = prop_oneof![1usize..64, 4000usize..4200, 1usize..3 * BS as usize];
    prop_oneof![
        len.clone().prop_map(Op::Append),
        (any::<u64>(), len.clone()).prop_map(|(at, l)| Op::Overwrite(at, l)),
        (any::<u64>(), len).prop_map(|(at, l)| Op::Read(at, l)),
        Just(Op::Sync),
    ]
}

/// Acceptance 4: random-offset reads and overwrites (appends and partial
/// chunks included) of an encrypted File agree with a plain model, on
/// both data paths.
#[test]
fn random_offset_reads_and_overwrites_round_trip() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config as PtConfig, TestCaseError, TestRunner};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (t, mapped) = rt.block_on(cluster(
        vec![class(0, "dram", true), class(1, "file", true)],
        vec![store(0, Medium::Dram, 64), store(1, Medium::File, 256)],
        |_| {},
    ));
    let network = rt.block_on(keyed(&t, key(1), false));
    let mut runner = TestRunner::new(PtConfig {
        cases: 24,
        ..PtConfig::default()
    });
    let case = std::sync::atomic::AtomicU64::new(0);
    let strategy = (any::<bool>(), proptest::collection::vec(op(), 1..24));
    runner
        .run(&strategy, |(use_mapped, ops)| {
            let c = if use_mapped { &mapped } else { &network };
            let path = format!(
                "/p{}",
                case.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            );
            rt.block_on(async {
                let mut model: Vec<u8> = Vec::new();
                let mut n = c
                    .create(&path, NodeType::File, CreateOptions::default())
                    .await
                    .unwrap();
                prop_assert!(n.info().encrypted);
                let mut seed = 0u64;
                for op in ops {
                    seed += 1;
                    match op {
                        Op::Append(len) => {
                            let d = common::pattern(seed, len);
                            n.append(&d).await.unwrap();
                            model.extend_from_slice(&d);
                        }
                        Op::Overwrite(at, len) if !model.is_empty() => {
                            let at = (at % model.len() as u64) as usize;
                            let len = len.min(model.len() - at);
                            let d = common::pattern(seed, len);
                            n.write_at(at as u64, &d).await.unwrap();
                            model[at..at + len].copy_from_slice(&d);
                        }
                        Op::Read(at, len) if !model.is_empty() => {
                            let at = (at % model.len() as u64) as usize;
                            let len = len.min(model.len() - at);
                            let got = n.read(at as u64, len as u64).await.unwrap();
                            prop_assert!(got == model[at..at + len], "read {len} at {at}");
                        }
                        Op::Overwrite(..) | Op::Read(..) => {}
                        Op::Sync => {
                            n.sync().await.unwrap();
                            let r = c.lookup(&path).await.unwrap();
                            let got = r.read(0, model.len() as u64).await.unwrap();
                            prop_assert!(got == model, "published bytes");
                        }
                    }
                }
                n.close().await.unwrap();
                let got = read_all(c, &path).await.unwrap();
                prop_assert!(got == model, "after close");
                Ok::<(), TestCaseError>(())
            })
        })
        .unwrap();
}

/// The test's names of encrypted nodes: `/eN`, `/t/esN`, `/t/ekN`.
fn is_encrypted(p: &str) -> bool {
    p.starts_with("/e") || p.starts_with("/t/e")
}

/// The tiering rule: a node created for a plain class is not encrypted,
/// and its blocks are never placed in, nor migrated into, an encrypted
/// class (they spill and shed to the plain file class past it); an
/// encrypted node goes anywhere. After DRAM shed under load, the
/// encrypted class's block file still holds no plaintext, and everything
/// reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_nodes_stay_out_of_encrypted_classes_under_tiering() {
    let (t, c) = cluster(
        vec![
            class(0, "dram", false),
            class(1, "sealed", true),
            class(2, "file", false),
        ],
        vec![
            store(0, Medium::Dram, 16),
            store(1, Medium::File, 64),
            store(2, Medium::File, 64),
        ],
        |cfg| {
            cfg.meta.high_watermark = 100;
            cfg.meta.low_watermark = 100;
            cfg.meta.heat_half_life_ms = 600_000;
            cfg.meta.move_rate = ByteSize(0);
        },
    )
    .await;
    // Placement: a plain node spills past the encrypted class.
    let plain = marked(20 * BS as usize);
    put_in(&c, "/plain", &plain, Some(0)).await;
    let n = c.lookup("/plain").await.unwrap();
    assert!(!n.info().encrypted);
    let classes: Vec<u8> = blocks_of(&c, "/plain")
        .await
        .iter()
        .map(|b| b.class)
        .collect();
    assert!(classes.contains(&2) && !classes.contains(&1), "{classes:?}");
    c.delete("/plain", false).await.unwrap();

    // Migration: DRAM holds plain and encrypted Files and small values
    // (plain and encrypted ones of the same stored size, which never share
    // a slab); lowering its watermarks makes it shed.
    let mut files = Vec::new();
    for i in 0..2 {
        let (p, d) = (format!("/p{i}"), marked(BS as usize + i));
        put_in(&c, &p, &d, Some(0)).await;
        files.push((p, d));
        let (p, d) = (format!("/e{i}"), marked(BS as usize + 10 + i));
        put_in(&c, &p, &d, None).await;
        files.push((p, d));
    }
    table(&c, "/t").await;
    for i in 0..20 {
        let (p, d) = (format!("/t/ps{i}"), marked(340 + i % 2));
        put_small(&c, &p, &d, Some(0)).await;
        files.push((p, d));
        let (p, d) = (format!("/t/es{i}"), marked(300 + i % 2));
        c.put(&p, &d).await.unwrap();
        files.push((p, d));
        let (p, d) = (format!("/t/ek{i}"), marked(1000 + i));
        c.put(&p, &d).await.unwrap();
        files.push((p, d));
    }
    for (p, _) in &files {
        let encrypted = c.lookup(p).await.unwrap().info().encrypted;
        assert_eq!(encrypted, is_encrypted(p), "{p}");
        let on: Vec<u8> = blocks_of(&c, p).await.iter().map(|b| b.class).collect();
        assert!(on.iter().all(|&x| x == 0), "{p} starts in DRAM: {on:?}");
    }
    c.policy(&[
        ("high_watermark".into(), "10".into()),
        ("low_watermark".into(), "0".into()),
    ])
    .await
    .unwrap();
    let shed = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let st = c.status().await.unwrap();
            let dram = st
                .servers
                .iter()
                .find(|s| s.class == 0)
                .unwrap()
                .used_blocks;
            let moved = st.moves.iter().map(|m| m.demoted).sum::<u64>();
            if dram == 0 && moved > 0 {
                return st;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("DRAM sheds");
    assert!(
        shed.servers
            .iter()
            .any(|s| s.class == 1 && s.used_blocks > 0),
        "encrypted data moved to the encrypted class"
    );
    for (p, d) in &files {
        let on: Vec<u8> = blocks_of(&c, p).await.iter().map(|b| b.class).collect();
        if !is_encrypted(p) {
            assert!(
                !on.contains(&1),
                "plain {p} moved into the encrypted class: {on:?}"
            );
        }
        assert_eq!(&read_all(&c, p).await.unwrap(), d, "{p}");
    }
    assert!(
        !holds_mark(&stored_bytes(&t, 1)),
        "plaintext in the encrypted class"
    );
    assert!(
        holds_mark(&stored_bytes(&t, 2)),
        "plain data shed to the plain file class"
    );
}
