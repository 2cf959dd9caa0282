//! The journal through its files: records come back in order after a
//! reopen, a torn or garbled tail is cut and reported, damage that valid
//! records follow is refused naming the file, and group commit acknowledges
//! every concurrent writer.

use nodekernel_journal::{Fsync, Journal, JournalError, SEGMENT_HEADER};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

fn record(i: u64) -> Vec<u8> {
    // Lengths 0..40 so padding varies.
    (0..i % 41)
        .map(|b| (b as u8).wrapping_mul(31) ^ i as u8)
        .collect()
}

/// Records as replayed: (seq, payload).
type Records = Vec<(u64, Vec<u8>)>;

/// Opens `dir`, returning the journal and every record replayed.
fn open(dir: &Path, policy: Fsync) -> Result<(Journal, Records), JournalError> {
    let mut got = Vec::new();
    let (j, rec) = Journal::open(dir, policy, 0, 0, |seq, p| {
        got.push((seq, p.to_vec()));
        Ok(())
    })?;
    assert_eq!(rec.records, got.len() as u64);
    Ok((j, got))
}

fn write(dir: &Path, policy: Fsync, n: u64) -> PathBuf {
    let (j, _) = open(dir, policy).unwrap();
    let first = j.last() + 1;
    for i in first..first + n {
        assert_eq!(j.append(&record(i)).unwrap(), i);
    }
    j.sync().unwrap();
    only_segment(dir)
}

fn only_segment(dir: &Path) -> PathBuf {
    let mut segs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    assert_eq!(segs.len(), 1, "{segs:?}");
    segs.pop().unwrap()
}

fn expect(got: &[(u64, Vec<u8>)], n: u64) {
    assert_eq!(got.len() as u64, n);
    for (i, (seq, p)) in got.iter().enumerate() {
        assert_eq!(*seq, i as u64 + 1);
        assert_eq!(*p, record(*seq), "record {seq}");
    }
}

#[test]
fn records_come_back_in_order_and_numbering_continues() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), Fsync::Never, 100);
    write(dir.path(), Fsync::Always, 50);
    let (j, got) = open(dir.path(), Fsync::Never).unwrap();
    expect(&got, 150);
    assert_eq!(j.last(), 150);
}

#[test]
fn a_torn_write_is_cut_with_a_report_and_writing_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let seg = write(dir.path(), Fsync::Never, 20);
    let full = std::fs::metadata(&seg).unwrap().len();
    // The last record (20 bytes of payload, 4 of padding) loses its last
    // bytes (a write the crash tore).
    let last_len = 16 + 24;
    let torn = full - 5;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(torn)
        .unwrap();
    let mut got = Vec::new();
    let (j, rec) = Journal::open(dir.path(), Fsync::Never, 0, 0, |s, p| {
        got.push((s, p.to_vec()));
        Ok(())
    })
    .unwrap();
    expect(&got, 19);
    let cut = rec.cut.expect("the tear is reported");
    assert_eq!(cut.path, seg);
    assert_eq!(cut.offset, full - last_len);
    assert_eq!(cut.bytes, torn - (full - last_len));
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), full - last_len);
    // The log goes on from record 20, and reads back whole.
    assert_eq!(j.append(&record(20)).unwrap(), 20);
    drop(j);
    let (_, got) = open(dir.path(), Fsync::Never).unwrap();
    expect(&got, 20);
}

#[test]
fn a_tail_that_lost_only_padding_keeps_its_record_and_alignment() {
    let dir = tempfile::tempdir().unwrap();
    let seg = write(dir.path(), Fsync::Never, 20);
    let full = std::fs::metadata(&seg).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.set_len(full - 3).unwrap(); // record 20 ends 4 bytes before `full`
    drop(f);
    let (j, got) = open(dir.path(), Fsync::Never).unwrap();
    expect(&got, 20);
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), full);
    j.append(&record(21)).unwrap();
    drop(j);
    let (_, got) = open(dir.path(), Fsync::Never).unwrap();
    expect(&got, 21);
}

#[test]
fn a_zeroed_or_garbled_tail_is_cut() {
    for garbage in [
        vec![0u8; 4096],
        (0..777u32).map(|i| (i * 7) as u8).collect(),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let seg = write(dir.path(), Fsync::Never, 10);
        let full = std::fs::metadata(&seg).unwrap().len();
        let mut data = std::fs::read(&seg).unwrap();
        data.extend_from_slice(&garbage);
        std::fs::write(&seg, &data).unwrap();
        let (_, got) = open(dir.path(), Fsync::Never).unwrap();
        expect(&got, 10);
        assert_eq!(std::fs::metadata(&seg).unwrap().len(), full);
    }
}

#[test]
fn a_corrupted_last_record_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let seg = write(dir.path(), Fsync::Never, 10);
    let mut data = std::fs::read(&seg).unwrap();
    let n = data.len();
    data[n - 9] ^= 0xff; // inside record 10's payload
    std::fs::write(&seg, &data).unwrap();
    let (_, got) = open(dir.path(), Fsync::Never).unwrap();
    expect(&got, 9);
}

#[test]
fn damage_that_valid_records_follow_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let seg = write(dir.path(), Fsync::Never, 30);
    let mut data = std::fs::read(&seg).unwrap();
    // A flip in record 2's payload (record 1 takes 24 bytes; record 2's
    // payload starts 16 bytes into it).
    data[SEGMENT_HEADER + 24 + 16] ^= 1;
    std::fs::write(&seg, &data).unwrap();
    let err = open(dir.path(), Fsync::Never).err().expect("refused");
    let msg = err.to_string();
    assert!(matches!(err, JournalError::Corrupt { .. }), "{msg}");
    assert!(msg.contains(&seg.display().to_string()), "{msg}");
    assert!(msg.contains("valid records follow"), "{msg}");
    // Nothing was cut.
    assert_eq!(std::fs::read(&seg).unwrap(), data);
}

#[test]
fn a_bad_header_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let seg = write(dir.path(), Fsync::Never, 3);
    let mut data = std::fs::read(&seg).unwrap();
    data[0] = b'X';
    std::fs::write(&seg, &data).unwrap();
    let msg = open(dir.path(), Fsync::Never).err().unwrap().to_string();
    assert!(
        msg.contains("bad magic") && msg.contains("journal-"),
        "{msg}"
    );
}

#[test]
fn a_replay_callback_can_refuse_a_record() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), Fsync::Never, 5);
    let err = Journal::open(dir.path(), Fsync::Never, 0, 0, |seq, _| {
        if seq == 4 {
            Err("nonsense".into())
        } else {
            Ok(())
        }
    })
    .err()
    .unwrap();
    assert!(
        matches!(err, JournalError::Rejected { seq: 4, .. }),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_acknowledges_every_concurrent_writer() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = open(dir.path(), Fsync::Always).unwrap();
    let j = Arc::new(j);
    let order = Arc::new(std::sync::Mutex::new(()));
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let (j, order) = (j.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..50 {
                let seq = {
                    let _g = order.lock().unwrap();
                    let seq = j.last() + 1;
                    assert_eq!(j.append(&record(seq)).unwrap(), seq);
                    seq
                };
                j.durable(seq).await.unwrap();
            }
            t
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(j.last(), 400);
    drop(j);
    let (_, got) = open(dir.path(), Fsync::Never).unwrap();
    expect(&got, 400);
}

#[tokio::test]
async fn interval_and_never_acknowledge_once_written() {
    for policy in [Fsync::Never, Fsync::Interval(Duration::from_millis(5))] {
        let dir = tempfile::tempdir().unwrap();
        let (j, _) = open(dir.path(), policy).unwrap();
        let seq = j.append(&record(1)).unwrap();
        j.durable(seq).await.unwrap();
        // What a process crash keeps: the file as written, read by another
        // opener while this journal is still open.
        let data = std::fs::read(only_segment(dir.path())).unwrap();
        assert_eq!(data.len(), SEGMENT_HEADER + 16 + 8);
    }
}

#[test]
fn a_second_opener_is_refused_while_the_first_holds_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = open(dir.path(), Fsync::Never).unwrap();
    let err = open(dir.path(), Fsync::Never).err().unwrap();
    assert!(matches!(err, JournalError::Locked { .. }), "{err}");
    drop(j);
    open(dir.path(), Fsync::Never).unwrap();
}

#[test]
fn a_closed_log_takes_nothing_more_and_can_be_reopened_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = open(dir.path(), Fsync::Always).unwrap();
    j.append(&record(1)).unwrap();
    j.close().unwrap();
    assert!(matches!(j.append(&record(2)), Err(JournalError::Failed(_))));
    // The old handle is still alive, and the directory opens anyway.
    let (j2, got) = open(dir.path(), Fsync::Never).unwrap();
    expect(&got, 1);
    j2.append(&record(2)).unwrap();
    drop(j);
    drop(j2);
    let (_, got) = open(dir.path(), Fsync::Never).unwrap();
    expect(&got, 2);
}

fn segment_count(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "log")
        })
        .count()
}

#[test]
fn rotation_and_removal_keep_the_records_a_checkpoint_does_not_hold() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = open(dir.path(), Fsync::Always).unwrap();
    for i in 1..=10 {
        j.append(&record(i)).unwrap();
    }
    // A checkpoint of records 1..=10 is being written: the log goes on in
    // a new segment.
    assert_eq!(j.rotate().unwrap(), 11);
    assert_eq!(j.rotate().unwrap(), 11, "an empty segment is not rotated");
    for i in 11..=15 {
        j.append(&record(i)).unwrap();
    }
    assert_eq!(segment_count(dir.path()), 2);
    // A crash before the old segment went: it is read again, and the
    // records the checkpoint holds are skipped.
    drop(j);
    let mut got = Vec::new();
    let (j, _) = Journal::open(dir.path(), Fsync::Always, 10, 0, |seq, p| {
        got.push((seq, p.to_vec()));
        Ok(())
    })
    .unwrap();
    assert_eq!(got.first().map(|g| g.0), Some(11));
    assert_eq!(got.len(), 5);
    assert_eq!(j.remove_before(11).unwrap(), 1);
    assert_eq!(segment_count(dir.path()), 1);
    j.append(&record(16)).unwrap();
    drop(j);
    let mut got = Vec::new();
    Journal::open(dir.path(), Fsync::Never, 10, 0, |seq, p| {
        got.push((seq, p.to_vec()));
        Ok(())
    })
    .unwrap();
    assert_eq!(
        got.iter().map(|g| g.0).collect::<Vec<_>>(),
        (11..=16).collect::<Vec<_>>()
    );
    for (seq, p) in got {
        assert_eq!(p, record(seq));
    }
}

#[test]
fn a_log_that_does_not_follow_its_checkpoint_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), Fsync::Never, 5);
    // Records 6.. would be missing: the checkpoint says it holds up to 9.
    let err = Journal::open(dir.path(), Fsync::Never, 9, 0, |_, _| Ok(()))
        .err()
        .unwrap();
    assert!(err.to_string().contains("older state"), "{err}");
    // An empty log after a checkpoint starts right after it.
    let empty = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(empty.path(), Fsync::Never, 41, 0, |_, _| Ok(())).unwrap();
    assert_eq!(j.append(b"x").unwrap(), 42);
}

#[test]
fn records_of_older_segments_are_read_while_the_log_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = open(dir.path(), Fsync::Never).unwrap();
    for i in 1..=10 {
        j.append(&record(i)).unwrap();
    }
    j.rotate().unwrap();
    for i in 11..=20 {
        j.append(&record(i)).unwrap();
    }
    let upto = j.rotate().unwrap() - 1;
    j.append(&record(21)).unwrap();
    let mut got = Vec::new();
    let n = nodekernel_journal::read_records(dir.path(), 4, upto, |seq, p| {
        got.push((seq, p.to_vec()));
        Ok(())
    })
    .unwrap();
    assert_eq!(n, 16);
    assert_eq!(
        got.iter().map(|g| g.0).collect::<Vec<_>>(),
        (5..=20).collect::<Vec<_>>()
    );
    for (seq, p) in &got {
        assert_eq!(*p, record(*seq));
    }
    // Records the segments no longer hold are an error, not a silent gap.
    j.remove_before(11).unwrap();
    let err = nodekernel_journal::read_records(dir.path(), 4, upto, |_, _| Ok(()))
        .err()
        .unwrap();
    assert!(err.to_string().contains("missing"), "{err}");
}

#[test]
fn a_new_journal_directory_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("meta").join("journal");
    let (j, _) = open(&dir, Fsync::Never).unwrap();
    j.append(b"x").unwrap();
    for d in [dir.parent().unwrap(), dir.as_path()] {
        let mode = std::fs::metadata(d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{} is {mode:o}", d.display());
    }
}

/// A log that ends before a record it held on stable storage (the opener's
/// `floor`) lost records no crash tears. Each way its only segment can lose
/// them — cut to its header, emptied, cut inside its header, removed — is
/// refused, naming the file and the damage, and nothing is changed (no cut,
/// no new segment), so the next open sees the same.
#[test]
fn a_log_that_lost_durable_records_is_refused_and_left_as_it_is() {
    type Damage = fn(&Path);
    fn cut_to(seg: &Path, n: u64) {
        let f = std::fs::OpenOptions::new().write(true).open(seg).unwrap();
        f.set_len(n).unwrap();
    }
    let damages: [(&str, Damage, &str); 4] = [
        (
            "header only",
            |s| cut_to(s, SEGMENT_HEADER as u64),
            "holds only its header",
        ),
        ("empty", |s| cut_to(s, 0), "is empty"),
        ("10 bytes", |s| cut_to(s, 10), "is 10 bytes long"),
        (
            "removed",
            |s| std::fs::remove_file(s).unwrap(),
            "holds no segment",
        ),
    ];
    for (name, damage, says) in damages {
        let dir = tempfile::tempdir().unwrap();
        let (j, _) = open(dir.path(), Fsync::Always).unwrap();
        for i in 1..=10 {
            j.append(&record(i)).unwrap();
        }
        j.sync().unwrap();
        let floor = j.synced();
        assert_eq!(floor, 10);
        drop(j);
        let seg = only_segment(dir.path());
        damage(&seg);
        let before = std::fs::metadata(&seg).ok().map(|m| m.len());
        for _ in 0..2 {
            let err = Journal::open(dir.path(), Fsync::Never, 0, floor, |_, _| Ok(()))
                .err()
                .unwrap_or_else(|| panic!("{name}: opened"));
            let msg = err.to_string();
            match &err {
                JournalError::Lost {
                    path,
                    ends,
                    floor: f,
                    ..
                } => {
                    let want = if before.is_some() { &seg } else { dir.path() };
                    assert_eq!(path, want, "{name}: {msg}");
                    assert_eq!((*ends, *f), (0, 10), "{name}: {msg}");
                }
                e => panic!("{name}: {e}"),
            }
            assert!(
                msg.contains(says) && msg.contains("up to 10"),
                "{name}: {msg}"
            );
            assert_eq!(
                std::fs::metadata(&seg).ok().map(|m| m.len()),
                before,
                "{name}: changed"
            );
            assert_eq!(segment_count(dir.path()), usize::from(before.is_some()));
        }
    }
}

/// Past the floor, a torn tail is still a crash's tear and cut; a damaged
/// record at or below it is refused.
#[test]
fn a_torn_tail_past_the_floor_is_cut_and_one_below_it_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let seg = write(dir.path(), Fsync::Always, 20);
    let full = std::fs::metadata(&seg).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.set_len(full - 5).unwrap(); // record 20 torn
    drop(f);
    let err = Journal::open(dir.path(), Fsync::Never, 0, 20, |_, _| Ok(()))
        .err()
        .unwrap();
    assert!(err.to_string().contains("damaged record 20"), "{err}");
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), full - 5, "not cut");
    let mut got = Vec::new();
    let (j, rec) = Journal::open(dir.path(), Fsync::Never, 0, 19, |s, p| {
        got.push((s, p.to_vec()));
        Ok(())
    })
    .unwrap();
    expect(&got, 19);
    assert!(rec.cut.is_some());
    assert_eq!(j.append(&record(20)).unwrap(), 20);
}

/// Every file of the log is created 0600 even under umask 000, and one
/// found open to others is made 0600 at open. Run in a child process (the
/// test binary again), since the umask is the whole process's.
#[test]
fn log_files_are_private_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    if let Ok(dir) = std::env::var("NK_JOURNAL_UMASK_CHILD") {
        // SAFETY: umask only sets the process's file creation mask.
        unsafe { libc::umask(0) };
        let dir = Path::new(&dir);
        let (j, _) = open(dir, Fsync::Always).unwrap();
        j.append(b"one").unwrap();
        j.rotate().unwrap();
        j.append(b"two").unwrap();
        j.sync().unwrap();
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("journal");
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["log_files_are_private_whatever_the_umask", "--exact"])
        .env("NK_JOURNAL_UMASK_CHILD", &dir)
        .status()
        .unwrap();
    assert!(status.success());
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 3, "LOCK and two segments: {files:?}");
    for f in &files {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }
    // A segment someone opened to others is made private again.
    let seg = files
        .iter()
        .find(|f| f.ends_with("journal-00000000000000000001.log"))
        .expect("the first segment");
    std::fs::set_permissions(seg, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (_, got) = open(&dir, Fsync::Never).unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(mode(seg), 0o600);
}
