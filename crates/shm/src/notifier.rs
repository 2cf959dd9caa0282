//! Waking this process's async waits when the shared wake sequence moves
//! ([`Notifier`]): the futex, which only blocking threads can sleep on,
//! bridged to tasks, which must never block (see [`crate::protocol`]'s
//! *Waiting*).

use memmap2::MmapRaw;
use nodekernel_proto::sync;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// `FUTEX_WAIT` on the shared (not process-private) futex `word`: sleeps
/// while it holds `seq`, until a `FUTEX_WAKE` on it from any process (or
/// a signal: callers check again anyway). Returns at once if it differs.
pub(crate) fn futex_wait(word: &AtomicU32, seq: u32) {
    // SAFETY: `word` is a live, aligned u32 (in the shared mapping); the
    // kernel only reads it. No timeout, no second address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seq,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

/// Wakes every thread of any process sleeping in [`futex_wait`] on `word`.
pub(crate) fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: as in `futex_wait`; FUTEX_WAKE does not even read the word.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Turns moves of the shared wake sequence into wake-ups of this process's
/// async waits: the bridge between the futex, which only blocking threads
/// can sleep on, and tasks, which must never block.
///
/// A task that must wait registers its waker with the sequence value it
/// loaded before its last try ([`Notifier::changed`]). One thread per
/// mapping, started at the first wait, sleeps in `FUTEX_WAIT` while every
/// registered waiter's value is still current, and wakes the waiters whose
/// value is not. Since a waiter's value was loaded before the thread's,
/// and the thread sleeps only while the word still holds its own value, no
/// move of the sequence is missed.
pub(crate) struct Notifier {
    shared: Arc<NotifierShared>,
}

struct NotifierShared {
    /// Keeps the futex word mapped while the thread runs.
    map: Arc<MmapRaw>,
    /// Offset of the wake sequence in `map`.
    at: u64,
    sleepers: Mutex<Sleepers>,
    /// Signalled when a waiter registers, or to stop.
    registered: Condvar,
}

#[derive(Default)]
struct Sleepers {
    /// Registered waits: id, the sequence value they wait to move from,
    /// their waker.
    list: Vec<(u64, u32, Waker)>,
    next_id: u64,
    started: bool,
    stop: bool,
}

impl Notifier {
    pub(crate) fn new(map: Arc<MmapRaw>, at: u64) -> Notifier {
        Notifier {
            shared: Arc::new(NotifierShared {
                map,
                at,
                sleepers: Mutex::default(),
                registered: Condvar::new(),
            }),
        }
    }

    pub(crate) fn word(&self) -> &AtomicU32 {
        self.shared.word()
    }

    /// Ready once the wake sequence differs from `seq`.
    pub(crate) fn changed(&self, seq: u32) -> Changed<'_> {
        Changed {
            notifier: self,
            seq,
            id: None,
        }
    }

    /// Stops the thread, if any (the region is being dropped, so nothing
    /// waits any more).
    pub(crate) fn stop(&self) {
        let started = {
            let mut s = self.shared.lock();
            s.stop = true;
            s.started
        };
        if started {
            self.shared.registered.notify_all();
            // The thread may be about to sleep on the futex: move the
            // sequence so that it cannot (other processes' waiters just
            // try once more).
            self.word().fetch_add(1, Ordering::SeqCst);
            futex_wake_all(self.word());
        }
    }
}

impl NotifierShared {
    fn word(&self) -> &AtomicU32 {
        // SAFETY: `at` is the wake sequence of the validated layout: inside
        // the mapping, which `self.map` keeps alive, 8-aligned, and only
        // ever accessed atomically (and by the kernel's futex calls).
        unsafe { AtomicU32::from_ptr(self.map.as_mut_ptr().add(self.at as usize).cast()) }
    }

    fn lock(&self) -> MutexGuard<'_, Sleepers> {
        sync::lock(&self.sleepers)
    }

    /// The thread: wakes the waiters whose value is stale, sleeps on the
    /// futex while the others' is current, on the condition variable while
    /// there are none.
    fn run(&self) {
        let mut s = self.lock();
        loop {
            if s.stop {
                return;
            }
            if s.list.is_empty() {
                s = sync::wait(&self.registered, s);
                continue;
            }
            let current = self.word().load(Ordering::SeqCst);
            s.list.retain(|(_, seq, waker)| {
                let moved = *seq != current;
                if moved {
                    waker.wake_by_ref();
                }
                !moved
            });
            if s.list.is_empty() {
                continue;
            }
            drop(s);
            futex_wait(self.word(), current);
            s = self.lock();
        }
    }
}

/// The future of [`Notifier::changed`].
pub(crate) struct Changed<'a> {
    notifier: &'a Notifier,
    seq: u32,
    /// Our entry in the list, once registered.
    id: Option<u64>,
}

impl Future for Changed<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let shared = self.notifier.shared.clone();
        if shared.word().load(Ordering::SeqCst) != self.seq {
            self.unregister();
            return Poll::Ready(());
        }
        let mut s = shared.lock();
        if s.stop {
            // Cannot happen while the region is borrowed; do not hang.
            return Poll::Ready(());
        }
        let id = match self.id {
            Some(id) => id,
            None => {
                let id = s.next_id;
                s.next_id += 1;
                self.id = Some(id);
                id
            }
        };
        let waker = cx.waker().clone();
        match s.list.iter_mut().find(|e| e.0 == id) {
            Some(e) => e.2 = waker,
            None => s.list.push((id, self.seq, waker)),
        }
        if !s.started {
            let thread = shared.clone();
            let spawned = std::thread::Builder::new()
                .name("nk-shm-wake".into())
                .spawn(move || thread.run());
            if let Err(e) = spawned {
                // Without the thread nothing would wake us: try again at
                // once rather than hang (the caller re-checks).
                tracing::warn!("shared memory: cannot start the wake-up thread: {e}");
                let i = s.list.iter().position(|e| e.0 == id);
                if let Some(i) = i {
                    s.list.swap_remove(i);
                }
                self.id = None;
                return Poll::Ready(());
            }
            s.started = true;
        }
        drop(s);
        shared.registered.notify_one();
        Poll::Pending
    }
}

impl Changed<'_> {
    fn unregister(&mut self) {
        if let Some(id) = self.id.take() {
            let mut s = self.notifier.shared.lock();
            if let Some(i) = s.list.iter().position(|e| e.0 == id) {
                s.list.swap_remove(i);
            }
        }
    }
}

impl Drop for Changed<'_> {
    fn drop(&mut self) {
        self.unregister();
    }
}
