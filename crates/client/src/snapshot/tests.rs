use super::*;

fn sample() -> Manifest {
    let entry = |path: &str, ty, size, pack, offset| ManifestEntry {
        path: path.into(),
        ty,
        enumerable: true,
        storage_class: nodekernel_proto::NO_CLASS,
        size,
        pack,
        offset,
        crc: 7,
    };
    Manifest {
        created_ms: 1,
        source: "/src".into(),
        block_size: 1 << 20,
        packs: vec![PACK_HEADER_LEN + 10, PACK_HEADER_LEN + 5],
        entries: vec![
            entry("", NodeType::Directory, 0, 0, 0),
            entry("t", NodeType::Table, 0, 0, 0),
            entry("t/k", NodeType::KeyValue, 10, 0, PACK_HEADER_LEN),
            entry("b", NodeType::Bag, 0, 0, 0),
            entry("b/f", NodeType::File, 5, 1, PACK_HEADER_LEN),
            entry("b/g", NodeType::File, 0, 0, PACK_HEADER_LEN),
        ],
    }
}

#[test]
fn a_manifest_round_trips() {
    let m = sample();
    assert_eq!(Manifest::decode(&m.encode(), Path::new("m")).unwrap(), m);
}

#[test]
fn a_damaged_manifest_is_refused_never_a_panic() {
    let good = sample().encode();
    let file = Path::new("/snap/manifest.nks");
    for cut in 0..good.len() {
        let e = Manifest::decode(&good[..cut], file).unwrap_err();
        assert!(e.message.contains("/snap/manifest.nks"), "cut {cut}: {e}");
    }
    for at in 0..good.len() {
        for bit in [0x01u8, 0x80] {
            let mut bad = good.clone();
            bad[at] ^= bit;
            assert!(Manifest::decode(&bad, file).is_err(), "byte {at} flipped");
        }
    }
}

/// A manifest whose checksum is right but whose content breaks a rule.
fn refused(m: &Manifest) -> String {
    Manifest::decode(&m.encode(), Path::new("m"))
        .unwrap_err()
        .message
}

#[test]
fn a_well_formed_manifest_that_breaks_a_rule_is_refused() {
    let mut m = sample();
    m.entries[2].offset = PACK_HEADER_LEN + 1; // past its pack's end
    assert!(refused(&m).contains("outside"), "{}", refused(&m));
    let mut m = sample();
    m.entries[4].pack = 9;
    assert!(refused(&m).contains("pack 9"), "{}", refused(&m));
    let mut m = sample();
    m.entries[2].offset = u64::MAX;
    assert!(refused(&m).contains("outside"));
    let mut m = sample();
    m.entries.swap(1, 2); // a child before its parent
    assert!(refused(&m).contains("parent"), "{}", refused(&m));
    let mut m = sample();
    m.entries[4].ty = NodeType::KeyValue; // a Bag holds Files only
    assert!(refused(&m).contains("cannot hold"), "{}", refused(&m));
    let mut m = sample();
    m.entries[1].path = "t/../x".into();
    assert!(refused(&m).contains(".."), "{}", refused(&m));
    let mut m = sample();
    m.entries[1].path = "x".repeat(300);
    assert!(refused(&m).contains("255"), "{}", refused(&m));
    let mut m = sample();
    m.entries[1].size = 3;
    assert!(refused(&m).contains("container"), "{}", refused(&m));
    let mut m = sample();
    m.entries.clear();
    assert!(refused(&m).contains("no entries"));
    let mut m = sample();
    m.entries[0].path = "r".into();
    assert!(refused(&m).contains("root"));
}

#[test]
fn a_manifest_listing_a_path_twice_is_refused() {
    let dup = |extra: ManifestEntry| {
        let mut m = sample();
        m.entries.push(extra);
        refused(&m)
    };
    let s = sample();
    // A File twice, a Table and a Directory, a Bag and a File, a
    // KeyValue twice.
    let mut dir = s.entries[1].clone();
    dir.ty = NodeType::Directory;
    let mut file = s.entries[5].clone();
    file.path = "b".into();
    for (what, extra) in [
        ("file", s.entries[4].clone()),
        ("table and directory", dir),
        ("bag and file", file),
        ("key-value", s.entries[2].clone()),
    ] {
        let e = dup(extra);
        assert!(e.contains("twice"), "{what}: {e}");
    }
}

#[test]
fn a_manifest_whose_nodes_share_bytes_is_refused() {
    // Two nodes over the same bytes (a snapshot writes them back to
    // back): a small snapshot must not restore as a big tree.
    let mut m = sample();
    m.packs[0] = PACK_HEADER_LEN + 20;
    let mut twin = m.entries[2].clone();
    twin.path = "t/k2".into();
    m.entries.insert(3, twin.clone());
    assert!(refused(&m).contains("overlap"), "{}", refused(&m));
    // Back to back is fine.
    m.entries[3].offset = PACK_HEADER_LEN + 10;
    Manifest::decode(&m.encode(), Path::new("m")).unwrap();
    // And so is an empty node anywhere.
    twin.size = 0;
    twin.path = "t/k3".into();
    m.entries.insert(4, twin);
    Manifest::decode(&m.encode(), Path::new("m")).unwrap();
}

#[test]
fn a_manifest_of_another_version_says_so() {
    let mut b = sample().encode();
    b[8] = 9;
    let e = Manifest::decode(&b, Path::new("m")).unwrap_err();
    assert!(e.message.contains("version 9"), "{e}");
}
