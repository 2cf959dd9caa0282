//! Main engine: one I/O thread that owns an io_uring.
//!
//! Requests arrive over a channel. The thread keeps up to `depth` of them in
//! flight: it pushes one submission entry per request, submits them in
//! batches with a single `io_uring_enter`, reaps completions, resubmits the
//! rest of any short transfer and completes each request through its
//! oneshot channel.
//!
//! While it could take more work, the thread also keeps a `POLL_ADD` on an
//! eventfd armed, so a single `io_uring_enter` waits for *either* a
//! completion or a new request. Submitters only write the eventfd when the
//! thread said it is about to sleep (`sleeping`), so a busy thread costs
//! submitters no system call.
//!
//! Buffers (and keepalives) live in the in-flight table until their
//! completion is reaped; on shutdown the thread drains the queue and waits
//! for every in-flight I/O before it exits, and the medium joins it.

use super::request::{gone, short, OpKind, Request};
use io_uring::{opcode, squeue, types, IoUring};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;

/// `user_data` of the eventfd poll; requests use their slot index.
const WAKE: u64 = u64::MAX;

struct Wake {
    eventfd: OwnedFd,
    /// Set by the I/O thread just before it may block in `io_uring_enter`.
    sleeping: AtomicBool,
}

impl Wake {
    fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to a descriptor we own.
        // A full counter (EAGAIN) already means "wake up", so the result is
        // irrelevant.
        unsafe {
            libc::write(
                self.eventfd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            );
        }
    }

    fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64; the eventfd is
        // non-blocking, so an empty counter just fails with EAGAIN.
        unsafe {
            libc::read(
                self.eventfd.as_raw_fd(),
                (&mut v as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            );
        }
    }
}

pub(crate) struct Uring {
    tx: Option<mpsc::Sender<Request>>,
    wake: Arc<Wake>,
    thread: Option<JoinHandle<()>>,
}

impl Uring {
    /// Sets up a ring for `depth` requests in flight and starts its thread.
    /// Fails (so that the caller can fall back) if io_uring is unavailable
    /// or lacks the operations we need.
    /// Stream reads go to `stream`.
    pub fn new(file: Arc<File>, stream: Option<Arc<File>>, depth: u32) -> io::Result<Uring> {
        let depth = depth.max(1);
        // One extra entry for the eventfd poll.
        let entries = (depth + 1).next_power_of_two();
        let mut ring = IoUring::new(entries)?;
        let mut probe = io_uring::Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        for (code, name) in [
            (opcode::Read::CODE, "READ"),
            (opcode::Write::CODE, "WRITE"),
            (opcode::PollAdd::CODE, "POLL_ADD"),
            (opcode::Nop::CODE, "NOP"),
        ] {
            if !probe.is_supported(code) {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("io_uring lacks IORING_OP_{name}"),
                ));
            }
        }
        // A round trip proves that submission works (some sandboxes allow
        // io_uring_setup but refuse io_uring_enter).
        // SAFETY: a NOP references no memory.
        unsafe {
            ring.submission()
                .push(&opcode::Nop::new().build().user_data(0))
        }
        .map_err(|_| io::Error::other("io_uring submission queue full at start"))?;
        ring.submit_and_wait(1)?;
        let nop = ring
            .completion()
            .next()
            .ok_or_else(|| io::Error::other("io_uring NOP did not complete"))?;
        if nop.result() < 0 {
            return Err(io::Error::from_raw_os_error(-nop.result()));
        }

        // SAFETY: plain system call; the result is checked.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        let eventfd = unsafe { OwnedFd::from_raw_fd(efd) };
        let wake = Arc::new(Wake {
            eventfd,
            sleeping: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel();
        let thread = {
            let wake = wake.clone();
            std::thread::Builder::new()
                .name("nk-file-uring".into())
                .spawn(move || {
                    Ring {
                        ring,
                        fd: file.as_raw_fd(),
                        stream_fd: stream.as_ref().map_or(-1, |f| f.as_raw_fd()),
                        depth: depth as usize,
                        slots: Vec::new(),
                        free: Vec::new(),
                        in_flight: 0,
                        wake,
                    }
                    .run(&rx);
                    // The files live until every I/O on them completed.
                    drop((file, stream));
                })?
        };
        Ok(Uring {
            tx: Some(tx),
            wake,
            thread: Some(thread),
        })
    }

    pub fn submit(&self, req: Request) -> io::Result<()> {
        let tx = self.tx.as_ref().ok_or_else(gone)?;
        tx.send(req).map_err(|_| gone())?;
        if self.wake.sleeping.swap(false, Ordering::SeqCst) {
            self.wake.notify();
        }
        Ok(())
    }
}

impl Drop for Uring {
    /// Closes the queue and waits for the thread, which first completes every
    /// queued and in-flight request.
    fn drop(&mut self) {
        drop(self.tx.take());
        self.wake.notify();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A request in flight and how much of it is done.
struct Slot {
    req: Request,
    done: usize,
}

/// The I/O thread's state.
struct Ring {
    ring: IoUring,
    fd: RawFd,
    /// The buffered descriptor of stream reads (-1: none).
    stream_fd: RawFd,
    depth: usize,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    /// Requests in flight (the eventfd poll not counted).
    in_flight: usize,
    wake: Arc<Wake>,
}

impl Ring {
    fn run(mut self, rx: &mpsc::Receiver<Request>) {
        let mut closed = false;
        let mut poll_armed = false;
        let mut cqes: Vec<(u64, i32)> = Vec::with_capacity(self.depth + 1);
        loop {
            while !closed && self.in_flight < self.depth {
                match rx.try_recv() {
                    Ok(req) => self.start(req),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => closed = true,
                }
            }
            if closed && self.in_flight == 0 {
                // Only the eventfd poll may still be armed; it references no
                // memory, so the ring can be torn down now.
                return;
            }
            if !closed && self.in_flight < self.depth {
                // Room for more: also wake up for new requests.
                if !poll_armed {
                    let poll = opcode::PollAdd::new(
                        types::Fd(self.wake.eventfd.as_raw_fd()),
                        libc::POLLIN as u32,
                    )
                    .build()
                    .user_data(WAKE);
                    self.push(&poll);
                    poll_armed = true;
                }
                self.wake.sleeping.store(true, Ordering::SeqCst);
                // A request sent before `sleeping` was set did not notify.
                match rx.try_recv() {
                    Ok(req) => {
                        self.wake.sleeping.store(false, Ordering::SeqCst);
                        self.start(req);
                        continue;
                    }
                    Err(TryRecvError::Empty) => {}
                    Err(TryRecvError::Disconnected) => {
                        self.wake.sleeping.store(false, Ordering::SeqCst);
                        closed = true;
                        continue;
                    }
                }
            }
            if let Err(e) = self.ring.submit_and_wait(1) {
                match e.raw_os_error() {
                    Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY) => {}
                    _ => {
                        self.fail_all(&e);
                        return;
                    }
                }
            }
            self.wake.sleeping.store(false, Ordering::SeqCst);
            cqes.clear();
            cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
            for &(user_data, res) in &cqes {
                if user_data == WAKE {
                    poll_armed = false;
                    self.wake.drain();
                } else {
                    self.finish(user_data as usize, res);
                }
            }
        }
    }

    /// Takes a slot for `req` and submits it.
    fn start(&mut self, req: Request) {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        self.slots[idx] = Some(Slot { req, done: 0 });
        self.in_flight += 1;
        self.submit_slot(idx);
    }

    /// Pushes the (remaining part of the) I/O of slot `idx`.
    fn submit_slot(&mut self, idx: usize) {
        let Some(slot) = self.slots[idx].as_mut() else {
            return;
        };
        let len = slot.req.buf.len() - slot.done;
        let off = slot.req.off + slot.done as u64;
        // SAFETY: `done < len(buf)`, so the pointer stays inside the buffer.
        let ptr = unsafe { slot.req.buf.as_mut_ptr().add(slot.done) };
        // Buffers are bounded by the block size (≤ 16 MiB + 8 KiB), far
        // below u32::MAX; clamp anyway, a short transfer is resubmitted.
        let n = u32::try_from(len).unwrap_or(!4095);
        let fd = types::Fd(slot.req.kind.fd(self.fd, self.stream_fd));
        let entry = match slot.req.kind {
            OpKind::Read => opcode::Read::new(fd, ptr, n).offset(off).build(),
            OpKind::StreamRead => opcode::Read::new(fd, ptr, n)
                .offset(off)
                .rw_flags(libc::RWF_DONTCACHE)
                .build(),
            OpKind::Write => opcode::Write::new(fd, ptr.cast_const(), n)
                .offset(off)
                .build(),
        };
        self.push(&entry.user_data(idx as u64));
    }

    /// Queues `entry`, flushing the submission queue if it is full.
    fn push(&mut self, entry: &squeue::Entry) {
        loop {
            // SAFETY: every entry references either nothing (poll) or the
            // buffer of a slot, which stays in `self.slots` (on the heap, not
            // moved by the slot) until its completion is reaped.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return;
            }
            // Cannot happen with entries > depth, but stay correct.
            let _ = self.ring.submit();
        }
    }

    /// Handles the completion of slot `idx` with result `res`.
    fn finish(&mut self, idx: usize, res: i32) {
        let Some(slot) = self.slots.get_mut(idx).and_then(Option::as_mut) else {
            tracing::error!("io_uring completion for unknown slot {idx}");
            return;
        };
        let len = slot.req.buf.len();
        let result = if res < 0 {
            match -res {
                libc::EINTR | libc::EAGAIN => {
                    self.submit_slot(idx);
                    return;
                }
                errno => Err(io::Error::from_raw_os_error(errno)),
            }
        } else if res == 0 {
            Err(short(slot.req.kind))
        } else {
            slot.done += res as usize;
            if slot.done < len {
                self.submit_slot(idx);
                return;
            }
            Ok(())
        };
        if let Some(slot) = self.slots[idx].take() {
            self.free.push(idx);
            self.in_flight -= 1;
            slot.req.complete(result);
        }
    }

    /// The ring itself failed: nothing more can be reaped. Buffers and
    /// keepalives of requests the kernel may still be working on are leaked
    /// on purpose (freeing them could let the kernel write into freed
    /// memory); their waiters get an error.
    fn fail_all(&mut self, e: &io::Error) {
        tracing::error!("io_uring failed, the file medium stops: {e}");
        for slot in self.slots.drain(..).flatten() {
            let Request {
                buf, keep, done, ..
            } = slot.req;
            std::mem::forget(buf);
            std::mem::forget(keep);
            drop(done); // the waiter sees the engine gone
        }
        self.in_flight = 0;
    }
}
