//! One policy for a poisoned lock, in every crate: take it anyway.
//!
//! A `std::sync` lock is *poisoned* when a thread panicked while holding
//! it. Every lock in NodeKernel is taken through these functions, which
//! return the guard all the same (`PoisonError::into_inner`), instead of
//! `lock().unwrap()`, which would panic again.
//!
//! Why (ARCHITECTURE.md, *Cross-cutting decisions*): the panic itself is
//! the bug, and it is reported where it happens (the task's or thread's
//! panic message, an `IllegalStateException` in Java, a `RuntimeError` in
//! Python). Poisoning adds only more panics: every later user of the lock
//! (every call on that connection, every request of that mount, every call
//! of that Java client) would fail too, one bug becoming an outage of the
//! whole process. Taking the data anyway is sound because critical
//! sections never leave their data inconsistent where they can panic:
//! they are short (an insert, a remove, a swap), and the one lock around a
//! multi-step change (the metadata state) guards code whose invariants the
//! simulation checks.
//!
//! The crate `nodekernel-journal` depends on nothing of NodeKernel and
//! has the same one-line `lock` of its own.

use std::sync::{
    Condvar, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
    WaitTimeoutResult,
};
use std::time::Duration;

/// `m.lock()`, also when a thread panicked while holding it.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `l.read()`, also when a thread panicked while holding it.
pub fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// `l.write()`, also when a thread panicked while holding it.
pub fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// `cv.wait(guard)`, also when a thread panicked while holding the lock.
pub fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(PoisonError::into_inner)
}

/// `cv.wait_timeout(guard, timeout)`, also when a thread panicked while
/// holding the lock.
pub fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Duration,
) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
    cv.wait_timeout(guard, timeout)
        .unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_poisoned_lock_is_taken_with_its_data() {
        let m = Arc::new(Mutex::new(vec![1]));
        let l = Arc::new(RwLock::new(2));
        let (m2, l2) = (m.clone(), l.clone());
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            let _w = l2.write().unwrap();
            panic!("poisons both");
        })
        .join();
        assert!(m.is_poisoned() && l.is_poisoned());
        lock(&m).push(3);
        assert_eq!(*lock(&m), [1, 3]);
        *write(&l) += 1;
        assert_eq!(*read(&l), 3);
        let cv = Condvar::new();
        let (g, timed_out) = wait_timeout(&cv, lock(&m), Duration::from_millis(1));
        assert!(timed_out.timed_out() && g.len() == 2);
    }

    /// No source file of the workspace's crates handles a poisoned lock
    /// itself (`lock().unwrap()`, `.expect(…)`, `PoisonError::into_inner`):
    /// every one goes through this module (the journal through its own
    /// `lock`).
    #[test]
    fn every_lock_follows_the_one_policy() {
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        let mut dirs: Vec<_> = std::fs::read_dir(&crates)
            .unwrap()
            .map(|e| e.unwrap().path().join("src"))
            .collect();
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    files.push(p);
                }
            }
        }
        assert!(files.len() > 50, "found the sources: {}", files.len());
        let mut found = Vec::new();
        for f in files {
            if f.ends_with("proto/src/sync.rs") || f.ends_with("journal/src/lib.rs") {
                continue;
            }
            // Whitespace removed, so a chain split over lines counts too.
            let text: String = std::fs::read_to_string(&f)
                .unwrap()
                .chars()
                .filter(|c| !c.is_whitespace())
                .collect();
            for bad in [
                ".lock().unwrap(",
                ".lock().expect(",
                ".read().unwrap()",
                ".write().unwrap()",
                "|p|p.into_inner()",
                "|e|e.into_inner()",
                "PoisonError::into_inner",
            ] {
                if text.contains(bad) {
                    found.push(format!("{}: {bad}", f.display()));
                }
            }
        }
        assert!(found.is_empty(), "locks taken outside `sync`: {found:#?}");
    }
}
