//! Small Files in pieces (`docs/small-values.md`, *Small Files*), through
//! a real cluster on both data paths: a small File written and closed
//! takes a piece its size; written on, it outgrows the piece into blocks
//! without its readers ever seeing other bytes than those published.

use crate::common;

use common::{pattern, used_blocks, PutFile};
use nodekernel_client::{BufferedWriter, Client, CreateOptions, NodeType, StreamOptions};

const MIB: u64 = 1 << 20;

/// Whether `path`'s block 0 is a piece of a shared block.
async fn in_piece(c: &Client, path: &str) -> bool {
    let n = c.lookup(path).await.unwrap();
    n.info().first_block.as_ref().is_some_and(|b| b.tag != 0)
}

async fn read_all(c: &Client, path: &str) -> Vec<u8> {
    let n = c.lookup(path).await.unwrap();
    n.read(0, n.size()).await.unwrap()
}

on_both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_small_file_takes_a_piece_and_outgrows_it => outgrow
);

async fn outgrow(shared_memory: bool) {
    let t = common::start_on_path(4 * MIB, 0, shared_memory).await;
    let c = &t.client;
    let first = pattern(1, 100);
    // The root's record block, taken by its first child.
    c.create("/setup", NodeType::Directory, CreateOptions::default())
        .await
        .unwrap();
    let before = used_blocks(c).await;
    c.put_file("/f", &first).await;
    assert!(in_piece(c, "/f").await, "a 100-byte File is in a piece");
    let r = c.lookup("/f").await.unwrap();
    assert_eq!(r.info().stored, 112, "a 112-byte piece");
    assert_eq!(used_blocks(c).await, before + 1, "one shared slab");
    assert_eq!(r.read(0, 100).await.unwrap(), first);

    // Written on past the piece: readers see the piece's bytes until the
    // writer syncs.
    let more = pattern(2, 300);
    let mut w = c.open_write("/f").await.unwrap();
    w.append(&more).await.unwrap();
    assert!(in_piece(c, "/f").await, "published: still the piece");
    assert_eq!(read_all(c, "/f").await, first);
    let inside = c.lookup("/f").await.unwrap();
    assert_eq!(inside.read(0, 100).await.unwrap(), first);
    w.sync().await.unwrap();
    assert!(!in_piece(c, "/f").await, "synced: the block");
    // A reader of the piece's bytes: the piece's tag is gone, it re-maps
    // block 0 and reads them from the block.
    assert_eq!(inside.read(0, 100).await.unwrap(), first);
    let mut want = first.clone();
    want.extend_from_slice(&more);
    assert_eq!(read_all(c, "/f").await, want);
    // The reader from before follows it off its piece.
    assert_eq!(r.read(0, 400).await.unwrap(), want);

    // And on over several blocks.
    let big = pattern(3, 150 << 10);
    w.append(&big).await.unwrap();
    w.close().await.unwrap();
    want.extend_from_slice(&big);
    assert_eq!(read_all(c, "/f").await, want);
    let r = c.lookup("/f").await.unwrap();
    assert_eq!(r.info().stored, 3 * common::BS);
    assert_eq!(
        used_blocks(c).await,
        before + 3,
        "the piece's slab went back"
    );

    // A writer that outgrows a piece and aborts leaves the File as it was.
    c.put_file("/g", b"small").await;
    let mut w = c.open_write("/g").await.unwrap();
    w.append(&pattern(4, 5000)).await.unwrap();
    w.abort().await.unwrap();
    assert!(in_piece(c, "/g").await);
    assert_eq!(read_all(c, "/g").await, b"small");

    // Cut to nothing, it keeps its piece; a write of several blocks from
    // its start outgrows it at once.
    let mut w = c.open_write("/g").await.unwrap();
    w.truncate(0).await.unwrap();
    let long = pattern(5, 2 * common::BS as usize + 3);
    w.append(&long).await.unwrap();
    w.close().await.unwrap();
    assert!(!in_piece(c, "/g").await);
    assert_eq!(read_all(c, "/g").await, long);
    common::assert_data_path(&t, c, shared_memory);
    t.cluster.shutdown();
}

/// Streams: a small File through a buffered writer takes a piece at its
/// close; one synced small and written on outgrows it; a hundred small
/// Files share one slab.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_small_files_share_slabs() {
    let t = common::start(8 * MIB, 0).await;
    let c = &t.client;
    c.create("/d", NodeType::Directory, CreateOptions::default())
        .await
        .unwrap();
    let before = used_blocks(c).await;
    for i in 0..100u64 {
        let n = c
            .create(
                &format!("/d/f{i}"),
                NodeType::File,
                CreateOptions::default(),
            )
            .await
            .unwrap();
        let mut w = BufferedWriter::new(n, StreamOptions::default()).unwrap();
        w.write_all(&pattern(i, 100)).await.unwrap();
        w.close().await.unwrap();
    }
    // One slab for the Files, one for each of the directory's record
    // pieces (at 64 KiB blocks: 100 records need three).
    let used = used_blocks(c).await - before;
    assert!(used <= 4, "100 small Files took {used} blocks");
    for i in (0..100u64).step_by(7) {
        let p = format!("/d/f{i}");
        assert!(in_piece(c, &p).await);
        assert_eq!(read_all(c, &p).await, pattern(i, 100));
    }

    let n = c
        .create("/s", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    let mut w = BufferedWriter::new(n, StreamOptions::default()).unwrap();
    let head = pattern(7, 50);
    w.write_all(&head).await.unwrap();
    w.sync().await.unwrap();
    assert!(in_piece(c, "/s").await);
    let tail = pattern(8, 3 * common::BS as usize + 17);
    w.write_all(&tail).await.unwrap();
    w.close().await.unwrap();
    let mut want = head;
    want.extend_from_slice(&tail);
    assert!(!in_piece(c, "/s").await);
    assert_eq!(read_all(c, "/s").await, want);
    t.cluster.shutdown();
}
