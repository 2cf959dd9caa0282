//! Namespace semantics through a real cluster (README.md, *Semantics in brief*).

use crate::common;
use common::PutFile;

use nodekernel_client::{CreateOptions, ErrorCode, NodeType};
use NodeType::*;

fn opts() -> CreateOptions {
    CreateOptions::default()
}

#[tokio::test]
async fn every_row_of_the_node_type_table() {
    let t = common::start(8 << 20, 32 << 20).await;
    let c = &t.client;
    // Allowed and refused children of every container type.
    for parent in [Directory, Table, Bag] {
        let p = format!("/{}", parent.name().to_lowercase());
        c.create(&p, parent, opts()).await.unwrap();
        for child in NodeType::ALL {
            let path = format!("{p}/{}", child.name().to_lowercase());
            let r = c.create(&path, child, opts()).await;
            let allowed = match parent {
                Directory => matches!(child, Directory | File | Table | Bag),
                Table => child == KeyValue,
                Bag => child == File,
                _ => unreachable!(),
            };
            match r {
                Ok(n) => {
                    assert!(allowed, "{parent} accepted a {child}");
                    assert_eq!(n.info().ty, child);
                    if !child.is_container() {
                        n.close().await.unwrap();
                    }
                }
                Err(e) => {
                    assert!(!allowed, "{parent} refused a {child}: {e}");
                    assert_eq!(e.code, ErrorCode::TypeMismatch, "{e}");
                    assert!(e.message.contains(&path), "error names the path: {e}");
                }
            }
        }
    }
    // Data nodes hold no children.
    for (data, path) in [(File, "/directory/file"), (KeyValue, "/table/keyvalue")] {
        for child in NodeType::ALL {
            let e = c
                .create(&format!("{path}/x"), child, opts())
                .await
                .unwrap_err();
            assert_eq!(e.code, ErrorCode::TypeMismatch, "{data} <- {child}: {e}");
        }
    }
    // Directories nest; tables and bags are flat.
    c.create("/directory/directory/deeper", Directory, opts())
        .await
        .unwrap();

    // Create on an existing path: fails for everything but KeyValue.
    for (path, ty) in [
        ("/directory", Directory),
        ("/directory/file", File),
        ("/table", Table),
        ("/bag", Bag),
        ("/bag/file", File),
    ] {
        let e = c
            .create(path, ty, opts())
            .await
            .err()
            .unwrap_or_else(|| panic!("{path} recreated"));
        assert_eq!(e.code, ErrorCode::AlreadyExists, "{path}: {e}");
    }
    c.put("/table/k", b"first").await.unwrap();
    let old = c.lookup("/table/k").await.unwrap();
    c.put("/table/k", b"second value").await.unwrap();
    let new = c.lookup("/table/k").await.unwrap();
    assert_ne!(
        old.info().id,
        new.info().id,
        "a KeyValue create replaces the node"
    );
    assert_eq!(c.get("/table/k").await.unwrap(), b"second value");
    let kids = c.enumerate("/table").await.unwrap();
    assert_eq!(
        kids,
        vec!["keyvalue", "k"],
        "one live record per key, in slot order"
    );
}

#[tokio::test]
async fn lookup_delete_and_move() {
    let t = common::start(8 << 20, 32 << 20).await;
    let c = &t.client;
    let e = c.lookup("/missing").await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    assert!(e.message.contains("/missing"));
    let e = c.create("/no/parent", File, opts()).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    assert!(e.message.contains("parent /no"), "{e}");
    assert_eq!(c.lookup("/").await.unwrap().info().ty, Directory);

    c.mkdir("/a/b", true).await.unwrap();
    c.put_file("/a/b/f", b"payload").await;
    for (path, ty) in [("/a", Directory), ("/a/b", Directory)] {
        let e = c.delete(path, false).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::NotEmpty, "{path} ({ty})");
        assert!(
            c.lookup(path).await.is_ok(),
            "failed delete changes nothing"
        );
    }
    c.create("/t", Table, opts()).await.unwrap();
    c.put("/t/k", b"v").await.unwrap();
    assert_eq!(
        c.delete("/t", false).await.unwrap_err().code,
        ErrorCode::NotEmpty
    );
    c.delete("/t", true).await.unwrap();
    assert_eq!(
        c.lookup("/t/k").await.unwrap_err().code,
        ErrorCode::NotFound
    );
    c.delete("/a/b/f", false).await.unwrap();
    c.delete("/a/b", false).await.unwrap();

    // Move: atomic, keeps identity and data, refuses an existing destination.
    c.mkdir("/src/dir", true).await.unwrap();
    c.put_file("/src/dir/f", b"moved bytes").await;
    let id = c.lookup("/src/dir/f").await.unwrap().info().id;
    c.rename("/src/dir", "/a/dir2").await.unwrap();
    assert_eq!(
        c.lookup("/src/dir").await.unwrap_err().code,
        ErrorCode::NotFound
    );
    let moved = c.lookup("/a/dir2/f").await.unwrap();
    assert_eq!(moved.info().id, id);
    assert_eq!(c.get("/a/dir2/f").await.unwrap(), b"moved bytes");
    c.put_file("/a/other", b"x").await;
    let e = c.rename("/a/other", "/a/dir2/f").await.unwrap_err();
    assert_eq!(e.code, ErrorCode::AlreadyExists);
    assert_eq!(c.get("/a/other").await.unwrap(), b"x", "source untouched");
    assert_eq!(
        c.get("/a/dir2/f").await.unwrap(),
        b"moved bytes",
        "destination untouched"
    );
    let e = c.rename("/a", "/a/dir2/inner").await.unwrap_err();
    assert_eq!(
        e.code,
        ErrorCode::InvalidArgument,
        "no move into own subtree: {e}"
    );
    let e = c.rename("/a/other", "/missing/x").await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    c.create("/bag", Bag, opts()).await.unwrap();
    let e = c.rename("/a/dir2", "/bag/d").await.unwrap_err();
    assert_eq!(
        e.code,
        ErrorCode::TypeMismatch,
        "move obeys the child rules"
    );
    let mut names = c.enumerate("/").await.unwrap();
    names.sort();
    assert_eq!(names, vec!["a", "bag", "src"]);
}

#[tokio::test]
async fn invalid_paths_are_refused() {
    let t = common::start(8 << 20, 32 << 20).await;
    let c = &t.client;
    let long = format!("/{}", "n".repeat(256));
    let cases = [
        "",
        "relative",
        "/a//b",
        "/a/",
        "/a/..",
        "/../x",
        "/a/./b",
        "/a\0b",
        long.as_str(),
    ];
    c.mkdir("/a", false).await.unwrap();
    for p in cases {
        let e = c
            .create(p, File, opts())
            .await
            .err()
            .unwrap_or_else(|| panic!("{p:?} accepted"));
        assert_eq!(e.code, ErrorCode::InvalidPath, "{p:?}: {e}");
        assert_eq!(
            c.lookup(p).await.unwrap_err().code,
            ErrorCode::InvalidPath,
            "{p:?}"
        );
        assert_eq!(
            c.delete(p, true).await.unwrap_err().code,
            ErrorCode::InvalidPath,
            "{p:?}"
        );
    }
    let ok = format!("/{}", "n".repeat(255));
    c.create(&ok, Directory, opts()).await.unwrap();
    assert!(
        c.lookup(&ok).await.is_ok(),
        "255-byte names are stored in full"
    );
    // Two long names that differ only in their last byte never collide.
    let a = format!("/{}a", "m".repeat(254));
    let b = format!("/{}b", "m".repeat(254));
    c.create(&a, Directory, opts()).await.unwrap();
    c.create(&b, Directory, opts()).await.unwrap();
    assert_ne!(
        c.lookup(&a).await.unwrap().info().id,
        c.lookup(&b).await.unwrap().info().id
    );
}
