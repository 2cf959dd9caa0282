//! Tests of the metadata messages (`meta.rs`): every request and reply
//! round-trips, and malformed payloads are refused.

use super::*;
use crate::types::ServerStatus;

fn samples() -> Vec<MetaRequest> {
    vec![
        MetaRequest::Create {
            path: "/a/b".into(),
            ty: NodeType::Table,
            storage_class: 1,
            location: "host-a".into(),
            enumerable: false,
            size_hint: 100,
            pinned: true,
            mode: 0o4755,
            mtime: 1_700_000_000_123_456_789,
            open_existing: true,
            ttl_ms: 0,
            child_ttl_ms: 0,
            session: None,
        },
        MetaRequest::Create {
            path: "/jobs/j1".into(),
            ty: NodeType::Directory,
            storage_class: crate::NO_CLASS,
            location: String::new(),
            enumerable: true,
            size_hint: 0,
            pinned: false,
            mode: 0o755,
            mtime: 1,
            open_existing: false,
            ttl_ms: 60_000,
            child_ttl_ms: 1_000,
            session: Some(SessionRef {
                id: 7,
                secret: u128::MAX - 3,
            }),
        },
        MetaRequest::SessionOpen {
            secret: 0x0011_2233_4455_6677_8899_aabb_ccdd_eeff,
            lease_ms: 10_000,
        },
        MetaRequest::SessionRenew { id: 7, secret: 1 },
        MetaRequest::SessionBind {
            id: 7,
            secret: 2,
            path: "/d/.nk-unlinked-1".into(),
        },
        MetaRequest::SessionClose {
            id: u64::MAX,
            secret: 1 << 100,
        },
        MetaRequest::Lookup { path: "/x".into() },
        MetaRequest::Remove {
            path: "/x".into(),
            recursive: true,
        },
        MetaRequest::Move {
            src: "/x".into(),
            dst: "/y".into(),
            replace: true,
        },
        MetaRequest::Enumerate { path: "/".into() },
        MetaRequest::Map {
            node: 9,
            index: 3,
            count: 4,
            alloc: true,
            lease: 77,
            first_write: 100,
        },
        MetaRequest::Outgrow { node: 9, lease: 77 },
        MetaRequest::Reserve {
            size_hint: 100,
            count: 16,
            storage_class: crate::NO_CLASS,
            location: "host-a".into(),
        },
        MetaRequest::Link {
            node: 9,
            lease: 77,
            size: 100,
            mtime: 5,
            path: "/t/k".into(),
        },
        MetaRequest::OpenWrite { path: "/f".into() },
        MetaRequest::Sync {
            node: 9,
            lease: 77,
            size: 1 << 33,
            close: true,
            mtime: 5,
        },
        MetaRequest::Truncate {
            node: 9,
            lease: 77,
            size: 12345,
            mtime: 0,
        },
        MetaRequest::SetAttrs {
            path: "/f".into(),
            mode: Some(0o600),
            mtime: None,
            ttl_ms: None,
            child_ttl_ms: None,
        },
        MetaRequest::SetAttrs {
            path: "/f".into(),
            mode: None,
            mtime: Some(u64::MAX),
            ttl_ms: None,
            child_ttl_ms: None,
        },
        MetaRequest::Register(ServerSpec {
            addr: "127.0.0.1:1".into(),
            class: 0,
            class_name: "dram".into(),
            medium: "dram".into(),
            location: "h".into(),
            block_size: 1 << 20,
            first_block: 0,
            num_blocks: 64,
            identity: "0123abcd".into(),
            incarnation: 7,
            cap_key: [5; 32],
        }),
        MetaRequest::Heartbeat {
            server: 5,
            traffic: Traffic {
                bytes_read: 1,
                bytes_written: 2,
                read_ops: 3,
                write_ops: u64::MAX,
            },
            signed: Signed::sign(&[5; 32], op::HEARTBEAT, b"x", 9),
        },
        MetaRequest::Status,
        MetaRequest::ReleaseSlot {
            container: 3,
            slot: 9,
        },
        MetaRequest::RecordNames {
            container: 3,
            slots: vec![1, 5, 9],
        },
        MetaRequest::RecordAt {
            container: 3,
            slot: 9,
            name: "k9".into(),
        },
        MetaRequest::RecordAt {
            container: 3,
            slot: 9,
            name: String::new(),
        },
        MetaRequest::LocalSocket,
        MetaRequest::Abort { node: 9, lease: 77 },
        MetaRequest::ReplaceBlock {
            node: 9,
            lease: 77,
            index: 2,
            gen: 123,
        },
        MetaRequest::SnapshotBegin { path: "/s".into() },
        MetaRequest::Drain {
            server: "10.0.0.2:7000".into(),
            cancel: true,
        },
        MetaRequest::Policy { set: vec![] },
        MetaRequest::Resize {
            server: "id-1".into(),
            blocks: 300,
            signed: Signed::default(),
        },
        MetaRequest::Policy {
            set: vec![("high_watermark".into(), "80".into())],
        },
        MetaRequest::SnapshotList {
            id: 4,
            entry: 1000,
            block: 3,
        },
        MetaRequest::SnapshotLocate {
            id: 4,
            node: 9,
            index: 2,
            server: 1,
            block: 77,
        },
        MetaRequest::SnapshotEnd { id: 4 },
        MetaRequest::Renew { leases: vec![] },
        MetaRequest::Renew {
            leases: vec![(1, 2), (u64::MAX, 7)],
        },
        MetaRequest::QuotaSet {
            path: "/q".into(),
            quota: crate::quota::Quota {
                bytes: 50 << 30,
                nodes: crate::quota::NO_LIMIT,
            },
        },
        MetaRequest::Usage {
            path: "/q/ü".into(),
        },
        MetaRequest::Quotas,
    ]
}

/// Every request of the table has a sample above (so its encoding is
/// round-tripped), a name and a reply decoder; op codes are unique.
#[test]
fn every_op_of_the_table_has_a_sample_a_name_and_a_reply() {
    let sampled: std::collections::BTreeSet<u16> = samples().iter().map(MetaRequest::op).collect();
    let codes: std::collections::BTreeSet<u16> = op::ALL.iter().copied().collect();
    assert_eq!(codes.len(), op::ALL.len(), "an op code is used twice");
    for &o in op::ALL {
        assert!(
            sampled.contains(&o),
            "no sample of op {o} ({})",
            op::name(o)
        );
        assert_ne!(op::name(o), "other");
        assert!(reply_kind(o).is_some());
    }
    assert_eq!(op::name(999), "other");
    assert_eq!(reply_kind(999), None);
}

#[test]
fn requests_round_trip_and_reject_truncation() {
    for r in samples() {
        let mut b = BytesMut::new();
        r.encode(&mut b);
        assert_eq!(MetaRequest::decode(r.op(), &b).unwrap(), r);
        for cut in 0..b.len() {
            assert!(
                MetaRequest::decode(r.op(), &b[..cut]).is_err(),
                "{r:?} cut {cut}"
            );
        }
        let mut longer = b.clone();
        longer.extend_from_slice(&[0]);
        assert!(
            MetaRequest::decode(r.op(), &longer).is_err(),
            "trailing bytes refused"
        );
    }
    assert!(MetaRequest::decode(999, &[]).is_err());
}

/// Every request fits its kind's limit on a metadata server, also at
/// its largest: paths of `MAX_PATH_LEN`, the most record slots and
/// policy settings, long names. Beyond the most record slots, a
/// request is refused.
#[test]
fn every_request_at_its_largest_fits_its_kinds_limit() {
    let path = format!("/{}", "p".repeat(crate::path::MAX_PATH_LEN - 1));
    let name = "n".repeat(255);
    let mut largest = samples();
    largest.extend([
        MetaRequest::Create {
            path: path.clone(),
            ty: NodeType::File,
            storage_class: 0,
            location: "l".repeat(1000),
            enumerable: true,
            size_hint: u64::MAX,
            pinned: true,
            mode: MAX_MODE,
            mtime: u64::MAX,
            open_existing: true,
            ttl_ms: 0,
            child_ttl_ms: 0,
            session: None,
        },
        MetaRequest::Move {
            src: path.clone(),
            dst: path.clone(),
            replace: true,
        },
        MetaRequest::SetAttrs {
            path: path.clone(),
            mode: Some(MAX_MODE),
            mtime: Some(u64::MAX),
            ttl_ms: None,
            child_ttl_ms: None,
        },
        MetaRequest::RecordNames {
            container: u64::MAX,
            slots: vec![u32::MAX; MAX_RECORD_NAMES],
        },
        MetaRequest::Policy {
            set: vec![(name.clone(), name.clone()); MAX_POLICY_SETS],
        },
        MetaRequest::Register(ServerSpec {
            addr: name.clone(),
            class: 0,
            class_name: name.clone(),
            medium: name.clone(),
            location: name.clone(),
            block_size: 1 << 24,
            first_block: 0,
            num_blocks: u32::MAX,
            identity: name.clone(),
            incarnation: 7,
            cap_key: [5; 32],
        }),
        MetaRequest::Drain {
            server: name.clone(),
            cancel: true,
        },
        MetaRequest::Reserve {
            size_hint: u64::MAX,
            count: MAX_RESERVE,
            storage_class: 0,
            location: "l".repeat(1000),
        },
        MetaRequest::Link {
            node: u64::MAX,
            lease: u64::MAX,
            size: u64::MAX,
            mtime: u64::MAX,
            path: path.clone(),
        },
        MetaRequest::Renew {
            leases: vec![(u64::MAX, u64::MAX); MAX_RENEW_BATCH],
        },
        MetaRequest::Resize {
            server: name.clone(),
            blocks: 300,
            signed: Signed::default(),
        },
        MetaRequest::Heartbeat {
            server: u32::MAX,
            traffic: Traffic {
                bytes_read: u64::MAX,
                bytes_written: u64::MAX,
                read_ops: u64::MAX,
                write_ops: u64::MAX,
            },
            signed: Signed::default(),
        },
    ]);
    for r in largest {
        let mut b = BytesMut::new();
        r.encode(&mut b);
        let limit = max_request_len(r.op());
        assert!(b.len() <= limit, "{} bytes, limit {limit}: {r:?}", b.len());
        assert!(limit < 128 << 10);
    }
    let mut b = BytesMut::new();
    MetaRequest::RecordNames {
        container: 1,
        slots: vec![0; MAX_RECORD_NAMES + 1],
    }
    .encode(&mut b);
    let e = MetaRequest::decode(op::RECORD_NAMES, &b).unwrap_err();
    assert!(e.message.contains("at most 16384"), "{e}");
    let mut b = BytesMut::new();
    MetaRequest::Reserve {
        size_hint: 1,
        count: MAX_RESERVE + 1,
        storage_class: 0,
        location: String::new(),
    }
    .encode(&mut b);
    let e = MetaRequest::decode(op::RESERVE, &b).unwrap_err();
    assert!(e.message.contains("at most 64"), "{e}");
}

#[test]
fn replies_round_trip() {
    let loc = BlockLoc {
        server: 1,
        addr: "a:1".into(),
        block: 2,
        gen: 3,
        class: 0,
        offset: 4096,
        tag: 0,
        cap: crate::cap::Cap::mint(&[1; 32], 2, 3, 0, 1 << 20, crate::cap::Rights::READ, 9),
    };
    let small = BlockLoc {
        offset: 120,
        tag: 77,
        ..loc.clone()
    };
    let node = NodeInfo {
        id: 1,
        ty: NodeType::File,
        size: 10,
        block_size: 1 << 20,
        storage_class: crate::NO_CLASS,
        location: String::new(),
        enumerable: true,
        mode: 0o640,
        mtime: 1_700_000_000_000_000_001,
        lease: 4,
        encrypted: true,
        first_block: Some(loc.clone()),
        record: Some(RecordLoc {
            container: 2,
            slot: 7,
            block: loc.clone(),
            offset: 3584,
        }),
        stored: 1 << 20,
        expires_ms: 0,
        child_ttl_ms: 0,
    };
    let rec = RecordLoc {
        container: 2,
        slot: 1,
        block: loc.clone(),
        offset: 512,
    };
    let status = ClusterStatus {
        block_size: 1 << 20,
        nodes: 3,
        puts_in_progress: 1,
        reserved_puts: 7,
        reclaiming: 2,
        partition: 1,
        partitions: 2,
        expected_servers: 1,
        classes: vec![crate::types::ClassInfo {
            class: 0,
            name: "dram".into(),
            price_per_gib: 5.0,
            encrypt: true,
        }],
        servers: vec![ServerStatus {
            id: 1,
            addr: "a:1".into(),
            class: 0,
            class_name: "dram".into(),
            medium: "dram".into(),
            location: "h".into(),
            block_size: 1 << 20,
            capacity_blocks: 8,
            used_blocks: 2,
            alive: true,
            last_seen_ms: 5,
            identity: "abc".into(),
            draining: true,
            traffic: Traffic {
                bytes_read: 10,
                bytes_written: 20,
                read_ops: 1,
                write_ops: 2,
            },
        }],
        unreachable: Vec::new(),
        moves: vec![crate::types::ClassMoves {
            class: 0,
            demoted: 9,
            promoted: 2,
        }],
        lease_ms: 30_000,
        logs: vec![crate::types::LogStatus {
            partition: 1,
            fsync: "interval 100ms".into(),
            records: 77,
            checkpoint: 50,
            log_bytes: 4096,
        }],
    };
    let usage = crate::quota::UsageInfo {
        path: "/q".into(),
        ty: NodeType::Directory,
        nodes: 3,
        bytes: 5000,
        held: (2 << 20) + 640,
        classes: vec![
            crate::quota::ClassUsage {
                class: 0,
                blocks: 2,
                piece_bytes: 640,
            },
            crate::quota::ClassUsage {
                class: crate::quota::RETIRED_CLASS,
                blocks: 1,
                piece_bytes: 0,
            },
        ],
        quota: Some(crate::quota::Quota {
            bytes: 1 << 30,
            nodes: 10,
        }),
    };
    let cases = [
        (op::LOOKUP, MetaReply::Node(node.clone())),
        (op::HEARTBEAT, MetaReply::Done),
        (op::REMOVE, MetaReply::Record(Some(rec.clone()))),
        (op::SYNC, MetaReply::Record(None)),
        (
            op::MOVE,
            MetaReply::Moved {
                ty: NodeType::Bag,
                clear: Some(rec.clone()),
                write: None,
                replaced: Some(rec.clone()),
            },
        ),
        (
            op::ENUMERATE,
            MetaReply::Listing {
                container: 4,
                block_size: 4096,
                pieces: true,
                slots: 9,
                live: vec![0xFF, 1],
            },
        ),
        (
            op::MAP,
            MetaReply::Blocks {
                size: 5,
                blocks: vec![loc.clone(), small.clone()],
            },
        ),
        (op::REGISTER, MetaReply::Registered { server: 3 }),
        (
            op::SESSION_OPEN,
            MetaReply::Session {
                id: 7,
                lease_ms: 10_000,
            },
        ),
        (
            op::SESSION_RENEW,
            MetaReply::Session {
                id: 7,
                lease_ms: 10_000,
            },
        ),
        (op::SESSION_CLOSE, MetaReply::Done),
        (op::SESSION_BIND, MetaReply::Done),
        (
            op::RESERVE,
            MetaReply::Reserved {
                lease_ms: 30_000,
                puts: vec![node.clone(), node.clone()],
            },
        ),
        (op::LINK, MetaReply::Record(Some(rec.clone()))),
        (
            op::RENEW,
            MetaReply::Renewed {
                lease_ms: 30_000,
                lost: vec![4, 9],
            },
        ),
        (
            op::RECORD_NAMES,
            MetaReply::Names(vec![
                (1, NodeType::File, "a".into()),
                (9, NodeType::Table, "ü".into()),
            ]),
        ),
        (op::STATUS, MetaReply::Status(status)),
        (
            op::DRAIN,
            MetaReply::Drain(DrainStatus {
                partition: 1,
                server: 4,
                addr: "10.0.0.2:7000".into(),
                identity: "abc".into(),
                state: crate::types::DrainState::Draining,
                used_blocks: 12,
                moved_blocks: 30,
                failed_moves: 2,
                unmovable: 1,
                message: "1 block is held by a snapshot".into(),
            }),
        ),
        (
            op::POLICY,
            MetaReply::Policy(vec![("migration".into(), "on".into())]),
        ),
        (
            op::RESIZE,
            MetaReply::Resized(ResizeStatus {
                partition: 1,
                server: 2,
                max_blocks: 100,
                exported_blocks: 80,
                target_blocks: 50,
                used_blocks: 40,
            }),
        ),
        (op::USAGE, MetaReply::Usage(usage.clone())),
        (
            op::QUOTA_SET,
            MetaReply::Usage(crate::quota::UsageInfo {
                quota: None,
                classes: Vec::new(),
                ..usage.clone()
            }),
        ),
        (
            op::QUOTAS,
            MetaReply::Quotas(vec![usage.clone(), usage.clone()]),
        ),
        (op::QUOTAS, MetaReply::Quotas(Vec::new())),
        (op::LOCAL_SOCKET, MetaReply::LocalSocket("nk-meta-1".into())),
        (op::LOCAL_SOCKET, MetaReply::LocalSocket(String::new())),
        (
            op::SNAPSHOT_BEGIN,
            MetaReply::SnapshotBegun {
                id: 7,
                entries: 1 << 20,
            },
        ),
        (
            op::SNAPSHOT_LIST,
            MetaReply::SnapshotPage {
                entries: vec![
                    SnapshotEntry {
                        index: 0,
                        path: String::new(),
                        ty: NodeType::Table,
                        enumerable: false,
                        storage_class: crate::NO_CLASS,
                        node: 3,
                        size: 0,
                        block_size: 1 << 20,
                        encrypted: false,
                        first_block: 0,
                        blocks: Vec::new(),
                    },
                    SnapshotEntry {
                        index: 1,
                        path: "k/ü".into(),
                        ty: NodeType::KeyValue,
                        enumerable: true,
                        storage_class: 1,
                        node: 9,
                        size: 5,
                        block_size: 104,
                        encrypted: true,
                        first_block: 0,
                        blocks: vec![small.clone()],
                    },
                    SnapshotEntry {
                        index: 2,
                        path: "f".into(),
                        ty: NodeType::File,
                        enumerable: true,
                        storage_class: 0,
                        node: 10,
                        size: 5 << 20,
                        block_size: 1 << 20,
                        encrypted: false,
                        first_block: 2,
                        blocks: vec![loc.clone(), loc.clone()],
                    },
                ],
                next_entry: 2,
                next_block: 4,
            },
        ),
        (op::SNAPSHOT_LOCATE, MetaReply::Located(loc.clone())),
        (op::SNAPSHOT_END, MetaReply::Done),
    ];
    for (op, r) in cases {
        let mut b = BytesMut::new();
        r.encode(&mut b);
        assert_eq!(MetaReply::decode(op, &b).unwrap(), r);
        for cut in 0..b.len() {
            assert!(MetaReply::decode(op, &b[..cut]).is_err());
        }
    }
}

#[test]
fn a_small_value_location_leaves_room_for_its_tag() {
    let loc = |offset| BlockLoc {
        server: 1,
        addr: "a:1".into(),
        block: 2,
        gen: 3,
        class: 0,
        offset,
        tag: 77,
        cap: Default::default(),
    };
    let blocks = |offset| {
        let mut b = BytesMut::new();
        MetaReply::Blocks {
            size: 5,
            blocks: vec![loc(offset)],
        }
        .encode(&mut b);
        MetaReply::decode(op::MAP, &b)
    };
    let check = loc(8).tag_check().unwrap();
    assert_eq!((check.at, check.expect), (0, 77));
    blocks(8).unwrap();
    let e = blocks(7).unwrap_err();
    assert!(e.message.contains("no room for its tag"), "{e}");
    assert_eq!(BlockLoc { tag: 0, ..loc(0) }.tag_check(), None);
}

#[test]
fn a_snapshot_page_claiming_more_entries_than_it_holds_is_refused_before_allocating() {
    let mut b = BytesMut::new();
    Enc(&mut b).u64(0).u64(0).u32(u32::MAX);
    let e = MetaReply::decode(op::SNAPSHOT_LIST, &b).unwrap_err();
    assert_eq!(e.code, crate::ErrorCode::Protocol, "{e}");
}

#[test]
fn local_socket_names_are_bounded() {
    for bad in [
        "a\0b".to_string(),
        "x".repeat(crate::store::MAX_SHM_NAME_LEN + 1),
    ] {
        let mut b = BytesMut::new();
        MetaReply::LocalSocket(bad).encode(&mut b);
        let e = MetaReply::decode(op::LOCAL_SOCKET, &b).unwrap_err();
        assert!(e.message.contains("bad socket name"), "{e}");
    }
}

#[test]
fn a_reserved_reply_counts_nodes_at_their_smallest_and_is_bounded() {
    let least = NodeInfo {
        id: 1,
        ty: NodeType::KeyValue,
        size: 0,
        block_size: 0,
        storage_class: 0,
        location: String::new(),
        enumerable: false,
        mode: 0,
        mtime: 0,
        lease: 0,
        encrypted: false,
        first_block: None,
        record: None,
        stored: 0,
        expires_ms: 0,
        child_ttl_ms: 0,
    };
    let mut b = BytesMut::new();
    let reserved = |puts| MetaReply::Reserved { lease_ms: 1, puts };
    reserved(vec![least.clone()]).encode(&mut b);
    assert_eq!(b.len(), 8 + 4 + NodeInfo::MIN_LEN);
    // A count past what the payload can hold is refused before allocating.
    let mut b = BytesMut::new();
    Enc(&mut b).u64(1).u32(u32::MAX);
    assert!(MetaReply::decode(op::RESERVE, &b).is_err());
    let mut b = BytesMut::new();
    reserved(vec![least; MAX_RESERVE as usize + 1]).encode(&mut b);
    let e = MetaReply::decode(op::RESERVE, &b).unwrap_err();
    assert!(e.message.contains("at most 64"), "{e}");
}
