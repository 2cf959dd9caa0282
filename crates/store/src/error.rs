//! Errors of starting and running a storage server.

use std::path::PathBuf;

/// Why a storage server could not start (or a medium could not be set up).
///
/// Request-level failures (stale generations, out-of-range accesses) are not
/// `StoreError`s: they travel to clients as [`nodekernel_proto::Error`]s.
///
/// Each message is complete on its own, the underlying OS or protocol error
/// included, so the underlying errors are deliberately not exposed as
/// [`source`](std::error::Error::source)s: printing the chain (as `anyhow`'s
/// `{:#}` does) would repeat them.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A [`StoreConfig`](crate::StoreConfig) field has an unusable value.
    #[error("invalid storage server config: `{field}` {reason}")]
    Config {
        /// The offending field, named as in `StoreConfig`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A system call on the medium (or its backing file) failed.
    #[error("cannot {op} {}: {error}", path.display())]
    Io {
        /// What was being done (`"create"`, `"preallocate"`, ...).
        op: &'static str,
        /// The file, or `memfd:nodekernel-dram` for the DRAM medium.
        path: PathBuf,
        error: std::io::Error,
    },
    /// A data directory or block file is locked by another server (see
    /// [`datadir`](crate::datadir)).
    #[error(
        "{what} {} is in use by {}; {hint}",
        .path.display(),
        holder_text(.holder)
    )]
    Locked {
        /// `"data directory"` or `"block file"`.
        what: &'static str,
        path: PathBuf,
        /// The pid holding the lock, where it could be found out.
        holder: Option<u32>,
        /// What to do about it.
        hint: &'static str,
    },
    /// A data directory's identity file is unreadable as an identity.
    #[error("bad identity file {}: {reason}; restore it, or remove it to give the server a new identity", path.display())]
    Identity { path: PathBuf, reason: String },
    /// A directory that private data would be kept under is not private.
    #[error("refusing to keep private data under {}: {reason}", path.display())]
    Unsafe { path: PathBuf, reason: String },
    /// The data port could not be bound.
    #[error("cannot listen on {addr}: {error}")]
    Listen { addr: String, error: std::io::Error },
    /// The admin HTTP endpoint could not be bound.
    #[error(transparent)]
    Admin(nodekernel_admin::AdminError),
    /// A metadata server refused the registration or could not be reached.
    #[error("registration with metadata server {meta} failed: {error}")]
    Register {
        /// Address of the metadata server.
        meta: String,
        error: nodekernel_proto::Error,
    },
    /// The transport could not start serving.
    #[error("cannot start the storage rpc server: {0}")]
    Rpc(nodekernel_proto::Error),
}

impl StoreError {
    pub(crate) fn config(field: &'static str, reason: impl Into<String>) -> StoreError {
        StoreError::Config {
            field,
            reason: reason.into(),
        }
    }

    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
        error: std::io::Error,
    ) -> StoreError {
        StoreError::Io {
            op,
            path: path.into(),
            error,
        }
    }
}

impl From<StoreError> for nodekernel_proto::Error {
    fn from(e: StoreError) -> nodekernel_proto::Error {
        use nodekernel_proto::{Error, ErrorCode};
        let message = e.to_string();
        match e {
            StoreError::Config { .. } => Error::invalid_argument(message),
            StoreError::Io { error, .. } if error.raw_os_error() == Some(libc::ENOSPC) => {
                Error::no_space(message)
            }
            StoreError::Io { .. } | StoreError::Identity { .. } | StoreError::Unsafe { .. } => {
                Error::internal(message)
            }
            StoreError::Locked { .. } => Error::new(ErrorCode::Busy, message),
            StoreError::Listen { .. } | StoreError::Admin(_) => Error::unavailable(message),
            // Keep the metadata server's code (e.g. InvalidArgument for a
            // block-size mismatch, Unavailable when unreachable).
            StoreError::Register { error, .. } => Error::new(error.code, message),
            StoreError::Rpc(error) => Error::new(error.code, message),
        }
    }
}

/// Whom a lock is held by, for [`StoreError::Locked`].
fn holder_text(holder: &Option<u32>) -> String {
    match *holder {
        Some(pid) if pid == std::process::id() => {
            format!("another storage server of this process (pid {pid})")
        }
        Some(pid) => format!("another NodeKernel process (pid {pid})"),
        None => "another process".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    /// Each cause appears once when the whole chain is printed.
    #[test]
    fn messages_are_complete_and_have_no_repeated_source() {
        let e = StoreError::io(
            "create",
            "/x/blocks",
            std::io::Error::from_raw_os_error(libc::EACCES),
        );
        let text = e.to_string();
        assert!(
            text.contains("/x/blocks") && text.contains("os error 13"),
            "{text}"
        );
        assert!(e.source().is_none(), "{text}");
        let e = StoreError::Listen {
            addr: "127.0.0.1:1".into(),
            error: std::io::Error::from_raw_os_error(libc::EADDRINUSE),
        };
        assert!(e.source().is_none());
        let e = StoreError::Register {
            meta: "m:1".into(),
            error: nodekernel_proto::Error::unavailable("down"),
        };
        assert!(e.to_string().contains("down") && e.source().is_none());
    }
}
