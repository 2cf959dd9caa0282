//! A write the file system refuses stops the journal: the failing append
//! and every later one are refused, a waiter gets the error, and nothing
//! more reaches the file. Its own test binary: the file size limit it sets
//! (`RLIMIT_FSIZE`, the way to make `write(2)` fail on demand) holds for
//! the whole process.

use nodekernel_journal::{Fsync, Journal, JournalError};

#[tokio::test]
async fn a_failed_write_stops_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), Fsync::Always, 0, 0, |_, _| Ok(())).unwrap();
    let seq = j.append(&[1u8; 100]).unwrap();
    j.durable(seq).await.unwrap();
    let seg = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "log"))
        .unwrap();
    let size = std::fs::metadata(&seg).unwrap().len();
    // SAFETY: plain libc calls; SIGXFSZ ignored so the write fails with
    // EFBIG instead of killing the process.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let lim = libc::rlimit {
            rlim_cur: size + 50,
            rlim_max: libc::RLIM_INFINITY,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
    }
    let err = j.append(&[2u8; 100]).unwrap_err();
    assert!(matches!(err, JournalError::Failed(_)), "{err}");
    assert!(err.to_string().contains("record 2"), "{err}");
    // Room again: still nothing is written.
    // SAFETY: as above.
    unsafe {
        let lim = libc::rlimit {
            rlim_cur: libc::RLIM_INFINITY,
            rlim_max: libc::RLIM_INFINITY,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
    }
    assert!(matches!(j.append(&[3u8; 10]), Err(JournalError::Failed(_))));
    assert!(j.check().is_err());
    assert!(j.durable(seq + 1).await.is_err(), "a waiter gets the error");
    let after = std::fs::metadata(&seg).unwrap().len();
    assert!(
        after <= size + 50,
        "{after} bytes: written after the failure"
    );
}
