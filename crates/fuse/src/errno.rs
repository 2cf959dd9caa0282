//! NodeKernel error codes as errno values.

use nodekernel_client::{Error, ErrorCode};

/// The errno a failed client call gives a program (`docs/fuse.md` has the
/// table). Faults of the cluster (a lost or unreachable storage server, a
/// timeout) are `EIO`, as a failing disk would be.
pub fn errno_of(e: &Error) -> i32 {
    match e.code {
        ErrorCode::NotFound => libc::ENOENT,
        ErrorCode::AlreadyExists => libc::EEXIST,
        ErrorCode::NotEmpty => libc::ENOTEMPTY,
        ErrorCode::TypeMismatch => libc::ENOTDIR,
        ErrorCode::InvalidPath => libc::EINVAL,
        ErrorCode::Busy => libc::EBUSY,
        ErrorCode::Stale => libc::ESTALE,
        ErrorCode::NoSpace => libc::ENOSPC,
        ErrorCode::OutOfRange => libc::EINVAL,
        ErrorCode::CrossPartition => libc::EXDEV,
        ErrorCode::InvalidArgument => libc::EINVAL,
        ErrorCode::TryAgain => libc::EAGAIN,
        ErrorCode::Unauthenticated => libc::EACCES,
        ErrorCode::QuotaExceeded => libc::EDQUOT,
        ErrorCode::Unavailable
        | ErrorCode::DataLost
        | ErrorCode::Timeout
        | ErrorCode::Protocol
        | ErrorCode::Internal
        | ErrorCode::LeaseExpired
        | ErrorCode::UnknownServer
        | ErrorCode::WrongPartition
        | ErrorCode::VersionMismatch
        // Encrypted data that failed authentication: a checksum failure,
        // which file systems report as EIO.
        | ErrorCode::Integrity => libc::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_an_errno_and_faults_are_eio() {
        for code in ErrorCode::ALL {
            let n = errno_of(&Error::new(code, "x"));
            assert!(n > 0, "{code:?}");
        }
        for code in [
            ErrorCode::DataLost,
            ErrorCode::Unavailable,
            ErrorCode::Timeout,
            ErrorCode::Integrity,
        ] {
            assert_eq!(errno_of(&Error::new(code, "x")), libc::EIO);
        }
        assert_eq!(
            errno_of(&Error::new(ErrorCode::CrossPartition, "x")),
            libc::EXDEV
        );
        assert_eq!(
            errno_of(&Error::new(ErrorCode::QuotaExceeded, "x")),
            libc::EDQUOT
        );
    }
}
