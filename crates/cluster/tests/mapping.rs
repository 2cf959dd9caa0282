//! Clients of one process share their mapping of a co-located DRAM server
//! (one set of page tables, pages mapped in once for all). Alone in its own
//! test binary, so no other test's mappings show in /proc/self/maps.

#[path = "cluster/common/mod.rs"]
#[macro_use]
mod common;

use nodekernel_client::{Client, CreateOptions, NodeType};
use std::time::{Duration, Instant};

/// Mappings of DRAM server memory in this process (the servers' own and
/// the clients').
fn dram_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("nodekernel-dram"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_a_process_share_one_mapping() {
    let t = common::start(64 * common::BS, 0).await;
    let dram = t.cluster.stores[0].advertised_addr().to_string();
    let server_only = dram_mappings();
    assert_eq!(server_only, 1, "the server's own mapping");
    t.client
        .create("/t", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
    let mut clients = Vec::new();
    for i in 0..3u8 {
        let c = Client::connect(t.cluster.client_config()).await.unwrap();
        c.put(&format!("/t/k{i}"), &[i; 100]).await.unwrap();
        assert!(c.is_colocated(&dram));
        clients.push(c);
    }
    for c in &clients {
        assert_eq!(c.get("/t/k2").await.unwrap(), [2u8; 100]);
    }
    assert_eq!(
        dram_mappings(),
        2,
        "server + one mapping shared by all clients"
    );

    // The mapping goes when its last client does (its background thread
    // may hold it for the rest of one prefault step).
    drop(clients);
    drop(t.client);
    let start = Instant::now();
    while dram_mappings() > 1 && start.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(dram_mappings(), 1, "unmapped with the last client");
}
