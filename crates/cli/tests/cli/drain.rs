//! `nk drain` end to end: two metadata partitions and two storage servers
//! as separate processes; the drained server ends empty in both
//! partitions and every byte stays readable.

use crate::common;

use common::{client, nk_ok, start_role};
use std::process::Child;

pub(crate) fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[(seed % 4) as usize] ^ seed)
        .collect()
}

pub(crate) struct Killed(pub(crate) Vec<Child>);

impl Drop for Killed {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Two metadata partitions (`nk meta` processes, 64 KiB blocks, each
/// expecting 2 storage servers): their addresses, in partition order.
pub(crate) fn two_partitions(dir: &std::path::Path, procs: &mut Killed) -> Vec<String> {
    two_partitions_with(dir, procs, "")
}

/// [`two_partitions`], with `extra` added to each one's configuration.
pub(crate) fn two_partitions_with(
    dir: &std::path::Path,
    procs: &mut Killed,
    extra: &str,
) -> Vec<String> {
    let mut metas = Vec::new();
    for p in 0..2 {
        let cfg = dir.join(format!("meta{p}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[meta]\nlisten = \"127.0.0.1:0\"\nblock_size = \"64KiB\"\npartition = {p}\npartitions = 2\nexpect_servers = 2\n{extra}"
            ),
        )
        .unwrap();
        let (child, addr) = start_role(
            &["--config", cfg.to_str().unwrap(), "meta"],
            &[],
            "metadata server listening on",
        );
        procs.0.push(child);
        metas.push(addr);
    }
    metas
}

/// A DRAM `nk store` of `size` with 64 KiB blocks (the size of
/// [`two_partitions`]' cluster), registered with the metadata servers in
/// `list`: the process and its address.
pub(crate) fn start_store(dir: &std::path::Path, list: &str, size: &str) -> (Child, String) {
    start_store_with(dir, list, size, "")
}

/// [`start_store`], with `extra` added to its configuration.
pub(crate) fn start_store_with(
    dir: &std::path::Path,
    list: &str,
    size: &str,
    extra: &str,
) -> (Child, String) {
    let cfg = dir.join("store.toml");
    std::fs::write(&cfg, format!("[meta]\nblock_size = \"64KiB\"\n{extra}")).unwrap();
    start_role(
        &[
            "--config",
            cfg.to_str().unwrap(),
            "store",
            "--class",
            "0",
            "--medium",
            "dram",
            "--size",
            size,
        ],
        &[("NK_META", list)],
        "storage server 0",
    )
}

#[test]
fn nk_drain_empties_a_server_in_every_partition() {
    let dir = tempfile::tempdir().unwrap();
    let mut procs = Killed(Vec::new());
    let metas = two_partitions(dir.path(), &mut procs);
    let list = metas.join(",");
    let mut stores = Vec::new();
    for _ in 0..2 {
        let (child, addr) = start_store(dir.path(), &list, "8MiB");
        procs.0.push(child);
        stores.push(addr);
    }
    nk_ok(&list, &["status", "--wait", "--timeout", "120"]);
    // Files under several top-level names, so both partitions hold blocks
    // on both servers.
    let mut files = Vec::new();
    for i in 0..8u8 {
        let local = dir.path().join(format!("f{i}"));
        let data = pattern(i, 200_000 + 5_000 * i as usize);
        std::fs::write(&local, &data).unwrap();
        let path = format!("/top{i}/f");
        nk_ok(&list, &["mkdir", &format!("/top{i}")]);
        nk_ok(&list, &["put", local.to_str().unwrap(), &path]);
        files.push((path, data));
    }
    let a = &stores[0];
    let out = nk_ok(&list, &["drain", a, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["state"], "done", "{v}");
    assert_eq!(v["used_blocks"], 0, "{v}");
    assert!(v["moved_blocks"].as_u64().unwrap() > 0, "{v}");
    let parts = v["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 2, "one entry per partition: {v}");
    for (i, p) in parts.iter().enumerate() {
        assert_eq!(p["partition"], i as u64);
        assert_eq!(p["addr"], a.as_str());
        assert_eq!(p["state"], "done");
    }
    for (path, data) in &files {
        assert_eq!(&nk_ok(&list, &["cat", path]), data, "{path}");
    }
    let st: serde_json::Value =
        serde_json::from_slice(&nk_ok(&list, &["status", "--json"])).unwrap();
    let server = st["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["addr"] == a.as_str())
        .unwrap()
        .clone();
    assert_eq!(server["used_blocks"], 0, "{st}");
    assert_eq!(server["draining"], true, "{st}");
    // Text output and cancel.
    let text = String::from_utf8(nk_ok(&list, &["drain", a])).unwrap();
    assert!(text.contains("can be stopped"), "{text}");
    let out = nk_ok(&list, &["drain", a, "--cancel", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["state"], "cancelled", "{v}");
    // A client listing the metadata servers out of partition order is
    // refused at connect, naming the mistake.
    let reversed = format!("{},{}", metas[1], metas[0]);
    let out = client(&reversed).args(["ls", "/"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("InvalidArgument") && err.contains("partition order"),
        "{err}"
    );
    // An unknown server is an error naming it.
    let out = client(&list)
        .args(["drain", "10.9.9.9:1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("UnknownServer") && err.contains("10.9.9.9:1"),
        "{err}"
    );
}

/// A drain with nowhere to go (the only storage server) says so and gives
/// up waiting, with exit status 1, instead of waiting forever.
#[test]
fn nk_drain_with_no_room_elsewhere_gives_up_with_the_reason() {
    let (meta, addr, store) = common::start_meta_and_store(&[], "64MiB");
    let _procs = Killed(vec![meta, store]);
    nk_ok(&addr, &["status", "--wait", "--timeout", "120"]);
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("f");
    std::fs::write(&local, pattern(1, 3 << 20)).unwrap();
    nk_ok(&addr, &["put", local.to_str().unwrap(), "/f"]);
    let st: serde_json::Value =
        serde_json::from_slice(&nk_ok(&addr, &["status", "--json"])).unwrap();
    let server = st["servers"][0]["addr"].as_str().unwrap().to_string();
    let out = client(&addr)
        .args(["drain", &server, "--stuck-after", "2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("makes no progress") && err.contains("NoSpace"),
        "{err}"
    );
    // The data is where it was, still readable.
    assert_eq!(nk_ok(&addr, &["cat", "/f"]), pattern(1, 3 << 20));
}

/// A storage server only some partitions know (it registered with one
/// partition only) is not counted as alive: the cluster is not ready.
#[test]
fn a_server_counts_only_once_every_partition_knows_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut procs = Killed(Vec::new());
    let metas = two_partitions(dir.path(), &mut procs);
    let both = metas.join(",");
    procs.0.push(start_store(dir.path(), &both, "4MiB").0);
    procs.0.push(start_store(dir.path(), &metas[0], "4MiB").0);
    let st: serde_json::Value =
        serde_json::from_slice(&nk_ok(&both, &["status", "--json"])).unwrap();
    assert_eq!(st["ready"], false, "{st}");
    assert_eq!(st["alive_servers"], 1, "{st}");
    assert_eq!(st["servers"].as_array().unwrap().len(), 2, "{st}");
}
