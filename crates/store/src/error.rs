//! Errors of starting and running a storage server.

use std::path::PathBuf;

/// Why a storage server could not start (or a medium could not be set up).
///
/// Request-level failures (stale generations, out-of-range accesses) are not
/// `StoreError`s: they travel to clients as [`nodekernel_proto::Error`]s.
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
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        /// What was being done (`"create"`, `"preallocate"`, ...).
        op: &'static str,
        /// The file, or `memfd:nodekernel-dram` for the DRAM medium.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The data port could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// A metadata server refused the registration or could not be reached.
    #[error("registration with metadata server {meta} failed: {source}")]
    Register {
        /// Address of the metadata server.
        meta: String,
        #[source]
        source: nodekernel_proto::Error,
    },
    /// The transport could not start serving.
    #[error("cannot start the storage rpc server: {0}")]
    Rpc(#[source] nodekernel_proto::Error),
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
        source: std::io::Error,
    ) -> StoreError {
        StoreError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

impl From<StoreError> for nodekernel_proto::Error {
    fn from(e: StoreError) -> nodekernel_proto::Error {
        use nodekernel_proto::Error;
        let message = e.to_string();
        match e {
            StoreError::Config { .. } => Error::invalid_argument(message),
            StoreError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => {
                Error::no_space(message)
            }
            StoreError::Io { .. } => Error::internal(message),
            StoreError::Listen { .. } => Error::unavailable(message),
            // Keep the metadata server's code (e.g. InvalidArgument for a
            // block-size mismatch, Unavailable when unreachable).
            StoreError::Register { source, .. } => Error::new(source.code, message),
            StoreError::Rpc(source) => Error::new(source.code, message),
        }
    }
}
