//! The server-wide budgets a request draws on before it is handled
//! ([`Budgets`]: requests in flight, bytes of request frames, bytes of
//! declared replies), what one connection holds of them or waits for
//! ([`Holds`]), and handing freed heap memory back after a burst.

use crate::limits::TRIM_AFTER;
use crate::server::options::ServeOptions;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};

/// What every connection of one server draws on, and how much memory
/// its connections hold.
pub(super) struct Budgets {
    /// Permits for requests being handled ([`ServeOptions::max_requests`]).
    pub(super) requests: Arc<Semaphore>,
    /// Bytes of larger request frames being received or handled
    /// ([`ServeOptions::max_request_bytes`]).
    pub(super) request_bytes: Budget,
    /// Bytes of declared replies being built or waiting to be sent
    /// ([`ServeOptions::max_reply_bytes`]).
    pub(super) reply_bytes: Budget,
    /// Capacity of every connection's receive buffer, summed.
    pub(super) recv_bytes: AtomicUsize,
    /// The largest value `recv_bytes` has had.
    pub(super) recv_bytes_peak: AtomicUsize,
    /// The most bytes [`Budgets::held`] since memory was last handed
    /// back to the system ([`TRIM_AFTER`]).
    held_peak: AtomicUsize,
}

impl Budgets {
    /// The budgets of a server with settings `opts` (bounded: see
    /// [`ServeOptions::bounded`]), nothing held.
    pub(super) fn new(opts: &ServeOptions) -> Budgets {
        Budgets {
            requests: Arc::new(Semaphore::new(opts.max_requests)),
            request_bytes: Budget::new(opts.max_request_bytes),
            reply_bytes: Budget::new(opts.max_reply_bytes),
            recv_bytes: AtomicUsize::new(0),
            recv_bytes_peak: AtomicUsize::new(0),
            held_peak: AtomicUsize::new(0),
        }
    }

    /// Bytes reserved for frames and replies, and of receive buffers.
    fn held(&self) -> usize {
        self.request_bytes.used()
            + self.reply_bytes.used()
            + self.recv_bytes.load(Ordering::Relaxed)
    }

    /// Notes what is held now in the peak since the last trim.
    fn note_held(&self) {
        self.held_peak.fetch_max(self.held(), Ordering::Relaxed);
    }

    /// Hands freed heap memory back to the system when what the server
    /// holds fell [`TRIM_AFTER`] below its peak since the last time.
    pub(super) fn trim_if_freed(&self) {
        let now = self.held();
        if self.held_peak.load(Ordering::Relaxed).saturating_sub(now) < TRIM_AFTER {
            return;
        }
        self.held_peak.store(now, Ordering::Relaxed);
        tokio::task::spawn_blocking(trim_heap);
    }
}

/// Hands the heap memory the allocator keeps free back to the system
/// (glibc's `malloc_trim`, which also releases free pages inside its
/// arenas); nothing with other C libraries. Blocking: run it off the
/// runtime's worker threads.
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only works on the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A server-wide budget of bytes, taken in reservations that give their
/// bytes back when dropped.
pub(super) struct Budget {
    sem: Arc<Semaphore>,
    limit: usize,
}

impl Budget {
    pub(super) fn new(limit: usize) -> Budget {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
        Budget {
            sem: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }

    /// A reservation of `n` bytes (at most the whole budget, so that any
    /// one request can be served), if they are free now.
    pub(super) fn try_take(&self, n: usize) -> Option<OwnedSemaphorePermit> {
        self.sem.clone().try_acquire_many_owned(self.clamp(n)).ok()
    }

    /// Waits for a reservation of `n` bytes, in turn with the others
    /// waiting.
    pub(super) fn take(&self, n: usize) -> PermitWait {
        Box::pin(self.sem.clone().acquire_many_owned(self.clamp(n)))
    }

    fn clamp(&self, n: usize) -> u32 {
        n.clamp(1, self.limit).min(u32::MAX as usize) as u32
    }

    /// Bytes reserved now.
    pub(super) fn used(&self) -> usize {
        self.limit.saturating_sub(self.sem.available_permits())
    }
}

pub(super) type PermitWait =
    Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// What a request holds while it is handled: a permit of the server's
/// request bound and its frame's bytes (given back once it was handled),
/// and its reply's bytes (given back once the reply was sent).
pub(super) struct Held {
    pub(super) request: OwnedSemaphorePermit,
    pub(super) frame: Option<OwnedSemaphorePermit>,
    pub(super) reply: Option<OwnedSemaphorePermit>,
}

/// One of the reservations a request needs before it is handled.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Hold {
    /// A permit of the server's request bound ([`ServeOptions::max_requests`]).
    Request,
    /// Its frame's bytes ([`ServeOptions::max_request_bytes`]).
    Frame,
    /// Its reply's bytes ([`ServeOptions::max_reply_bytes`]).
    Reply,
}

/// What the frame at the front of a connection holds, and the one wait
/// it may be in for more: kept across turns of the loop, so the
/// connection keeps its place in each queue.
#[derive(Default)]
pub(super) struct Holds {
    pub(super) request: Option<OwnedSemaphorePermit>,
    pub(super) frame: Option<OwnedSemaphorePermit>,
    pub(super) reply: Option<OwnedSemaphorePermit>,
    pub(super) wait: Option<(Hold, PermitWait)>,
}

impl Holds {
    fn slot(&mut self, which: Hold) -> &mut Option<OwnedSemaphorePermit> {
        match which {
            Hold::Request => &mut self.request,
            Hold::Frame => &mut self.frame,
            Hold::Reply => &mut self.reply,
        }
    }

    /// Whether `which` is held, taking it now if it is free; otherwise the
    /// connection waits for it (unless it waits for something else
    /// already).
    pub(super) fn get(&mut self, which: Hold, budgets: &Budgets, bytes: usize) -> bool {
        if self.slot(which).is_some() {
            return true;
        }
        if self.wait.is_some() {
            return false;
        }
        let now = match which {
            Hold::Request => budgets.requests.clone().try_acquire_owned().ok(),
            Hold::Frame => budgets.request_bytes.try_take(bytes),
            Hold::Reply => budgets.reply_bytes.try_take(bytes),
        };
        match now {
            Some(p) => {
                if which != Hold::Request {
                    budgets.note_held();
                }
                *self.slot(which) = Some(p);
                true
            }
            None => {
                let wait = match which {
                    Hold::Request => Box::pin(budgets.requests.clone().acquire_owned()),
                    Hold::Frame => budgets.request_bytes.take(bytes),
                    Hold::Reply => budgets.reply_bytes.take(bytes),
                };
                self.wait = Some((which, wait));
                false
            }
        }
    }

    /// A permit of the request bound for the next request, if one is free
    /// (otherwise the connection waits for one).
    pub(super) fn take_request(&mut self, budgets: &Budgets) -> Option<OwnedSemaphorePermit> {
        if self.get(Hold::Request, budgets, 1) {
            self.request.take()
        } else {
            None
        }
    }

    /// The wait ended with `p`.
    pub(super) fn got(&mut self, p: OwnedSemaphorePermit, budgets: &Budgets) {
        if let Some((which, _)) = self.wait.take() {
            if which != Hold::Request {
                budgets.note_held();
            }
            *self.slot(which) = Some(p);
        }
    }
}
