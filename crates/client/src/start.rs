//! The first minute: a client that meets a cluster while it starts waits
//! for it instead of failing (`docs/deployment.md`, *Start order and readiness*). Two
//! moments need it, both right after `nk up … &` or a restart:
//! - no metadata server answers yet (nothing listens on its port):
//!   [`crate::Client::connect`] asks again;
//! - a metadata server answers, but no storage server has registered with
//!   it yet, so a request that needs a block gets `Unavailable`: the
//!   request is sent again once one has (a refused request changed
//!   nothing: a decision applies fully or not at all).
//!
//! Either wait is bounded by the client timeout ([`crate::ClientConfig`]
//! `timeout`, `client.timeout_ms`) and by [`START_WAIT`], whichever is
//! shorter (a client with a long timeout, set to ride out a slow machine,
//! should not wait that long for a cluster that is gone), after which the
//! last error stands; once it has waited [`NOTICE_AFTER`], it says so in a
//! warning (the `nk` command prints it on stderr).

use std::time::{Duration, Instant};

/// The longest wait for a starting cluster: ample for `nk up` to listen
/// and register its storage servers.
pub(crate) const START_WAIT: Duration = Duration::from_secs(10);

/// How long a wait goes on quietly before it says so.
pub(crate) const NOTICE_AFTER: Duration = Duration::from_secs(1);

/// How often a waiting client asks again.
const POLL: Duration = Duration::from_millis(100);

/// One bounded wait for a starting cluster.
pub(crate) struct Starting<'a> {
    /// The addresses waited for, as the notice names them.
    cluster: &'a str,
    since: Instant,
    bound: Duration,
    told: bool,
}

impl<'a> Starting<'a> {
    /// A wait for `cluster` of at most `timeout` (the client's) and
    /// [`START_WAIT`].
    pub(crate) fn new(cluster: &'a str, timeout: Duration) -> Self {
        Starting {
            cluster,
            since: Instant::now(),
            bound: timeout.min(START_WAIT),
            told: false,
        }
    }

    /// Sleeps before the next try and returns `true`, or returns `false`
    /// once the bound is spent; tells why it waits (`why`) once it has
    /// waited a moment.
    pub(crate) async fn pause(&mut self, why: &(dyn std::fmt::Display + Sync)) -> bool {
        let waited = self.since.elapsed();
        if waited >= self.bound {
            return false;
        }
        if !self.told && waited >= NOTICE_AFTER {
            self.told = true;
            tracing::warn!(
                "waiting for the cluster at {} to start ({why}), at most {:?}...",
                self.cluster,
                self.bound
            );
        }
        tokio::time::sleep(POLL.min(self.bound - waited)).await;
        true
    }

    /// `e` with how long it was waited for, when it was.
    pub(crate) fn gave_up(&self, e: nodekernel_proto::Error) -> nodekernel_proto::Error {
        let waited = self.since.elapsed();
        if waited < POLL {
            return e;
        }
        nodekernel_proto::Error::new(
            e.code,
            format!(
                "{} (waited {:.1}s for the cluster to start)",
                e.message,
                waited.as_secs_f64()
            ),
        )
    }
}
