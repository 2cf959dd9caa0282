//! The log's floor: the last record of the operation log known to be on
//! stable storage, kept in `<dir>/log-floor` (`docs/persistence.md`,
//! *Damage*).
//!
//! A crash tears at most the records after the last sync; it never takes
//! records that were synced, nor a whole segment. So a log that ends before
//! its floor lost records by other means (a segment emptied, cut to its
//! header, removed, a disk restored from an older copy), and the server
//! refuses to start instead of serving what is left as if it were the
//! namespace ([`nodekernel_journal::JournalError::Lost`]). The file is
//! written at every start, once the restart's own record is synced (so
//! after the first start every directory has one: it says the directory
//! holds a namespace), and by the ticker as the synced log grows (at most
//! once per [`UPDATE_EVERY`]).
//!
//! Format: `NKFLOOR1`, the record (u64 little-endian), a CRC-32 of both
//! (u32). Always replaced whole (a temporary file, synced, renamed, the
//! directory synced); mode 0600, like every file of the directory.

use nodekernel_journal::FILE_MODE;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

/// The file's name in the server's directory.
pub const FILE: &str = "log-floor";
const TMP: &str = "log-floor.tmp";
const MAGIC: [u8; 8] = *b"NKFLOOR1";
const LEN: usize = 20;
/// The ticker writes a higher floor at most this often.
pub const UPDATE_EVERY: Duration = Duration::from_secs(1);

/// The floor kept in `dir`: 0 without a file (a new directory, or one
/// from a build before floors). A file that cannot be read or is damaged
/// still says that the directory held a namespace: 1, with a warning.
pub fn read(dir: &Path) -> u64 {
    let path = dir.join(FILE);
    // At most one byte more than a floor holds: whatever the file is.
    let mut bytes = Vec::with_capacity(LEN + 1);
    // Not blocking on a FIFO put there; only a regular file is read.
    let read = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)
        .and_then(|f| {
            if !f.metadata()?.is_file() {
                return Err(std::io::Error::other("not a regular file"));
            }
            f.take(LEN as u64 + 1).read_to_end(&mut bytes)
        });
    match read {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return 0,
        Err(e) => {
            tracing::warn!(
                "cannot read {} ({e}): the log must hold at least one record",
                path.display()
            );
            return 1;
        }
    }
    match decode(&bytes) {
        Some(floor) => floor,
        None => {
            tracing::warn!(
                "{} is damaged: the log must hold at least one record",
                path.display()
            );
            1
        }
    }
}

fn decode(b: &[u8]) -> Option<u64> {
    if b.len() != LEN || b[..8] != MAGIC {
        return None;
    }
    let crc = u32::from_le_bytes(b[16..20].try_into().ok()?);
    if crc32fast::hash(&b[..16]) != crc {
        return None;
    }
    Some(u64::from_le_bytes(b[8..16].try_into().ok()?))
}

/// Records durably that the log in `dir` holds every record up to `floor`
/// on stable storage.
pub fn write(dir: &Path, floor: u64) -> std::io::Result<()> {
    let mut b = Vec::with_capacity(LEN);
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&floor.to_le_bytes());
    b.extend_from_slice(&crc32fast::hash(&b).to_le_bytes());
    let tmp = dir.join(TMP);
    let mut f = create_private(&tmp)?;
    f.write_all(&b)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

/// Creates `path` afresh (removing what is there) with mode 0600
/// ([`FILE_MODE`], like every file of the directory), whatever the umask.
pub(crate) fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_floor_reads_back_and_damage_still_says_a_namespace_was_here() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), 0, "none yet");
        write(dir.path(), 1234).unwrap();
        assert_eq!(read(dir.path()), 1234);
        let path = dir.path().join(FILE);
        let good = std::fs::read(&path).unwrap();
        for i in 0..good.len() * 8 {
            let mut bad = good.clone();
            bad[i / 8] ^= 1 << (i % 8);
            assert_eq!(decode(&bad), None, "flip of bit {i} unseen");
            std::fs::write(&path, &bad).unwrap();
            assert_eq!(read(dir.path()), 1);
        }
        assert_eq!(decode(&good[..LEN - 1]), None);
        assert_eq!(decode(&[good.clone(), vec![0]].concat()), None);
        // A FIFO in its place is not waited on: it says a namespace was
        // here.
        std::fs::remove_file(&path).unwrap();
        let fifo = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads the NUL-terminated path only.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert_eq!(read(dir.path()), 1);
    }
}
