//! `nk snapshot` and `nk restore` end to end: human and `--json` output,
//! an existing target refused without `--force`, an incomplete snapshot
//! directory refused.

use serde_json::Value;
use std::process::{Child, Output};

use crate::common;

use common::{client, nk_ok, start_meta_and_store, start_role, Proc};

fn stop(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn snapshot_and_restore_print_a_summary_and_refuse_what_they_must() {
    let (meta, addr, store) = start_meta_and_store(&[], "64MiB");
    let nk = |args: &[&str]| -> Output { client(&addr).args(args).output().unwrap() };
    let ok = |args: &[&str]| -> String {
        let out = nk(args);
        assert!(out.status.success(), "nk {args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    ok(&["mkdir", "/s", "--type", "table"]);
    ok(&["kv", "put", "/s/a", "hello"]);
    ok(&["kv", "put", "/s/b", "world!"]);
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap");
    let snap = snap.to_str().unwrap();

    // Human output by default.
    let out = ok(&["snapshot", "/s", snap]);
    assert!(out.starts_with("snapshot of /s in "), "{out}");
    assert!(
        out.contains("3 nodes (1 containers, 0 files, 2 key-values)"),
        "{out}"
    );
    // A JSON summary with --json.
    let snap2 = dir.path().join("snap2");
    let out = ok(&["snapshot", "/s/", snap2.to_str().unwrap(), "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["path"], "/s");
    assert_eq!(v["nodes"], 3);
    assert_eq!(v["keyvalues"], 2);
    assert_eq!(v["bytes"], 11);
    assert_eq!(v["packs"], 1);
    assert!(v["seconds"].as_f64().is_some(), "{v}");
    // Into a directory that is not empty: refused.
    let out = nk(&["snapshot", "/s", snap]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not empty"),
        "{}",
        text(&out.stderr)
    );

    let out = ok(&["restore", snap, "/r"]);
    assert!(
        out.starts_with(&format!("restored {snap} to /r: 3 nodes")),
        "{out}"
    );
    assert_eq!(ok(&["kv", "get", "/r/b"]), "world!");
    // An existing target needs --force.
    ok(&["kv", "put", "/r/a", "changed"]);
    let out = nk(&["restore", snap, "/r"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("AlreadyExists") && err.contains("/r"), "{err}");
    assert_eq!(ok(&["kv", "get", "/r/a"]), "changed");
    let out = ok(&["restore", snap, "/r", "--force", "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["path"].as_str(), v["nodes"].as_u64()),
        (Some("/r"), Some(3))
    );
    assert_eq!(ok(&["kv", "get", "/r/a"]), "hello");
    // A directory without a manifest is an incomplete snapshot.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = nk(&["restore", empty.to_str().unwrap(), "/x"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("incomplete"),
        "{}",
        text(&out.stderr)
    );
    stop(store);
    stop(meta);
}

/// With two metadata partitions, a restore builds each top-level name on
/// the partition that owns it, so `--force` replaces top-level targets and
/// all of `/` (moving within a partition, never `CrossPartition`).
#[test]
fn restore_with_force_over_top_level_names_of_two_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let mut procs = Vec::new();
    let mut addrs = Vec::new();
    for p in 0..2 {
        let cfg = dir.path().join(format!("meta-{p}.toml"));
        std::fs::write(
            &cfg,
            format!("[meta]\npartition = {p}\npartitions = 2\nexpect_servers = 1\n"),
        )
        .unwrap();
        let (m, addr) = start_role(
            &["meta", "--listen", "127.0.0.1:0"],
            &[("NK_CONFIG", cfg.to_str().unwrap())],
            "metadata server listening on",
        );
        procs.push(Proc(m));
        addrs.push(addr);
    }
    let metas = addrs.join(",");
    let (store, _) = start_role(
        &[
            "store", "--class", "0", "--medium", "dram", "--size", "64MiB",
        ],
        &[("NK_META", &metas)],
        "storage server",
    );
    procs.push(Proc(store));
    let ok = |args: &[&str]| text(&nk_ok(&metas, args));
    ok(&["status", "--wait", "--timeout", "120"]);
    // A table on each partition.
    let names: Vec<String> = (0..2)
        .map(|p| {
            (0..)
                .map(|i| format!("t{i}"))
                .find(|n| nodekernel_proto::path::partition_of(&format!("/{n}"), 2) == p)
                .unwrap()
        })
        .collect();
    for n in &names {
        ok(&["mkdir", "--type", "table", &format!("/{n}")]);
        ok(&["kv", "put", &format!("/{n}/k"), n]);
    }
    let whole = dir.path().join("whole");
    ok(&["snapshot", "/", whole.to_str().unwrap()]);
    let one = dir.path().join("one");
    ok(&["snapshot", &format!("/{}", names[0]), one.to_str().unwrap()]);

    // Each table replaced by the other's snapshot (any restore name would
    // be owned by one of the partitions only).
    for n in &names {
        ok(&["kv", "put", &format!("/{n}/k"), "changed"]);
        ok(&[
            "restore",
            one.to_str().unwrap(),
            &format!("/{n}"),
            "--force",
        ]);
        assert_eq!(ok(&["kv", "get", &format!("/{n}/k")]), names[0]);
    }
    // All of `/`: both tables back as they were, a later name gone.
    ok(&["mkdir", "/later"]);
    ok(&["restore", whole.to_str().unwrap(), "/", "--force"]);
    for n in &names {
        assert_eq!(ok(&["kv", "get", &format!("/{n}/k")]), *n);
    }
    let listed: Value = serde_json::from_str(&ok(&["ls", "/", "--json"])).unwrap();
    let mut listed: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    listed.sort();
    let mut want: Vec<&str> = names.iter().map(String::as_str).collect();
    want.sort();
    assert_eq!(listed, want, "nothing else is left in /");
}
