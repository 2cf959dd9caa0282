//! Persistent storage servers: blocks kept across clean stops and crashes,
//! the keep-or-discard rule, damaged files, co-located clients of a
//! file-backed DRAM region, and the remembered address.

use super::*;
use crate::tests::map_region;
use crate::{DataDirConfig, MediumKind, StorageServer, StoreConfig};
use bytes::BytesMut;
use nodekernel_proto::ErrorCode;
use std::io::BufRead;
use std::time::Duration;

const BS: u32 = 64 << 10;
const BLOCKS: u32 = 6;
/// Generous bound that only catches hangs.
const HANG: Duration = Duration::from_secs(120);

fn file_medium() -> MediumKind {
    MediumKind::File {
        path: "blocks".into(),
    }
}

fn cfg(dir: &Path, medium: MediumKind, blocks: u32) -> StoreConfig {
    StoreConfig {
        class_name: medium.name().into(),
        medium,
        capacity: u64::from(blocks) * u64::from(BS),
        block_size: BS,
        data_dir: DataDirConfig::At(dir.to_path_buf()),
        persistent: true,
        location: "test-host".into(),
        rpc_timeout: HANG,
        ..StoreConfig::default()
    }
}

async fn start(c: &StoreConfig) -> StorageServer {
    tokio::time::timeout(HANG, StorageServer::start(c.clone()))
        .await
        .expect("start hangs")
        .expect("starts")
}

/// The bytes block `b` holds after [`fill`].
fn pattern(b: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(b * 7 + 1) as u8)
        .collect()
}

/// The generation [`fill`] gives block `b`.
fn gen_of(b: u32) -> u64 {
    1_000 + u64::from(b) * 10
}

/// Writes every block at its own generation (block 0 claimed twice, so
/// its generation rose after a first owner wrote it).
async fn fill(s: &StorageServer) {
    let store = s.store();
    store.write(0, 5, 0, b"first owner").await.unwrap();
    for b in 0..BLOCKS {
        store
            .write(b, gen_of(b), 0, &pattern(b, BS as usize))
            .await
            .unwrap();
    }
}

async fn read(s: &StorageServer, b: u32, gen: u64, len: u32) -> nodekernel_proto::Result<Vec<u8>> {
    let mut out = BytesMut::new();
    s.store().read(b, gen, 0, len, &mut out).await?;
    Ok(out.to_vec())
}

/// Every block holds what [`fill`] wrote, at its generation.
async fn check_filled(s: &StorageServer) {
    for b in 0..BLOCKS {
        assert_eq!(s.store().generation(b), Some(gen_of(b)), "block {b}");
        let got = read(s, b, gen_of(b), BS).await.unwrap();
        assert!(got == pattern(b, BS as usize), "block {b}: other bytes");
    }
}

/// Every block is empty: generation 0, zeros.
async fn check_empty(s: &StorageServer) {
    for b in 0..BLOCKS {
        assert_eq!(s.store().generation(b), Some(0), "block {b}");
        let got = read(s, b, 0, BS).await.unwrap();
        assert!(got.iter().all(|&x| x == 0), "block {b}: old bytes");
    }
}

fn state(dir: &Path) -> StoreState {
    StoreState::read(dir).unwrap().expect("a state file")
}

fn media() -> [MediumKind; 2] {
    [file_medium(), MediumKind::Dram]
}

#[test]
fn state_file_round_trip_and_every_damage_is_detected() {
    let s = StoreState {
        dram: true,
        clean: true,
        block_size: 1 << 20,
        num_blocks: 77,
        incarnation: 0x1234_5678_9abc_def0,
        boot_id: [7; 16],
    };
    let b = s.encode();
    assert_eq!(StoreState::decode(&b), Ok(s));
    for i in 0..STATE_LEN {
        for bit in 0..8 {
            let mut d = b;
            d[i] ^= 1 << bit;
            assert!(StoreState::decode(&d).is_err(), "byte {i} bit {bit}");
        }
    }
    assert!(StoreState::decode(&b[..63]).is_err());
    assert!(StoreState::decode(&[b.as_slice(), &[0]].concat()).is_err());
    assert!(StoreState::decode(&[]).is_err());
    // Random bytes never panic (and a valid CRC over nonsense is still
    // checked field by field).
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for n in 0..2000 {
        let mut g = [0u8; STATE_LEN];
        for v in g.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *v = x as u8;
        }
        if n % 2 == 0 {
            g[..8].copy_from_slice(&MAGIC);
            let crc = crc32(&g[..60]);
            g[60..].copy_from_slice(&crc.to_le_bytes());
        }
        let _ = StoreState::decode(&g);
    }
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926, "the IEEE check value");
    assert_eq!(
        parse_boot_id("0f6b3a52-1c9e-4d0b-a6a5-3b1f4e2d9c70"),
        Some([
            0x0f, 0x6b, 0x3a, 0x52, 0x1c, 0x9e, 0x4d, 0x0b, 0xa6, 0xa5, 0x3b, 0x1f, 0x4e, 0x2d,
            0x9c, 0x70
        ])
    );
    assert_eq!(parse_boot_id("nonsense"), None);
    assert!(boot_id().is_some(), "this machine has a boot id");
}

#[test]
fn the_rule_keeps_only_what_the_state_vouches_for() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let want = Settings {
        dram: false,
        block_size: BS,
        num_blocks: 8,
    };
    let (here, other) = ([1u8; 16], [2u8; 16]);
    assert_eq!(decide(dir, want, Some(here)), Err(Discarded::NoState));
    let base = StoreState {
        dram: false,
        clean: false,
        block_size: BS,
        num_blocks: 8,
        incarnation: 42,
        boot_id: here,
    };
    let with = |s: StoreState| {
        s.write(dir).unwrap();
        decide(dir, want, Some(here))
    };
    assert_eq!(with(base), Ok(42), "same boot, unclean: a process crash");
    assert_eq!(
        with(StoreState {
            boot_id: other,
            ..base
        }),
        Err(Discarded::UncleanMachineRestart)
    );
    assert_eq!(
        with(StoreState {
            boot_id: other,
            clean: true,
            ..base
        }),
        Ok(42),
        "another boot after a clean stop"
    );
    base.write(dir).unwrap();
    assert_eq!(
        decide(dir, want, None),
        Err(Discarded::UncleanMachineRestart),
        "an unknown boot id never counts as the same boot"
    );
    for changed in [
        StoreState { dram: true, ..base },
        StoreState {
            block_size: BS * 2,
            ..base
        },
        StoreState {
            num_blocks: 9,
            ..base
        },
    ] {
        assert!(
            matches!(with(changed), Err(Discarded::SettingsChanged(_))),
            "{changed:?}"
        );
    }
    std::fs::write(dir.join(STATE_FILE), b"garbage").unwrap();
    match decide(dir, want, Some(here)) {
        Err(Discarded::Damaged { path, .. }) => assert_eq!(path, dir.join(STATE_FILE)),
        other => panic!("{other:?}"),
    }
}

/// A clean stop and a restart keep every block and its generation, under
/// the same identity and incarnation; the generation rules hold across
/// the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_survive_a_clean_restart() {
    for medium in media() {
        let t = tempfile::tempdir().unwrap();
        let c = cfg(t.path(), medium.clone(), BLOCKS);
        let s = start(&c).await;
        assert_eq!(s.kept_blocks(), Some(Err(Discarded::NoState)), "{medium:?}");
        assert!(!state(t.path()).clean, "running: not clean");
        fill(&s).await;
        let (identity, incarnation) = (s.identity().to_string(), s.incarnation());
        s.shutdown();
        let st = state(t.path());
        assert!(st.clean, "{medium:?}: a clean stop says so");
        assert_eq!(st.incarnation, incarnation);
        if let MediumKind::File { .. } = medium {
            assert!(t.path().join("blocks").exists(), "the block file stays");
            assert!(t.path().join(GENS_FILE).exists());
        } else {
            assert!(t.path().join(DRAM_FILE).exists());
        }
        drop(s);

        let s = start(&c).await;
        assert_eq!(s.kept_blocks(), Some(Ok(())), "{medium:?}");
        assert_eq!(s.identity(), identity);
        assert_eq!(s.incarnation(), incarnation, "{medium:?}: same incarnation");
        assert!(!state(t.path()).clean, "running again: not clean");
        check_filled(&s).await;
        // Older generations are still refused, newer ones still claim.
        let e = read(&s, 0, 5, 4).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Stale, "{e}");
        let e = s.store().write(0, 5, 0, b"late").await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Stale, "{e}");
        s.store()
            .write(1, gen_of(1) + 1, 0, b"new owner")
            .await
            .unwrap();
        assert_eq!(s.store().generation(1), Some(gen_of(1) + 1));
        let e = read(&s, 1, gen_of(1), 4).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Stale, "{e}");
        drop(s);

        // The claim made after the restart is kept too.
        let s = start(&c).await;
        assert_eq!(s.kept_blocks(), Some(Ok(())));
        assert_eq!(s.incarnation(), incarnation);
        assert_eq!(s.store().generation(1), Some(gen_of(1) + 1));
        assert_eq!(read(&s, 1, gen_of(1) + 1, 9).await.unwrap(), b"new owner");
        assert_eq!(s.store().generation(2), Some(gen_of(2)));
    }
}

/// Run by [`a_killed_server_keeps_its_blocks_on_the_same_boot`] in a child
/// process (the test binary again): starts a persistent server in
/// `NK_PERSIST_CHILD_DIR`, fills it, says `ready` and waits to be killed.
#[test]
fn child_store() {
    let Ok(dir) = std::env::var("NK_PERSIST_CHILD_DIR") else {
        return;
    };
    let medium = match std::env::var("NK_PERSIST_CHILD_MEDIUM").as_deref() {
        Ok("dram") => MediumKind::Dram,
        _ => file_medium(),
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let s = start(&cfg(Path::new(&dir), medium, BLOCKS)).await;
        fill(&s).await;
        // A claim left half done by the killed process: a write of a newer
        // generation whose data never came (a pure claim).
        s.store().write(3, gen_of(3) + 5, 0, &[]).await.unwrap();
        println!("ready {:016x}", s.incarnation());
        tokio::time::sleep(HANG * 10).await;
        drop(s);
    });
}

/// A server killed with SIGKILL (no clean stop) comes back, on the same
/// boot, with every block and generation, under its incarnation: the
/// page cache held every write and claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_keeps_its_blocks_on_the_same_boot() {
    for (name, medium) in [("file", file_medium()), ("dram", MediumKind::Dram)] {
        let t = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["persist::tests::child_store", "--exact", "--nocapture"])
            .env("NK_PERSIST_CHILD_DIR", t.path())
            .env("NK_PERSIST_CHILD_MEDIUM", name)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let incarnation = tokio::time::timeout(
            HANG,
            tokio::task::spawn_blocking(move || {
                for line in std::io::BufReader::new(stdout).lines() {
                    let line = line.unwrap();
                    if let Some(hex) = line.strip_prefix("ready ") {
                        return u64::from_str_radix(hex.trim(), 16).unwrap();
                    }
                }
                panic!("the child ended without filling its store");
            }),
        )
        .await
        .expect("child hangs")
        .unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!state(t.path()).clean, "killed: no clean stop");

        let s = start(&cfg(t.path(), medium, BLOCKS)).await;
        assert_eq!(s.kept_blocks(), Some(Ok(())), "{name}");
        assert_eq!(s.incarnation(), incarnation, "{name}");
        for b in (0..BLOCKS).filter(|&b| b != 3) {
            assert_eq!(s.store().generation(b), Some(gen_of(b)), "{name} block {b}");
            let got = read(&s, b, gen_of(b), BS).await.unwrap();
            assert!(got == pattern(b, BS as usize), "{name} block {b}");
        }
        // The claim is kept (and settled): the old owner is refused, the
        // new one writes.
        assert_eq!(s.store().generation(3), Some(gen_of(3) + 5), "{name}");
        let e = read(&s, 3, gen_of(3), 4).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Stale, "{e}");
        tokio::time::timeout(HANG, s.store().write(3, gen_of(3) + 5, 0, b"mine"))
            .await
            .expect("a kept claim does not hang")
            .unwrap();
        assert_eq!(read(&s, 3, gen_of(3) + 5, 4).await.unwrap(), b"mine");
    }
}

/// Another boot id: kept only after a clean stop; otherwise discarded
/// with a new incarnation, every generation 0 and every byte zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_restart_keeps_blocks_only_after_a_clean_stop() {
    for medium in media() {
        let t = tempfile::tempdir().unwrap();
        let c = cfg(t.path(), medium.clone(), BLOCKS);
        let s = start(&c).await;
        fill(&s).await;
        let incarnation = s.incarnation();
        drop(s);
        let elsewhere = |clean: bool| {
            let st = state(t.path());
            StoreState {
                boot_id: [0xAB; 16],
                clean,
                ..st
            }
            .write(t.path())
            .unwrap();
        };

        elsewhere(true);
        let s = start(&c).await;
        assert_eq!(s.kept_blocks(), Some(Ok(())), "{medium:?}: clean stop");
        assert_eq!(s.incarnation(), incarnation);
        check_filled(&s).await;
        drop(s);

        elsewhere(false);
        let s = start(&c).await;
        assert_eq!(
            s.kept_blocks(),
            Some(Err(Discarded::UncleanMachineRestart)),
            "{medium:?}"
        );
        assert_ne!(s.incarnation(), incarnation, "a new incarnation");
        assert_eq!(state(t.path()).incarnation, s.incarnation());
        check_empty(&s).await;
        let e = read(&s, 2, gen_of(2), 4).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Stale, "an old location: {e}");
    }
}

/// Changed capacity, block size or medium: discarded, saying what changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_settings_discard_the_blocks() {
    let t = tempfile::tempdir().unwrap();
    let c = cfg(t.path(), file_medium(), BLOCKS);
    let s = start(&c).await;
    fill(&s).await;
    drop(s);
    let grown = cfg(t.path(), file_medium(), BLOCKS + 2);
    let s = start(&grown).await;
    match s.kept_blocks() {
        Some(Err(Discarded::SettingsChanged(why))) => {
            assert!(why.contains(&format!("{BLOCKS} blocks")), "{why}")
        }
        other => panic!("{other:?}"),
    }
    drop(s);
    // Back to the old capacity: those blocks are gone for good.
    let s = start(&c).await;
    assert!(matches!(
        s.kept_blocks(),
        Some(Err(Discarded::SettingsChanged(_)))
    ));
    check_empty(&s).await;
    fill(&s).await;
    drop(s);
    let mut bigger_blocks = cfg(t.path(), file_medium(), BLOCKS / 2);
    bigger_blocks.block_size = BS * 2;
    let s = start(&bigger_blocks).await;
    assert!(
        matches!(s.kept_blocks(), Some(Err(Discarded::SettingsChanged(_)))),
        "{:?}",
        s.kept_blocks()
    );
    drop(s);
    let s = start(&cfg(t.path(), MediumKind::Dram, BLOCKS)).await;
    match s.kept_blocks() {
        Some(Err(Discarded::SettingsChanged(why))) => assert!(why.contains("dram"), "{why}"),
        other => panic!("{other:?}"),
    }
    check_empty(&s).await;
}

/// A damaged state file (garbage, empty, a flipped bit) never panics and
/// never refuses to start: the blocks are discarded, naming the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_state_file_discards_naming_it() {
    let t = tempfile::tempdir().unwrap();
    let c = cfg(t.path(), file_medium(), BLOCKS);
    drop(start(&c).await);
    let good = std::fs::read(t.path().join(STATE_FILE)).unwrap();
    let mut flipped = good.clone();
    flipped[20] ^= 1;
    for garbage in [
        b"this is not a state file".to_vec(),
        Vec::new(),
        vec![0xFF; 4096],
        flipped,
        good[..40].to_vec(),
    ] {
        let s = start(&c).await;
        fill(&s).await;
        drop(s);
        std::fs::write(t.path().join(STATE_FILE), &garbage).unwrap();
        let s = start(&c).await;
        match s.kept_blocks() {
            Some(Err(why @ Discarded::Damaged { .. })) => {
                assert!(why.to_string().contains(STATE_FILE), "{why}")
            }
            other => panic!("{garbage:?}: {other:?}"),
        }
        check_empty(&s).await;
    }
}

/// Missing or damaged medium files: discarded and re-created (a DRAM file
/// with a bad header is initialised afresh).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_medium_files_are_reinitialised() {
    let t = tempfile::tempdir().unwrap();
    let c = cfg(t.path(), MediumKind::Dram, BLOCKS);
    let s = start(&c).await;
    fill(&s).await;
    drop(s);
    // A header of another layout version.
    let dram = t.path().join(DRAM_FILE);
    let f = std::fs::OpenOptions::new().write(true).open(&dram).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &99u32.to_le_bytes(), 8).unwrap();
    drop(f);
    let s = start(&c).await;
    match s.kept_blocks() {
        Some(Err(Discarded::MediumFiles(why))) => {
            assert!(why.contains("header") && why.contains(DRAM_FILE), "{why}")
        }
        other => panic!("{other:?}"),
    }
    check_empty(&s).await;
    fill(&s).await;
    drop(s);
    let s = start(&c).await;
    assert_eq!(s.kept_blocks(), Some(Ok(())), "the new file is kept");
    check_filled(&s).await;
    drop(s);
    std::fs::remove_file(&dram).unwrap();
    let s = start(&c).await;
    assert!(matches!(
        s.kept_blocks(),
        Some(Err(Discarded::MediumFiles(_)))
    ));
    check_empty(&s).await;
    drop(s);

    // File medium: a missing generation file, or a block file of another
    // size.
    let t = tempfile::tempdir().unwrap();
    let c = cfg(t.path(), file_medium(), BLOCKS);
    let s = start(&c).await;
    fill(&s).await;
    drop(s);
    std::fs::remove_file(t.path().join(GENS_FILE)).unwrap();
    let s = start(&c).await;
    match s.kept_blocks() {
        Some(Err(Discarded::MediumFiles(why))) => assert!(why.contains(GENS_FILE), "{why}"),
        other => panic!("{other:?}"),
    }
    check_empty(&s).await;
    fill(&s).await;
    drop(s);
    let blocks = t.path().join("blocks");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&blocks)
        .unwrap();
    f.set_len(4096).unwrap();
    drop(f);
    let s = start(&c).await;
    assert!(matches!(
        s.kept_blocks(),
        Some(Err(Discarded::MediumFiles(_)))
    ));
    check_empty(&s).await;
}

async fn map(s: &StorageServer) -> (nodekernel_shm::ClientRegion, std::os::unix::net::UnixStream) {
    let name = s.shared_memory_name().expect("shared").to_string();
    tokio::task::spawn_blocking(move || map_region(&name))
        .await
        .unwrap()
        .expect("a co-located client maps a file-backed region")
}

/// A co-located client maps a persistent server's file-backed region and
/// reads and writes through it; what it wrote is kept across the
/// server's restart, and the restarted server is mapped afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn colocated_clients_map_a_persistent_dram_region() {
    let t = tempfile::tempdir().unwrap();
    let c = cfg(t.path(), MediumKind::Dram, BLOCKS);
    let s = start(&c).await;
    fill(&s).await;
    let (region, sock) = map(&s).await;
    let mut buf = vec![0u8; BS as usize];
    region.read(2, gen_of(2), 0, &mut buf).unwrap();
    assert!(buf == pattern(2, BS as usize), "the server's bytes, mapped");
    region
        .write(4, gen_of(4) + 1, 0, b"from the client")
        .await
        .unwrap();
    assert_eq!(s.store().generation(4), Some(gen_of(4) + 1));
    assert_eq!(
        read(&s, 4, gen_of(4) + 1, 15).await.unwrap(),
        b"from the client"
    );
    s.shutdown();
    assert!(region.is_closed(), "the client sees the stop");
    drop(region);
    drop(sock);
    assert!(state(t.path()).clean);
    drop(s);

    let s = start(&c).await;
    assert_eq!(s.kept_blocks(), Some(Ok(())));
    let (region, _sock) = map(&s).await;
    assert!(!region.is_closed(), "serving again");
    let mut got = [0u8; 15];
    region.read(4, gen_of(4) + 1, 0, &mut got).unwrap();
    assert_eq!(&got, b"from the client", "the client's write was kept");
    let e = region.read(4, gen_of(4), 0, &mut got).unwrap_err();
    assert_eq!(e.code, ErrorCode::Stale);
    region.write(5, gen_of(5) + 1, 0, b"again").await.unwrap();
    assert_eq!(read(&s, 5, gen_of(5) + 1, 5).await.unwrap(), b"again");
}

/// A persistent server on port 0 comes back on its old address when that
/// is free, and on a new port when it is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_address_is_taken_again_when_free() {
    let t = tempfile::tempdir().unwrap();
    let c = cfg(t.path(), file_medium(), BLOCKS);
    let s = start(&c).await;
    let addr = s.local_addr();
    drop(s);
    assert_eq!(read_address(t.path()), Some(addr));
    let s = start(&c).await;
    assert_eq!(s.local_addr(), addr, "the old address");
    assert_eq!(s.advertised_addr(), addr.to_string());
    drop(s);
    let squatter = std::net::TcpListener::bind(addr).unwrap();
    let s = start(&c).await;
    assert_ne!(s.local_addr(), addr, "a new port");
    assert_eq!(read_address(t.path()), Some(s.local_addr()));
    drop(squatter);
    // A volatile server remembers nothing.
    drop(s);
    let t = tempfile::tempdir().unwrap();
    let volatile = StoreConfig {
        persistent: false,
        ..cfg(t.path(), file_medium(), BLOCKS)
    };
    let s = start(&volatile).await;
    assert_eq!(s.kept_blocks(), None);
    drop(s);
    assert_eq!(read_address(t.path()), None);
    assert!(!t.path().join(STATE_FILE).exists());
    assert!(
        !t.path().join("blocks").exists(),
        "a volatile stop removes it"
    );
}

/// A failed start of a persistent server removes only what it created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_first_start_leaves_nothing() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    let mut c = cfg(&dir, MediumKind::Dram, BLOCKS);
    c.listen = "256.0.0.1:0".into();
    StorageServer::start(c).await.expect_err("cannot bind");
    assert!(
        !dir.exists(),
        "nothing left: {:?}",
        std::fs::read_dir(&dir).ok().map(|d| d.count())
    );
}

/// A volatile server in between (same directory) voids the state file, so
/// a later persistent start cannot take what the volatile one wrote for
/// the kept blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volatile_run_in_between_voids_the_kept_blocks() {
    let t = tempfile::tempdir().unwrap();
    let c = cfg(t.path(), file_medium(), BLOCKS);
    let s = start(&c).await;
    fill(&s).await;
    drop(s);
    let volatile = StoreConfig {
        persistent: false,
        ..c.clone()
    };
    let s = start(&volatile).await;
    assert!(!t.path().join(STATE_FILE).exists(), "voided at start");
    drop(s);
    let s = start(&c).await;
    assert_eq!(s.kept_blocks(), Some(Err(Discarded::NoState)));
    check_empty(&s).await;
}

/// A stopped file server refuses writes and lets go of its block file at
/// once, even while something still holds its store (as a connection task
/// of the stopped server may for a moment): the next server takes the
/// file straight away, with the old server's blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_lets_go_of_its_block_file_at_once() {
    let t = tempfile::tempdir().unwrap();
    let c = cfg(t.path(), file_medium(), BLOCKS);
    let s = start(&c).await;
    fill(&s).await;
    let old_store = s.store().clone();
    s.shutdown();
    let e = old_store.write(2, gen_of(2), 0, b"late").await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable, "{e}");
    let e = old_store.write(2, gen_of(2) + 1, 0, &[]).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable, "no claim either: {e}");
    let next = start(&c).await;
    assert_eq!(next.kept_blocks(), Some(Ok(())));
    check_filled(&next).await;
    drop(old_store);
    drop(s);
}
