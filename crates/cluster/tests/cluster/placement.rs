//! Storage tiers and placement (README.md, *Semantics in brief*; `docs/tiering.md`), through real
//! clusters with several storage servers per class.

use crate::common;

use common::{pattern, BS};
use nodekernel_client::{BlockLoc, Client, CreateOptions, ErrorCode, NodeType};
use nodekernel_cluster::{ByteSize, Medium, StoreSection};
use std::collections::HashMap;

fn store(class: u8, medium: Medium, blocks: u64, location: &str) -> StoreSection {
    StoreSection {
        class,
        class_name: if class == 0 {
            "dram".into()
        } else {
            "file".into()
        },
        medium,
        size: ByteSize(blocks * BS),
        location: location.into(),
        ..StoreSection::default()
    }
}

/// DRAM: two servers of 4 blocks; file tier: one server of 64 blocks.
async fn two_tiers() -> common::TestCluster {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(0, 0, &dir);
    cfg.store = vec![
        store(0, Medium::Dram, 4, "host-a"),
        store(0, Medium::Dram, 4, "host-b"),
        store(1, Medium::File, 64, "host-a"),
    ];
    common::start_with(cfg, dir).await
}

async fn write(c: &Client, path: &str, blocks: u64, opts: CreateOptions) -> Vec<BlockLoc> {
    let mut n = c.create(path, NodeType::File, opts).await.unwrap();
    n.append(&pattern(blocks, (blocks * BS) as usize))
        .await
        .unwrap();
    n.close().await.unwrap();
    common::blocks_of(c, path).await
}

fn per_server(blocks: &[BlockLoc]) -> HashMap<(u8, u32), usize> {
    let mut m = HashMap::new();
    for b in blocks {
        *m.entry((b.class, b.server)).or_default() += 1;
    }
    m
}

#[tokio::test]
async fn dram_first_round_robin_then_file_tier() {
    let t = two_tiers().await;
    let c = &t.client;
    let blocks = write(c, "/f", 20, CreateOptions::default()).await;
    assert_eq!(blocks.len(), 20);
    let counts = per_server(&blocks);
    let dram: Vec<usize> = counts
        .iter()
        .filter(|((cl, _), _)| *cl == 0)
        .map(|(_, n)| *n)
        .collect();
    assert_eq!(dram, vec![4, 4], "8 DRAM blocks, 4 per server: {counts:?}");
    assert_eq!(
        blocks.iter().filter(|b| b.class == 1).count(),
        12,
        "12 on the file tier"
    );
    assert!(
        blocks[..8].iter().all(|b| b.class == 0),
        "DRAM is used first"
    );
    assert_ne!(
        blocks[0].server, blocks[1].server,
        "round-robin within the class"
    );
    assert_eq!(c.get("/f").await.unwrap(), pattern(20, (20 * BS) as usize));

    c.delete("/f", false).await.unwrap();
    let st = c.status().await.unwrap();
    let used: u64 = st
        .servers
        .iter()
        .filter(|s| s.class == 0)
        .map(|s| s.used_blocks)
        .sum();
    assert_eq!(used, 0, "deleting frees the DRAM blocks");
    let again = write(c, "/g", 1, CreateOptions::default()).await;
    assert_eq!(again[0].class, 0, "a new write goes to DRAM first again");
}

#[tokio::test]
async fn class_preference_and_inheritance() {
    let t = two_tiers().await;
    let c = &t.client;
    let on_file = CreateOptions {
        storage_class: Some(1),
        ..CreateOptions::default()
    };
    let blocks = write(c, "/cold", 3, on_file.clone()).await;
    assert!(
        blocks.iter().all(|b| b.class == 1),
        "the preferred class is used while DRAM is free"
    );
    c.create("/archive", NodeType::Directory, on_file)
        .await
        .unwrap();
    let inherited = write(c, "/archive/x", 2, CreateOptions::default()).await;
    assert!(
        inherited.iter().all(|b| b.class == 1),
        "children inherit the directory's class"
    );
    let hot = CreateOptions {
        storage_class: Some(0),
        ..CreateOptions::default()
    };
    let overridden = write(c, "/archive/hot", 2, hot).await;
    assert!(
        overridden.iter().all(|b| b.class == 0),
        "an explicit class overrides the inherited one"
    );
    assert_eq!(
        c.lookup("/archive/x").await.unwrap().info().storage_class,
        1
    );
    // A full preferred class falls through to the next one.
    // 57 file-tier blocks are left: 60 spill 3 into DRAM.
    let big = write(c, "/archive/big", 60, CreateOptions::default()).await;
    assert!(
        big.iter().any(|b| b.class == 0),
        "file tier full: falls back to DRAM"
    );
}

#[tokio::test]
async fn local_placement_prefers_the_clients_location() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(0, 0, &dir);
    cfg.store = vec![
        store(0, Medium::Dram, 4, "host-a"),
        store(0, Medium::Dram, 4, "host-b"),
        store(1, Medium::File, 64, "host-b"),
    ];
    cfg.client.location = "host-b".into();
    let t = common::start_with(cfg, dir).await;
    let c = &t.client;
    assert_eq!(c.config().location, "host-b");
    let st = c.status().await.unwrap();
    let loc: HashMap<u32, String> = st
        .servers
        .iter()
        .map(|s| (s.id, s.location.clone()))
        .collect();
    let local = CreateOptions {
        local: true,
        ..CreateOptions::default()
    };
    let blocks = write(c, "/l", 6, local).await;
    let where_: Vec<(u8, &str)> = blocks
        .iter()
        .map(|b| (b.class, loc[&b.server].as_str()))
        .collect();
    assert_eq!(
        where_,
        vec![(0, "host-b"); 4]
            .into_iter()
            .chain(vec![(0, "host-a"); 2])
            .collect::<Vec<_>>(),
        "own location while it has room, then the other; DRAM (class) before location"
    );
}

#[tokio::test]
async fn no_space_in_every_class_then_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(0, 0, &dir);
    cfg.store = vec![
        store(0, Medium::Dram, 4, "h"),
        store(1, Medium::File, 8, "h"),
    ];
    let t = common::start_with(cfg, dir).await;
    let c = &t.client;
    // The root's record block takes one file-tier block: 11 left for data.
    let a = pattern(1, (6 * BS) as usize);
    let mut n = c
        .create("/a", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    n.append(&a).await.unwrap();
    n.close().await.unwrap();
    let mut n = c
        .create("/b", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    n.append(&pattern(2, (5 * BS) as usize)).await.unwrap();
    let e = n.append(&[1u8; 10]).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NoSpace, "{e}");
    n.close().await.unwrap();
    let e = c.put_bytes("/c", b"x").await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NoSpace);
    assert_eq!(c.get("/a").await.unwrap(), a, "earlier data intact");
    assert_eq!(c.get("/b").await.unwrap(), pattern(2, (5 * BS) as usize));
    let mut names = c.enumerate("/").await.unwrap();
    names.sort();
    assert!(
        names.starts_with(&["a".to_string(), "b".to_string()]),
        "namespace consistent: {names:?}"
    );
    c.delete("/a", false).await.unwrap();
    c.put_bytes("/c", &pattern(3, (3 * BS) as usize))
        .await
        .unwrap();
    assert_eq!(
        c.get("/c").await.unwrap(),
        pattern(3, (3 * BS) as usize),
        "writes work again at once"
    );
}

trait PutBytes {
    async fn put_bytes(&self, path: &str, data: &[u8]) -> nodekernel_client::Result<()>;
}

impl PutBytes for Client {
    async fn put_bytes(&self, path: &str, data: &[u8]) -> nodekernel_client::Result<()> {
        if self.lookup(path).await.is_ok() {
            self.delete(path, false).await?;
        }
        let mut n = self
            .create(path, NodeType::File, CreateOptions::default())
            .await?;
        n.append(data).await?;
        n.close().await
    }
}
