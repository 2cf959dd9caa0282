//! Error vocabulary shared by every NodeKernel component.
//!
//! Each variant has a stable numeric code that travels on the wire; the
//! Python and Java bindings map the same codes to their own exception types.
//! Codes are never renumbered: new codes are appended.

use thiserror::Error;

/// Result alias using the shared [`struct@Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Stable wire codes. `0` means success in a reply frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    NotFound = 1,
    AlreadyExists = 2,
    NotEmpty = 3,
    TypeMismatch = 4,
    InvalidPath = 5,
    Busy = 6,
    Stale = 7,
    NoSpace = 8,
    OutOfRange = 9,
    CrossPartition = 10,
    Unavailable = 11,
    DataLost = 12,
    Protocol = 13,
    Timeout = 14,
    InvalidArgument = 15,
    Internal = 16,
    LeaseExpired = 17,
    UnknownServer = 18,
    /// The request cannot be served right now but the same request may
    /// succeed shortly (a block is being moved, a claim is settling); retry
    /// after a short pause.
    TryAgain = 19,
    /// The path belongs to another metadata partition than the server
    /// asked (the client's list of metadata servers is in another order).
    WrongPartition = 20,
    /// The two ends of a connection speak different wire versions.
    VersionMismatch = 21,
    /// The peer could not prove it may do this: a connection without the
    /// cluster token or with a wrong one, a local peer running as a user
    /// the server does not accept, a data-plane request without a valid
    /// capability.
    Unauthenticated = 22,
    /// Encrypted data failed its authentication check: its stored bytes
    /// were changed (or moved, or written with another key). Never
    /// returned with bytes.
    Integrity = 23,
    /// A write or create would take a subtree past its quota of bytes or
    /// nodes (`nk quota`, `docs/lifecycle.md`); the message names the
    /// path whose quota it hit. Nothing changed.
    QuotaExceeded = 24,
}

impl ErrorCode {
    /// All codes, in numeric order (used by bindings and tests).
    pub const ALL: [ErrorCode; 24] = [
        ErrorCode::NotFound,
        ErrorCode::AlreadyExists,
        ErrorCode::NotEmpty,
        ErrorCode::TypeMismatch,
        ErrorCode::InvalidPath,
        ErrorCode::Busy,
        ErrorCode::Stale,
        ErrorCode::NoSpace,
        ErrorCode::OutOfRange,
        ErrorCode::CrossPartition,
        ErrorCode::Unavailable,
        ErrorCode::DataLost,
        ErrorCode::Protocol,
        ErrorCode::Timeout,
        ErrorCode::InvalidArgument,
        ErrorCode::Internal,
        ErrorCode::LeaseExpired,
        ErrorCode::UnknownServer,
        ErrorCode::TryAgain,
        ErrorCode::WrongPartition,
        ErrorCode::VersionMismatch,
        ErrorCode::Unauthenticated,
        ErrorCode::Integrity,
        ErrorCode::QuotaExceeded,
    ];

    pub fn from_u16(v: u16) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| *c as u16 == v)
    }

    /// The name used in messages and by the bindings (`"NotFound"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::NotFound => "NotFound",
            ErrorCode::AlreadyExists => "AlreadyExists",
            ErrorCode::NotEmpty => "NotEmpty",
            ErrorCode::TypeMismatch => "TypeMismatch",
            ErrorCode::InvalidPath => "InvalidPath",
            ErrorCode::Busy => "Busy",
            ErrorCode::Stale => "Stale",
            ErrorCode::NoSpace => "NoSpace",
            ErrorCode::OutOfRange => "OutOfRange",
            ErrorCode::CrossPartition => "CrossPartition",
            ErrorCode::Unavailable => "Unavailable",
            ErrorCode::DataLost => "DataLost",
            ErrorCode::Protocol => "Protocol",
            ErrorCode::Timeout => "Timeout",
            ErrorCode::InvalidArgument => "InvalidArgument",
            ErrorCode::Internal => "Internal",
            ErrorCode::LeaseExpired => "LeaseExpired",
            ErrorCode::UnknownServer => "UnknownServer",
            ErrorCode::TryAgain => "TryAgain",
            ErrorCode::WrongPartition => "WrongPartition",
            ErrorCode::VersionMismatch => "VersionMismatch",
            ErrorCode::Unauthenticated => "Unauthenticated",
            ErrorCode::Integrity => "Integrity",
            ErrorCode::QuotaExceeded => "QuotaExceeded",
        }
    }
}

/// A NodeKernel error: a stable code plus a human-readable message that names
/// the path or object and the rule that was broken.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{}: {message}", code.name())]
pub struct Error {
    pub code: ErrorCode,
    pub message: String,
}

macro_rules! ctor {
    ($($fn:ident => $code:ident),* $(,)?) => {
        impl Error {
            $(
                #[doc = concat!("A `", stringify!($code), "` error with the given message.")]
                pub fn $fn(message: impl Into<String>) -> Error {
                    Error { code: ErrorCode::$code, message: message.into() }
                }
            )*
        }
    };
}

ctor! {
    not_found => NotFound,
    already_exists => AlreadyExists,
    not_empty => NotEmpty,
    type_mismatch => TypeMismatch,
    invalid_path => InvalidPath,
    busy => Busy,
    stale => Stale,
    no_space => NoSpace,
    out_of_range => OutOfRange,
    cross_partition => CrossPartition,
    unavailable => Unavailable,
    data_lost => DataLost,
    protocol => Protocol,
    timeout => Timeout,
    invalid_argument => InvalidArgument,
    internal => Internal,
    lease_expired => LeaseExpired,
    unknown_server => UnknownServer,
    try_again => TryAgain,
    wrong_partition => WrongPartition,
    version_mismatch => VersionMismatch,
    unauthenticated => Unauthenticated,
    integrity => Integrity,
    quota_exceeded => QuotaExceeded,
}

impl Error {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
        }
    }

    /// Rebuilds an error from a reply frame's status and message bytes.
    /// Unknown codes (from a newer peer) become `Protocol`.
    pub fn from_wire(status: u16, message: &[u8]) -> Error {
        let text = String::from_utf8_lossy(message).into_owned();
        match ErrorCode::from_u16(status) {
            Some(code) => Error::new(code, text),
            None => Error::protocol(format!("unknown error code {status}: {text}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stable_and_round_trip() {
        for (i, c) in ErrorCode::ALL.iter().enumerate() {
            assert_eq!(*c as u16, i as u16 + 1, "codes are dense and ordered");
            assert_eq!(ErrorCode::from_u16(*c as u16), Some(*c));
        }
        assert_eq!(ErrorCode::from_u16(0), None);
        assert_eq!(ErrorCode::from_u16(999), None);
        let e = Error::from_wire(999, b"x");
        assert_eq!(e.code, ErrorCode::Protocol);
    }

    #[test]
    fn display_names_code_and_message() {
        let e = Error::not_found("/a/b does not exist");
        assert_eq!(e.to_string(), "NotFound: /a/b does not exist");
    }
}
