//! Node-type semantics in depth (issue: last-put-wins KeyValues, staleness,
//! data-plane enumeration, Bags), through a real cluster.

use crate::common;

use common::pattern;
use futures::stream::{self, StreamExt};
use nodekernel_client::{CreateOptions, ErrorCode, NodeType};
use rand::{Rng, SeedableRng};
use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

fn opts() -> CreateOptions {
    CreateOptions::default()
}

/// Sizes from 1 B to 3 MiB, log-uniform so every order of magnitude shows up.
fn value_size(rng: &mut impl Rng) -> usize {
    let exp = rng.gen_range(0.0..(3.0 * 1024.0 * 1024.0f64).ln());
    (exp.exp() as usize).clamp(1, 3 << 20)
}

/// A value that identifies itself: an 8-byte header (writer, round) then
/// bytes derived from it, so a torn or foreign value is detectable.
fn value(writer: u64, round: u64, len: usize) -> Vec<u8> {
    let tag = writer << 32 | round;
    let mut v = pattern(tag, len.max(8));
    v[..8].copy_from_slice(&tag.to_le_bytes());
    v.truncate(len.max(8));
    v
}

fn check_value(v: &[u8], sizes: &[Vec<usize>]) -> Result<(u64, u64), String> {
    if v.len() < 8 {
        return Err(format!("value of {} bytes is too short", v.len()));
    }
    let tag = u64::from_le_bytes(v[..8].try_into().unwrap());
    let (w, r) = (tag >> 32, tag & 0xFFFF_FFFF);
    let len = *sizes
        .get(w as usize)
        .and_then(|s| s.get(r as usize))
        .ok_or_else(|| format!("foreign value tagged {w}/{r}"))?;
    if v != value(w, r, len) {
        return Err(format!(
            "torn value {w}/{r}: {} bytes, expected {}",
            v.len(),
            len.max(8)
        ));
    }
    Ok((w, r))
}

on_both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    concurrent_puts_of_one_key_have_one_complete_winner => concurrent_puts
);

async fn concurrent_puts(shared_memory: bool) {
    let t = common::start_on_path(256 << 20, 512 << 20, shared_memory).await;
    t.client
        .create("/t", NodeType::Table, opts())
        .await
        .unwrap();
    const WRITERS: u64 = 32;
    const ROUNDS: u64 = 200;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
    let sizes: Arc<Vec<Vec<usize>>> = Arc::new(
        (0..WRITERS)
            .map(|_| (0..ROUNDS).map(|_| value_size(&mut rng)).collect())
            .collect(),
    );
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let client = t.cluster.client().await.unwrap();
        let sizes = sizes.clone();
        tasks.push(tokio::spawn(async move {
            let mut gets = 0;
            for r in 0..ROUNDS {
                let v = value(w, r, sizes[w as usize][r as usize]);
                client.put("/t/key", &v).await.unwrap();
                // Every get during the run returns some complete written value.
                let got = client.get("/t/key").await.unwrap();
                check_value(&got, &sizes).unwrap();
                gets += 1;
            }
            (gets, client)
        }));
    }
    let mut completed = 0;
    for task in tasks {
        let (gets, client) = task.await.unwrap();
        completed += gets;
        common::assert_data_path(&t, &client, shared_memory);
    }
    // The writers' clients are gone: so are the puts they reserved.
    common::no_puts_in_progress(&t.client).await;
    assert_eq!(completed, WRITERS * ROUNDS, "every get completed");
    let last = t.client.get("/t/key").await.unwrap();
    let (w, r) = check_value(&last, &sizes).unwrap();
    assert_eq!(
        r,
        ROUNDS - 1,
        "the winner is some writer's last put (writer {w})"
    );
    assert_eq!(
        t.client.enumerate("/t").await.unwrap(),
        vec!["key"],
        "one record"
    );
    // Every replaced value's blocks were freed: only the winner's remain,
    // plus the root's record block and the slab of the table's record
    // piece (which a small winner's piece may share: same piece size).
    let used: u64 = t
        .client
        .status()
        .await
        .unwrap()
        .servers
        .iter()
        .map(|s| s.used_blocks)
        .sum();
    let value_blocks = (last.len() as u64).div_ceil(common::BS);
    assert!(
        (value_blocks + 1..=value_blocks + 2).contains(&used),
        "no leaked blocks: {used} used, the winner has {value_blocks}"
    );
}

on_both_paths!(
    #[tokio::test]
    stale_handles_never_read_foreign_bytes => stale_handles
);

async fn stale_handles(shared_memory: bool) {
    // A tiny store, so filling it forces every freed block to be reused.
    let t = common::start_on_path(16 * common::BS, 16 * common::BS, shared_memory).await;
    let c = &t.client;
    c.create("/t", NodeType::Table, opts()).await.unwrap();
    let old = pattern(1, 4 * common::BS as usize);
    c.put("/t/k", &old).await.unwrap();
    let reader = c.lookup("/t/k").await.unwrap();
    assert_eq!(
        reader.read(0, 1000).await.unwrap(),
        &old[..1000],
        "reads part of it"
    );

    // Replace the key: the old handle is stale at once, even though its
    // block locations are cached and the blocks are not reused yet.
    let new = pattern(2, 3 * common::BS as usize);
    c.put("/t/k", &new).await.unwrap();
    let e = reader.read(1000, 1000).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Stale, "{e}");
    assert!(e.message.contains("/t/k"), "{e}");

    // Fill the store so the old blocks are reused by other data.
    let mut fillers = 0;
    loop {
        let mut f = c
            .create(&format!("/fill{fillers}"), NodeType::File, opts())
            .await
            .unwrap();
        let r = f.append(&pattern(100 + fillers, common::BS as usize)).await;
        f.close().await.unwrap();
        match r {
            Ok(()) => fillers += 1,
            Err(e) if e.code == ErrorCode::NoSpace => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        fillers > 4,
        "old blocks were reused ({fillers} filler files)"
    );
    for off in [0u64, 1000, common::BS + 5, 3 * common::BS] {
        let mut buf = vec![0u8; 100];
        let e = reader.read_at(off, &mut buf).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Stale, "offset {off}: {e}");
        assert!(
            buf.iter().all(|b| *b == 0),
            "no foreign bytes leak into the buffer"
        );
    }
    assert_eq!(
        c.get("/t/k").await.unwrap(),
        new,
        "a fresh lookup returns the new value"
    );

    // Deleted nodes are stale too, Files included.
    let f = c.lookup("/fill0").await.unwrap();
    c.delete("/fill0", false).await.unwrap();
    assert_eq!(f.read(0, 10).await.unwrap_err().code, ErrorCode::Stale);
    common::assert_data_path(&t, c, shared_memory);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_of_100k_files_enumerates_exactly_the_live_set() {
    let t = common::start(64 << 20, 256 << 20).await;
    let c = &t.client;
    c.mkdir("/big", false).await.unwrap();
    c.mkdir("/other", false).await.unwrap();
    const N: usize = 100_000;
    const PAR: usize = 64;
    let created: Vec<()> = stream::iter(0..N)
        .map(|i| async move {
            let n = c
                .create(&format!("/big/f{i}"), NodeType::File, opts())
                .await
                .unwrap();
            n.close().await.unwrap();
        })
        .buffer_unordered(PAR)
        .collect()
        .await;
    assert_eq!(created.len(), N);
    let mut live: BTreeSet<String> = (0..N).map(|i| format!("f{i}")).collect();
    let mut other: BTreeSet<String> = BTreeSet::new();

    // 30,000 random deletes and 10,000 moves out of and into the directory.
    let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
    let mut names: Vec<String> = live.iter().cloned().collect();
    let mut ops = Vec::new();
    for _ in 0..30_000 {
        let i = rng.gen_range(0..names.len());
        ops.push(("rm", names.swap_remove(i)));
    }
    for _ in 0..5_000 {
        let i = rng.gen_range(0..names.len());
        ops.push(("out", names.swap_remove(i)));
    }
    for (op, name) in &ops {
        match *op {
            "rm" => {
                live.remove(name);
            }
            _ => {
                live.remove(name);
                other.insert(name.clone());
            }
        }
    }
    let done: Vec<()> = stream::iter(ops.iter())
        .map(|(op, name)| async move {
            match *op {
                "rm" => c.delete(&format!("/big/{name}"), false).await.unwrap(),
                _ => c
                    .rename(&format!("/big/{name}"), &format!("/other/{name}"))
                    .await
                    .unwrap(),
            }
        })
        .buffer_unordered(PAR)
        .collect()
        .await;
    assert_eq!(done.len(), 35_000);
    // 5,000 moved back in under new names.
    let back: Vec<String> = other.iter().take(5_000).cloned().collect();
    let moved: Vec<()> = stream::iter(back.iter())
        .map(|name| async move {
            c.rename(&format!("/other/{name}"), &format!("/big/back-{name}"))
                .await
                .unwrap()
        })
        .buffer_unordered(PAR)
        .collect()
        .await;
    assert_eq!(moved.len(), 5_000);
    for name in &back {
        other.remove(name);
        live.insert(format!("back-{name}"));
    }

    let listed = c.enumerate("/big").await.unwrap();
    let listed_set: BTreeSet<String> = listed.iter().cloned().collect();
    assert_eq!(listed.len(), listed_set.len(), "no duplicates");
    assert_eq!(listed_set, live, "exactly the live set");
    assert_eq!(listed.len(), N - 30_000);
    let other_listed: BTreeSet<String> = c.enumerate("/other").await.unwrap().into_iter().collect();
    assert_eq!(other_listed, other);
    assert_eq!(
        c.lookup("/big").await.unwrap().info().size,
        live.len() as u64
    );
}

#[tokio::test]
async fn churn_does_not_grow_container_data_and_non_enumerable_tables_list_nothing() {
    let t = common::start(32 << 20, 64 << 20).await;
    let c = &t.client;
    c.mkdir("/churn", false).await.unwrap();
    const LIVE: usize = 200;
    for round in 0..20 {
        for i in 0..LIVE {
            let n = c
                .create(&format!("/churn/r{round}-{i}"), NodeType::File, opts())
                .await
                .unwrap();
            n.close().await.unwrap();
        }
        for i in 0..LIVE {
            c.delete(&format!("/churn/r{round}-{i}"), false)
                .await
                .unwrap();
        }
    }
    // 4,000 creates and deletes, never more than LIVE children at once:
    // the record array stays at LIVE slots (a name this short takes one).
    let data_len = container_data_len(c, "/churn").await;
    assert!(
        data_len <= (LIVE * nodekernel_proto::record::SLOT_SIZE) as u64,
        "container data is {data_len} bytes after churn"
    );
    assert!(c.enumerate("/churn").await.unwrap().is_empty());

    let hidden = CreateOptions {
        enumerable: false,
        ..opts()
    };
    c.create("/hidden", NodeType::Table, hidden).await.unwrap();
    for i in 0..50 {
        c.put(&format!("/hidden/k{i}"), b"v").await.unwrap();
    }
    assert!(
        c.enumerate("/hidden").await.unwrap().is_empty(),
        "non-enumerable: empty"
    );
    assert_eq!(
        container_data_len(c, "/hidden").await,
        0,
        "no records written"
    );
    assert_eq!(
        c.get("/hidden/k7").await.unwrap(),
        b"v",
        "keys work as usual"
    );
    c.create("/shown", NodeType::Table, opts()).await.unwrap();
    c.put("/shown/a", b"1").await.unwrap();
    c.put("/shown/b", b"2").await.unwrap();
    c.put("/shown/a", b"3").await.unwrap();
    assert_eq!(c.enumerate("/shown").await.unwrap(), vec!["a", "b"]);
    c.delete("/shown/a", false).await.unwrap();
    assert_eq!(c.enumerate("/shown").await.unwrap(), vec!["b"]);
}

/// Bytes of record data a container holds (the data-plane listing size).
async fn container_data_len(c: &nodekernel_client::Client, path: &str) -> u64 {
    c.container_data_len(path).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bag_reads_back_as_one_stream_with_file_boundaries() {
    let t = common::start(128 << 20, 256 << 20).await;
    let c = &t.client;
    c.create("/bag", NodeType::Bag, opts()).await.unwrap();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(21);
    let sizes: Vec<usize> = (0..64)
        .map(|i| {
            if i % 9 == 0 {
                0
            } else {
                rng.gen_range(0..=5 << 20)
            }
        })
        .collect();
    // 8 writers, each writing 8 Files (one File per writer at a time).
    let mut tasks = Vec::new();
    for w in 0..8 {
        let client = t.cluster.client().await.unwrap();
        let sizes = sizes.clone();
        tasks.push(tokio::spawn(async move {
            for f in (w..64).step_by(8) {
                let mut n = client
                    .create(
                        &format!("/bag/map-{f:02}"),
                        NodeType::File,
                        CreateOptions::default(),
                    )
                    .await
                    .unwrap();
                let data = pattern(1000 + f as u64, sizes[f]);
                for chunk in data.chunks(700_000) {
                    n.append(chunk).await.unwrap();
                }
                n.close().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let order = c.enumerate("/bag").await.unwrap();
    assert_eq!(order.len(), 64);
    let expected: Vec<u8> = order
        .iter()
        .flat_map(|name| {
            let f: usize = name.trim_start_matches("map-").parse().unwrap();
            pattern(1000 + f as u64, sizes[f])
        })
        .collect();
    for in_flight in [1, 16] {
        let mut r = c.read_bag("/bag", in_flight).await.unwrap();
        let files = r.files().to_vec();
        assert_eq!(
            files.iter().map(|f| f.name.clone()).collect::<Vec<_>>(),
            order,
            "documented order"
        );
        let mut offset = 0;
        for f in &files {
            let i: usize = f.name.trim_start_matches("map-").parse().unwrap();
            assert_eq!(
                (f.offset, f.size),
                (offset, sizes[i] as u64),
                "{} boundary",
                f.name
            );
            offset += f.size;
        }
        assert_eq!(r.total_size(), expected.len() as u64);
        // Mix small reads and read_to_end.
        let mut got = vec![0u8; 12_345];
        let n = r.read(&mut got).await.unwrap();
        got.truncate(n);
        got.extend(r.read_to_end().await.unwrap());
        assert!(
            got == expected,
            "exact concatenation with {in_flight} reads in flight"
        );
    }
    let e = c.read_bag("/", 16).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::TypeMismatch);
    let uniq: HashSet<_> = order.iter().collect();
    assert_eq!(uniq.len(), 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn byte_ranges_of_several_files_read_back_as_one_stream_in_the_order_given() {
    let t = common::start(64 << 20, 128 << 20).await;
    let c = &t.client;
    c.mkdir("/r", false).await.unwrap();
    // Files of 0, 1 byte, 1.5 blocks and 3.2 blocks; a KeyValue in a Table.
    let sizes = [0u64, 1, 3 << 19, (16 << 20) / 5];
    for (i, size) in sizes.iter().enumerate() {
        let mut n = c
            .create(&format!("/r/f{i}"), NodeType::File, opts())
            .await
            .unwrap();
        n.append(&pattern(40 + i as u64, *size as usize))
            .await
            .unwrap();
        n.close().await.unwrap();
    }
    c.create("/r/t", NodeType::Table, opts()).await.unwrap();
    c.put("/r/t/k", b"small value").await.unwrap();
    let range = |path: &str, offset: u64, len: u64| nodekernel_client::ByteRange {
        path: path.to_string(),
        offset,
        len,
    };
    let ranges = vec![
        range("/r/f3", (1 << 20) - 7, (2 << 20) + 14), // across three blocks
        range("/r/t/k", 6, 5),
        range("/r/f0", 0, 0),
        range("/r/f2", 0, 3 << 19), // a whole File
        range("/r/f3", 0, 3),       // the same File again, earlier bytes
        range("/r/f1", 0, 1),
    ];
    let mut expected = Vec::new();
    for r in &ranges {
        let whole = c.get(&r.path).await.unwrap();
        expected.extend_from_slice(&whole[r.offset as usize..(r.offset + r.len) as usize]);
    }
    for in_flight in [1, 16] {
        let mut s = c.read_ranges(&ranges, in_flight).await.unwrap();
        assert_eq!(s.total_size(), expected.len() as u64);
        let starts: Vec<(String, u64, u64)> = s
            .files()
            .iter()
            .map(|e| (e.name.clone(), e.offset, e.size))
            .collect();
        let mut at = 0;
        for (e, r) in starts.iter().zip(&ranges) {
            assert_eq!(e, &(r.path.clone(), at, r.len), "entry of {r:?}");
            at += r.len;
        }
        let mut got = vec![0u8; 1000];
        let n = s.read(&mut got).await.unwrap();
        got.truncate(n);
        got.extend(s.read_to_end().await.unwrap());
        assert!(got == expected, "{in_flight} reads in flight");
    }
    assert_eq!(c.read_ranges(&[], 4).await.unwrap().total_size(), 0);

    // Failures come before any byte (past the end, missing, a container),
    // each naming the range it is about.
    let fails = |rs: Vec<nodekernel_client::ByteRange>| async move {
        c.read_ranges(&rs, 4).await.unwrap_err()
    };
    let past = fails(vec![range("/r/f1", 0, 1), range("/r/f2", 1, 3 << 19)]).await;
    assert_eq!(
        (past.error.code, past.range),
        (ErrorCode::OutOfRange, Some(1))
    );
    assert!(
        past.to_string()
            .contains("range 1 (bytes 1..1572865 of /r/f2)"),
        "{past}"
    );
    let wrap = fails(vec![range("/r/f1", u64::MAX, 2)]).await;
    assert_eq!(
        (wrap.error.code, wrap.range),
        (ErrorCode::OutOfRange, Some(0))
    );
    let missing = fails(vec![
        range("/r/f1", 0, 1),
        range("/r/nothing", 0, 0),
        range("/r/f2", 0, 1),
        range("/r/nothing", 1, 0),
    ])
    .await;
    assert_eq!(
        (missing.error.code, missing.range),
        (ErrorCode::NotFound, Some(1)),
        "the first range of the missing path: {missing}"
    );
    let dir = fails(vec![range("/r/f1", 0, 1), range("/r", 0, 0)]).await;
    assert_eq!(
        (dir.error.code, dir.range),
        (ErrorCode::TypeMismatch, Some(1))
    );
    let too_many = vec![range("/r/f1", 0, 0); nodekernel_client::MAX_RANGES + 1];
    let e = c.read_ranges(&too_many, 4).await.unwrap_err();
    assert_eq!((e.error.code, e.range), (ErrorCode::InvalidArgument, None));
}

/// A writer that aborts keeps what its last sync published, and the next
/// writer appends right after it (a shuffle slot File reused after a
/// failed task).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_after_an_aborted_writer_continues_at_the_published_size() {
    let t = common::start(64 << 20, 128 << 20).await;
    let c = &t.client;
    let mut w = c.create("/slot", NodeType::File, opts()).await.unwrap();
    w.append(b"kept|").await.unwrap();
    w.sync().await.unwrap();
    w.append(&pattern(7, 3 << 20)).await.unwrap(); // into new blocks
    w.abort().await.unwrap();
    assert_eq!(c.lookup("/slot").await.unwrap().size(), 5);

    let mut w = c.open_write("/slot").await.unwrap();
    assert_eq!(w.size(), 5);
    w.append(b"next").await.unwrap();
    w.close().await.unwrap();
    assert_eq!(c.get("/slot").await.unwrap(), b"kept|next");
}

/// `open_append` creates a missing File with the options given and appends
/// to an existing one, one metadata call either way (how a shuffle writer
/// opens its slot File in a partition's Bag without creating it up front).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_or_create_makes_a_missing_file_and_continues_an_existing_one() {
    let t = common::start(64 << 20, 128 << 20).await;
    let c = &t.client;
    c.create("/p0", NodeType::Bag, opts()).await.unwrap();
    let mode = CreateOptions {
        mode: Some(0o600),
        ..opts()
    };
    let mut w = c.open_append("/p0/e1-t0", mode.clone()).await.unwrap();
    assert_eq!(w.size(), 0);
    w.append(b"first|").await.unwrap();
    let busy = c.open_append("/p0/e1-t0", mode.clone()).await.unwrap_err();
    assert_eq!(busy.code, ErrorCode::Busy, "one writer at a time");
    w.close().await.unwrap();

    let mut w = c.open_append("/p0/e1-t0", opts()).await.unwrap();
    assert_eq!(w.size(), 6, "the existing File is opened where it ends");
    w.append(b"second").await.unwrap();
    w.close().await.unwrap();
    assert_eq!(c.get("/p0/e1-t0").await.unwrap(), b"first|second");
    assert_eq!(c.lookup("/p0/e1-t0").await.unwrap().info().mode, 0o600);

    let taken = c.open_append("/p0", opts()).await.unwrap_err();
    assert_eq!(taken.code, ErrorCode::AlreadyExists, "a Bag is not a File");
    let orphan = c.open_append("/nowhere/f", opts()).await.unwrap_err();
    assert_eq!(orphan.code, ErrorCode::NotFound);
}

/// `get_many` answers every key in the order given, each as `get` would:
/// a missing key is its own `NotFound`, values of one byte to several
/// blocks come back whole, and too many keys are refused up front.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_many_answers_each_key_in_order_and_a_missing_one_alone() {
    let t = common::start(64 << 20, 128 << 20).await;
    let c = &t.client;
    c.create("/idx", NodeType::Table, opts()).await.unwrap();
    let mut want = Vec::new();
    for (i, len) in [1usize, 700, 5 << 20, 0, 33].into_iter().enumerate() {
        let v = pattern(i as u64, len);
        c.put(&format!("/idx/m{i}"), &v).await.unwrap();
        want.push(Some(v));
    }
    want.insert(2, None);
    let keys: Vec<String> = (0..want.len())
        .map(|i| match i {
            2 => "/idx/gone".to_string(),
            i if i < 2 => format!("/idx/m{i}"),
            i => format!("/idx/m{}", i - 1),
        })
        .collect();
    for in_flight in [1, 3, 64] {
        let got = c.get_many(&keys, in_flight).await.unwrap();
        assert_eq!(got.len(), keys.len());
        for ((key, want), got) in keys.iter().zip(&want).zip(got) {
            match (want, got) {
                (Some(v), Ok(g)) => assert!(*v == g, "{key}: wrong value"),
                (None, Err(e)) => {
                    assert_eq!(e.code, ErrorCode::NotFound, "{key}");
                    assert!(e.message.contains(key), "{key}: {}", e.message);
                }
                (w, g) => panic!(
                    "{key}: wanted {:?}, got {:?}",
                    w.as_ref().map(Vec::len),
                    g.as_ref().map(Vec::len)
                ),
            }
        }
    }
    let none: [&str; 0] = [];
    assert!(c.get_many(&none, 4).await.unwrap().is_empty());
    let too_many = vec!["/idx/m0"; nodekernel_client::MAX_GET_MANY + 1];
    let e = c.get_many(&too_many, 4).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument);
}

/// `put_many` answers every item in the order given, each as `put` would:
/// values of no bytes to several blocks are stored whole, an existing key
/// is replaced, a key given twice keeps its last value, and a key that
/// cannot be put (no parent, a bad path) fails alone while the others are
/// stored; too many items are refused up front and nothing is put.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_many_answers_each_item_in_order_and_a_failing_one_alone() {
    let t = common::start(64 << 20, 128 << 20).await;
    let c = &t.client;
    c.create("/t", NodeType::Table, opts()).await.unwrap();
    for in_flight in [0usize, 1, 3, 64] {
        let k = |name: &str| format!("/t/{in_flight}-{name}");
        c.put(&k("old"), b"the old value").await.unwrap();
        let items: Vec<(String, Vec<u8>)> = vec![
            (k("a"), pattern(1, 100)),
            (format!("/none/{in_flight}"), pattern(2, 10)),
            (k("big"), pattern(3, 5 << 20 | 3)),
            (k("old"), pattern(4, 77)),
            ("relative".to_string(), pattern(5, 1)),
            (k("empty"), Vec::new()),
            (k("twice"), pattern(6, 300)),
            (k("twice"), pattern(7, 200)),
        ];
        let got = c.put_many(&items, in_flight).await.unwrap();
        assert_eq!(got.len(), items.len());
        for ((key, _), r) in items.iter().zip(&got) {
            match key.as_str() {
                k if k.starts_with("/none/") => {
                    let e = r.as_ref().unwrap_err();
                    assert_eq!(e.code, ErrorCode::NotFound, "{key}: {e}");
                    assert!(e.message.contains(key), "{key}: {}", e.message);
                }
                "relative" => {
                    let e = r.as_ref().unwrap_err();
                    assert_eq!(e.code, ErrorCode::InvalidPath, "{key}: {e}");
                }
                _ => assert!(r.is_ok(), "{key}: {r:?}"),
            }
        }
        for (i, (key, value)) in items.iter().enumerate() {
            if got[i].is_err() || (key.ends_with("-twice") && i == 6) {
                continue;
            }
            assert!(c.get(key).await.unwrap() == *value, "{key}: wrong value");
        }
    }
    let none: [(&str, &[u8]); 0] = [];
    assert!(c.put_many(&none, 4).await.unwrap().is_empty());
    let item: (&str, &[u8]) = ("/t/over", b"x");
    let too_many = vec![item; nodekernel_client::MAX_PUT_MANY + 1];
    let e = c.put_many(&too_many, 4).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument);
    let e = c.get("/t/over").await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "a refused batch put nothing");
}

/// `delete_many` answers every key in the order given, each as `delete`
/// would: a missing key (or a key given a second time) is its own
/// `NotFound` and the others are gone; a non-empty container needs
/// `recursive`; too many keys are refused up front and nothing is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_many_answers_each_key_in_order_and_a_missing_one_alone() {
    let t = common::start(64 << 20, 128 << 20).await;
    let c = &t.client;
    c.create("/t", NodeType::Table, opts()).await.unwrap();
    for in_flight in [0usize, 1, 3, 64] {
        let k = |name: &str| format!("/t/{in_flight}-{name}");
        for name in ["a", "b", "c"] {
            c.put(&k(name), &pattern(9, 1000)).await.unwrap();
        }
        let keys = [k("a"), k("gone"), k("b"), k("a"), k("c")];
        let got = c.delete_many(&keys, false, in_flight).await.unwrap();
        assert_eq!(got.len(), keys.len());
        for (i, (key, r)) in keys.iter().zip(&got).enumerate() {
            if i == 1 || i == 3 {
                let e = r.as_ref().unwrap_err();
                assert_eq!(e.code, ErrorCode::NotFound, "{key}: {e}");
                assert!(e.message.contains(key.as_str()), "{key}: {}", e.message);
            } else {
                assert!(r.is_ok(), "{key}: {r:?}");
            }
            let e = c.lookup(key).await.unwrap_err();
            assert_eq!(e.code, ErrorCode::NotFound, "{key} is gone");
        }
    }
    c.put("/t/kept", b"x").await.unwrap();
    let got = c.delete_many(&["/t"], false, 2).await.unwrap();
    assert_eq!(got[0].as_ref().unwrap_err().code, ErrorCode::NotEmpty);
    let too_many = vec!["/t/kept"; nodekernel_client::MAX_DELETE_MANY + 1];
    let e = c.delete_many(&too_many, false, 4).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument);
    assert_eq!(
        c.get("/t/kept").await.unwrap(),
        b"x",
        "a refused batch deleted nothing"
    );
    let got = c.delete_many(&["/t"], true, 2).await.unwrap();
    assert!(got[0].is_ok(), "{got:?}");
    assert_eq!(
        c.lookup("/t/kept").await.unwrap_err().code,
        ErrorCode::NotFound
    );
}

/// `create_replacing` (Python's `open(path, "wb")`) from several writers
/// of one path at once: each replaces the File in turn, a writer whose
/// File another replaced finds its handle `Stale`, none fails with
/// `NotFound` (another deleted the File between its lookup and its
/// delete), and the File left holds one writer's bytes, whole. Another
/// node type at the path is `TypeMismatch`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_replacing_creates_of_one_path_each_replace_it_in_turn() {
    let t = common::start(64 << 20, 128 << 20).await;
    let c = &t.client;
    c.mkdir("/r", false).await.unwrap();
    let mut first = c.create_replacing("/r/f", opts()).await.unwrap();
    first.append(b"first").await.unwrap();
    first.close().await.unwrap();
    let values: Vec<Vec<u8>> = (0..8u64).map(|i| pattern(i, 1000)).collect();
    for _ in 0..20 {
        let results = futures::future::join_all(values.iter().map(|v| async move {
            let mut node = c.create_replacing("/r/f", opts()).await?;
            node.append(v).await?;
            node.close().await
        }))
        .await;
        for r in results {
            if let Err(e) = r {
                assert_eq!(e.code, ErrorCode::Stale, "{e}");
            }
        }
        let got = c.get("/r/f").await.unwrap();
        assert!(values.contains(&got), "a value no writer wrote whole");
    }
    let e = c.create_replacing("/r", opts()).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::TypeMismatch, "{e}");
}

/// Containers with a few children take pieces of shared blocks for their
/// records, not a block each (`docs/records.md`): a thousand directories
/// holding one empty File each fit in a few dozen 64 KiB blocks (a block
/// each would be 1,000), every one lists its child, and a directory
/// growing past its pieces into blocks still lists exactly its children.
#[tokio::test]
async fn a_thousand_small_directories_share_blocks_for_their_records() {
    let t = common::start(128 << 20, 0).await;
    let c = &t.client;
    let used = |st: &nodekernel_client::ClusterStatus| -> u64 {
        st.servers.iter().map(|s| s.used_blocks).sum()
    };
    let before = used(&c.status().await.unwrap());
    const DIRS: usize = 1000;
    let made: Vec<()> = stream::iter(0..DIRS)
        .map(|i| async move {
            c.mkdir(&format!("/d{i}"), false).await.unwrap();
            let f = c
                .create(&format!("/d{i}/f{i}"), NodeType::File, opts())
                .await
                .unwrap();
            f.close().await.unwrap();
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert_eq!(made.len(), DIRS);
    let blocks = used(&c.status().await.unwrap()) - before;
    // A directory's one record: a 640-byte piece, 102 to a 64 KiB slab
    // (10 slabs). The root's 1,000 records: eight blocks of 128 (the root
    // keeps its records in blocks).
    assert!(blocks <= 10 + 8, "{blocks} blocks for {DIRS} directories");
    let listed: Vec<()> = stream::iter(0..DIRS)
        .map(|i| async move {
            assert_eq!(
                c.enumerate(&format!("/d{i}")).await.unwrap(),
                [format!("f{i}")]
            );
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert_eq!(listed.len(), DIRS);
    let mut root = c.enumerate("/").await.unwrap();
    root.sort();
    let mut want: Vec<String> = (0..DIRS).map(|i| format!("d{i}")).collect();
    want.sort();
    assert_eq!(root, want);

    // One directory grows through every piece into blocks and shrinks
    // again: each listing is exactly its children, in slot order.
    c.mkdir("/grow", false).await.unwrap();
    let mut names = Vec::new();
    for i in 0..300 {
        let name = format!("n{i}");
        c.create(&format!("/grow/{name}"), NodeType::Directory, opts())
            .await
            .unwrap();
        names.push(name);
        if [0, 1, 2, 3, 6, 7, 65, 66, 67, 193, 194, 299].contains(&i) {
            assert_eq!(c.enumerate("/grow").await.unwrap(), names, "{i}");
        }
    }
    for i in (0..300).step_by(3) {
        c.delete(&format!("/grow/n{i}"), false).await.unwrap();
    }
    names.retain(|n| n[1..].parse::<usize>().unwrap() % 3 != 0);
    assert_eq!(c.enumerate("/grow").await.unwrap(), names);
}
