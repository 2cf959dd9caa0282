//! Helpers for tests of the generation protocol, here and in the storage
//! server (feature `testing`).

use crate::Region;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A second, independent mapping of `r`'s memfd, as a co-located client in
/// another process gets it.
pub fn second_mapping(r: &Region) -> Region {
    let fd = OwnedFd::from(r.file().try_clone().expect("dup the memfd"));
    let m = Region::open(fd, &r.layout().encode()).expect("map the memfd again");
    assert_ne!(m.data_ptr(), r.data_ptr(), "a separate mapping");
    m
}

/// Starts a thread running `op` until it returns false, and waits until it
/// has completed at least one successful iteration.
pub fn busy_thread(op: impl Fn() -> bool + Send + 'static) -> std::thread::JoinHandle<u32> {
    let started = Arc::new(AtomicBool::new(false));
    let flag = started.clone();
    let t = std::thread::spawn(move || {
        let mut n = 0;
        while op() {
            n += 1;
            flag.store(true, Ordering::Release);
        }
        flag.store(true, Ordering::Release);
        n
    });
    while !started.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    t
}
