//! `nk quota` and `nk du -s` over two metadata partitions (separate `nk
//! meta` processes): `du /` sums the partitions' parts, each partition
//! keeps and enforces the quotas of its top-level names, `quota show`
//! lists them all, and `/` takes no quota.

use crate::common;
use crate::drain::{pattern, start_store, two_partitions, Killed};

use common::{client, nk_ok};

#[test]
fn quotas_and_du_span_every_partition() {
    let dir = tempfile::tempdir().unwrap();
    let mut procs = Killed(Vec::new());
    let metas = two_partitions(dir.path(), &mut procs);
    let list = metas.join(",");
    for _ in 0..2 {
        let (child, _) = start_store(dir.path(), &list, "8MiB");
        procs.0.push(child);
    }
    nk_ok(&list, &["status", "--wait", "--timeout", "120"]);
    let mut bytes = 0;
    for i in 0..8u8 {
        let local = dir.path().join(format!("f{i}"));
        let data = pattern(i, 1000 + 70_000 * i as usize);
        bytes += data.len() as u64;
        std::fs::write(&local, &data).unwrap();
        nk_ok(&list, &["mkdir", &format!("/top{i}")]);
        nk_ok(
            &list,
            &["put", local.to_str().unwrap(), &format!("/top{i}/f")],
        );
    }
    let json = |args: &[&str]| -> serde_json::Value {
        serde_json::from_slice(&nk_ok(&list, args)).unwrap()
    };
    // / is every partition's part: 8 directories and 8 Files.
    let root = json(&["du", "-s", "/", "--json"]);
    assert_eq!(root[0]["nodes"], 16, "{root}");
    assert_eq!(root[0]["bytes"], bytes, "{root}");
    let parts: u64 = (0..8)
        .map(|i| {
            json(&["du", "-s", &format!("/top{i}"), "--json"])[0]["stored"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert_eq!(root[0]["stored"], parts, "{root}");
    // Quotas on three top-level names (/top2 is partition 0's, /top1 and
    // /top5 partition 1's), each enforced by its partition.
    for i in [1, 2, 5] {
        nk_ok(
            &list,
            &["quota", "set", &format!("/top{i}"), "--nodes", "1"],
        );
    }
    let shown = json(&["quota", "show", "--json"]);
    let paths: Vec<&str> = shown
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["/top1", "/top2", "/top5"], "{shown}");
    for i in [1, 2, 5] {
        let out = client(&list)
            .args(["mkdir", &format!("/top{i}/more")])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("QuotaExceeded"), "{err}");
        assert!(
            err.contains(&format!("/top{i}: its quota of 1 nodes")),
            "{err}"
        );
    }
    nk_ok(&list, &["mkdir", "/top3/more"]);
    // / cannot carry a quota across partitions.
    let out = client(&list)
        .args(["quota", "set", "/", "--nodes", "100"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("InvalidArgument"), "{err}");
    assert!(err.contains("2 metadata partitions"), "{err}");
}
