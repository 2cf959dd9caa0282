//! Random bytes from the kernel, for nonces, keys and names.

use std::fs::File;
use std::io::{self, Read};

/// Fills `buf` from the kernel's random number generator.
pub fn random_bytes(buf: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: the pointer and length describe `rest`, a live, writable
        // slice; getrandom writes at most that many bytes into it.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                // Kernels before 3.17 have no getrandom.
                Some(libc::ENOSYS) => {
                    return File::open("/dev/urandom")?.read_exact(rest);
                }
                _ => return Err(e),
            }
        }
        filled += n as usize;
    }
    Ok(())
}
