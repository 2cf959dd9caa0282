//! Tenants through `nk mount` and across metadata partitions
//! (`docs/security.md`, *Tenants*), with separate `nk meta` and `nk
//! store` processes. The single-partition case through `nk` is
//! `cli::a_tenant_sees_its_root_through_nk`.

use crate::common;
use crate::drain::{pattern, start_store_with, two_partitions_with, Killed};

use common::{client, nk_ok, start_role, succeeds};
use std::io::{BufRead, BufReader};
use std::process::Stdio;

/// A tenant's `nk mount` (its own token, nothing else) shows its root and
/// only its root; what programs write there lands in the root.
#[test]
fn a_tenants_mount_shows_its_root() {
    if !crate::mount::fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut procs = Killed(Vec::new());
    let a_token = dir.path().join("a.token");
    succeeds(common::nk().args(["token", "new"]).arg(&a_token));
    let cfg = dir.path().join("nk.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[security.tenant]]\nname = \"a\"\ntoken_file = {:?}\nroot = \"/tenants/a\"\n\
             rights = [\"read\", \"write\"]\n",
            a_token.display().to_string()
        ),
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();
    let (meta, addr) = start_role(
        &["meta", "--listen", "127.0.0.1:0", "--config", cfg],
        &[],
        "metadata server listening on",
    );
    procs.0.push(meta);
    let (store, _) = start_role(
        &[
            "store", "--class", "0", "--medium", "dram", "--size", "64MiB", "--config", cfg,
        ],
        &[("NK_META", addr.as_str())],
        "storage server 0",
    );
    procs.0.push(store);
    nk_ok(&addr, &["mkdir", "-p", "/tenants/a", "/private"]);
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let mut mount = client(&addr)
        .env("NK_TOKEN_FILE", &a_token)
        .env("NK_RUNTIME_DIR", elsewhere.path())
        .arg("mount")
        .arg(&mnt)
        .arg("--foreground")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(mount.stdout.take().unwrap()).lines();
    let line = lines.next().expect("nk mount exited").unwrap();
    assert!(line.starts_with("mounted "), "{line}");
    std::thread::spawn(move || for _ in lines {});
    procs.0.push(mount);

    let names = |p: &std::path::Path| {
        let mut v: Vec<String> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert!(names(&mnt).is_empty(), "the tenant's root is empty");
    std::fs::create_dir(mnt.join("d")).unwrap();
    std::fs::write(mnt.join("d/f"), b"written through the mount").unwrap();
    std::fs::rename(mnt.join("d/f"), mnt.join("g")).unwrap();
    assert_eq!(
        std::fs::read(mnt.join("g")).unwrap(),
        b"written through the mount"
    );
    assert_eq!(names(&mnt), ["d", "g"]);
    assert!(!mnt.join("private").exists() && !mnt.join("tenants").exists());
    assert_eq!(
        nk_ok(&addr, &["cat", "/tenants/a/g"]),
        b"written through the mount"
    );
    succeeds(common::nk().arg("umount").arg(&mnt));
}

/// Tenants in a partitioned cluster (`docs/security.md`, *Tenants*): a
/// tenant's tree lies in the partition of its root's top-level name, and
/// its clients talk to that partition's metadata server only, as to a
/// cluster of one; the other partition says which one keeps it.
#[test]
fn a_tenant_talks_to_the_partition_of_its_root() {
    let dir = tempfile::tempdir().unwrap();
    let mut procs = Killed(Vec::new());
    let a_token = dir.path().join("a.token");
    succeeds(common::nk().args(["token", "new"]).arg(&a_token));
    let extra = format!(
        "\n[[security.tenant]]\nname = \"a\"\ntoken_file = {:?}\nroot = \"/tenants/a\"\n\
         rights = [\"read\", \"write\"]\n",
        a_token.display().to_string()
    );
    let metas = two_partitions_with(dir.path(), &mut procs, &extra);
    let list = metas.join(",");
    for _ in 0..2 {
        let (child, _) = start_store_with(dir.path(), &list, "8MiB", &extra);
        procs.0.push(child);
    }
    nk_ok(&list, &["status", "--wait", "--timeout", "120"]);
    nk_ok(&list, &["mkdir", "-p", "/tenants/a"]);
    let elsewhere = tempfile::tempdir().unwrap();
    let tenant = |meta: &str| {
        let mut c = client(meta);
        c.env("NK_TOKEN_FILE", &a_token)
            .env("NK_RUNTIME_DIR", elsewhere.path());
        c
    };
    let tried: Vec<_> = metas
        .iter()
        .map(|m| tenant(m).args(["mkdir", "/d"]).output().unwrap())
        .collect();
    let home = tried
        .iter()
        .position(|o| o.status.success())
        .expect("one serves it");
    let other = &tried[1 - home];
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(
        err.contains("WrongPartition") && err.contains(&format!("partition {home} of 2")),
        "{err}"
    );
    let local = dir.path().join("f");
    let data = pattern(3, 150_000);
    std::fs::write(&local, &data).unwrap();
    succeeds(tenant(&metas[home]).arg("put").arg(&local).arg("/d/f"));
    assert_eq!(succeeds(tenant(&metas[home]).args(["cat", "/d/f"])), data);
    let ls = String::from_utf8(succeeds(tenant(&metas[home]).args(["ls", "/"]))).unwrap();
    assert_eq!(ls.trim(), "d", "{ls}");
    assert_eq!(nk_ok(&list, &["cat", "/tenants/a/d/f"]), data);
    succeeds(tenant(&metas[home]).args(["status"]));
}
