//! Fallback engine: positional `pread`/`pwrite` on a small thread pool.
//!
//! Used where io_uring is unavailable (old kernels, seccomp sandboxes,
//! `kernel.io_uring_disabled`). Each thread takes one request at a time, so
//! the pool size bounds the I/Os in flight.

use super::request::{gone, pio, Request};
use nodekernel_proto::sync;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

pub(crate) struct Pool {
    tx: Option<mpsc::Sender<Request>>,
    threads: Vec<JoinHandle<()>>,
}

impl Pool {
    /// Starts `threads` workers doing I/O on `file`, and stream reads on
    /// `stream`.
    pub fn new(file: Arc<File>, stream: Option<Arc<File>>, threads: usize) -> io::Result<Pool> {
        let (tx, rx) = mpsc::channel::<Request>();
        let rx = Arc::new(Mutex::new(rx));
        let mut pool = Pool {
            tx: Some(tx),
            threads: Vec::with_capacity(threads),
        };
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            let file = file.clone();
            let stream = stream.clone();
            let t = std::thread::Builder::new()
                .name(format!("nk-file-io-{i}"))
                .spawn(move || worker(&file, stream.as_deref(), &rx))?;
            pool.threads.push(t);
        }
        Ok(pool)
    }

    pub fn submit(&self, req: Request) -> io::Result<()> {
        let tx = self.tx.as_ref().ok_or_else(gone)?;
        tx.send(req).map_err(|_| gone())
    }
}

fn worker(file: &File, stream: Option<&File>, rx: &Mutex<mpsc::Receiver<Request>>) {
    let fd = file.as_raw_fd();
    let stream_fd = stream.map_or(-1, |f| f.as_raw_fd());
    loop {
        // Holding the lock while blocked in `recv` is fine: the other idle
        // workers would wait for a request anyway.
        let next = sync::lock(rx).recv();
        let Ok(mut req) = next else {
            return; // the medium is gone and the queue is drained
        };
        let result = pio(req.kind.fd(fd, stream_fd), req.kind, req.off, &mut req.buf);
        req.complete(result);
    }
}

impl Drop for Pool {
    /// Closes the queue; the workers finish what is queued and exit.
    fn drop(&mut self) {
        drop(self.tx.take());
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
