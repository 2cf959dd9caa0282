//! The server-wide budgets a request draws on before it is handled
//! ([`Budgets`]: requests in flight, bytes of request frames, bytes of
//! declared replies), what one connection holds of them or waits for
//! ([`Holds`]), and handing freed heap memory back after a burst.

use crate::limits::{HEAP_MMAP_THRESHOLD, HEAP_TRIM_THRESHOLD, TRIM_AFTER};
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
        tune_heap();
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

/// Keeps large buffers out of the heap arenas, once per process
/// ([`HEAP_MMAP_THRESHOLD`], [`HEAP_TRIM_THRESHOLD`]), unless the user
/// tuned the allocator through its environment; nothing with other C
/// libraries.
fn tune_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            let user_set = std::env::vars_os().any(|(k, v)| {
                let (k, v) = (k.to_string_lossy(), v.to_string_lossy());
                k.starts_with("MALLOC_") || (k == "GLIBC_TUNABLES" && v.contains("glibc.malloc."))
            });
            if user_set {
                return;
            }
            // SAFETY: mallopt only changes the allocator's thresholds; the
            // values fit a c_int.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD as libc::c_int);
                libc::mallopt(libc::M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD as libc::c_int);
            }
        });
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

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// Whether glibc mapped the allocation at `p` on its own (the
    /// `IS_MMAPPED` bit of the chunk's size word, just before it).
    fn mapped_on_its_own(p: *const u8) -> bool {
        // SAFETY: `p` is a live glibc allocation, whose chunk header (the
        // size word) is the machine word before it.
        unsafe { *(p as *const usize).sub(1) & 2 != 0 }
    }

    /// Without the tuning, freeing one 16 MiB buffer raised glibc's
    /// threshold past it, and the next came from an arena whose free top
    /// stayed with the process after it was freed.
    #[test]
    fn a_serving_process_maps_large_buffers_on_their_own_after_freeing_one() {
        if std::env::vars_os().any(|(k, _)| k.to_string_lossy().starts_with("MALLOC_")) {
            return; // the user's settings win
        }
        tune_heap();
        let big = HEAP_MMAP_THRESHOLD * 4;
        let first = vec![1u8; big];
        assert!(mapped_on_its_own(first.as_ptr()));
        drop(first);
        let second = std::thread::spawn(move || {
            let v = vec![2u8; big];
            mapped_on_its_own(v.as_ptr())
        });
        assert!(second.join().unwrap(), "the next one is mapped too");
        let small = vec![3u8; HEAP_MMAP_THRESHOLD / 4];
        assert!(
            !mapped_on_its_own(small.as_ptr()),
            "smaller ones reuse the arenas"
        );
    }
}
