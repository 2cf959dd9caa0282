//! Network reads land in the reader's buffer: the storage server's reply
//! is received by the kernel straight into the buffer the caller passed
//! (or the one `get` returns), with no intermediate buffer or copy in the
//! client (but for small reads, copied on purpose), and `get` allocates
//! its result once without zeroing it.
//!
//! This test binary counts the client thread's large allocations with its
//! own global allocator; the cluster runs on other threads.

use crate::common;

use common::{pattern, PutFile};
use nodekernel_client::{Client, ClientConfig, CreateOptions, NodeType};
use nodekernel_proto::store::READ_TRAILER_LEN;
use nodekernel_rpc::DIRECT_REPLY_MIN;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

const MIB: u64 = 1 << 20;
/// Allocations at least this large are counted.
const LARGE: usize = 64 << 10;

thread_local! {
    /// Set on the client's thread while a read is measured.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}
static LARGE_ALLOCS: AtomicU64 = AtomicU64::new(0);
static LARGE_ZEROED: AtomicU64 = AtomicU64::new(0);

struct Counting;

impl Counting {
    fn note(layout: &Layout, zeroed: bool) {
        if layout.size() >= LARGE && COUNTING.with(|c| c.get()) {
            LARGE_ALLOCS.fetch_add(1, Ordering::Relaxed);
            if zeroed {
                LARGE_ZEROED.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Counting::note(&layout, false);
        // SAFETY: the caller's contract is passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Counting::note(&layout, true);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if let Ok(l) = Layout::from_size_align(new_size, layout.align()) {
            Counting::note(&l, false);
        }
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Large allocations and zeroed large allocations made on this thread
/// while `f` runs.
async fn large_allocations<T>(f: impl std::future::Future<Output = T>) -> (T, u64, u64) {
    let (a, z) = (
        LARGE_ALLOCS.load(Ordering::Relaxed),
        LARGE_ZEROED.load(Ordering::Relaxed),
    );
    COUNTING.with(|c| c.set(true));
    let out = f.await;
    COUNTING.with(|c| c.set(false));
    (
        out,
        LARGE_ALLOCS.load(Ordering::Relaxed) - a,
        LARGE_ZEROED.load(Ordering::Relaxed) - z,
    )
}

/// Runs `f` with a client of `cfg` on a thread of its own (a one-thread
/// runtime), so that the allocations counted are the client's alone.
fn on_client_thread(cfg: ClientConfig, f: impl AsyncFnOnce(Client) + Send + 'static) {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let c = Client::connect(cfg).await.unwrap();
            f(c).await;
        })
    })
    .join()
    .expect("the client thread");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_reads_land_in_the_callers_buffer() {
    // A client on the network path: every read is a READ request.
    let t = common::start_on_path(64 * MIB, 0, false).await;
    let values = [1000, (64 << 10) + 5, MIB as usize, 3 * MIB as usize + 11];
    t.client
        .create("/t", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
    for (i, &len) in values.iter().enumerate() {
        t.client
            .put(&format!("/t/v{i}"), &pattern(i as u64, len))
            .await
            .unwrap();
    }
    let file = pattern(99, 4 * MIB as usize + 3);
    t.client.put_file("/f", &file).await;
    let cfg = t.cluster.client_config();
    on_client_thread(cfg, async move |c: Client| {
        let mut expected = 0;
        for (i, &len) in values.iter().enumerate() {
            // Warm: connections and locations.
            let _ = c.get(&format!("/t/v{i}")).await.unwrap();
            expected += len as u64;
            let before = c.data_path_stats();
            let (got, allocs, zeroed) = large_allocations(c.get(&format!("/t/v{i}"))).await;
            let got = got.unwrap();
            expected += len as u64;
            let s = c.data_path_stats();
            if len == values[0] {
                // A small read (its status byte too) is copied on purpose
                // from the receive buffer; nothing of it went direct.
                assert!(len < DIRECT_REPLY_MIN);
                assert_eq!(
                    (
                        s.network_read_bytes_small - before.network_read_bytes_small,
                        s.network_read_bytes_direct - before.network_read_bytes_direct
                    ),
                    (len as u64 + READ_TRAILER_LEN as u64, 0),
                    "{s:?}"
                );
            } else if len == MIB as usize {
                // Reads of whole slices, each with its status byte, all
                // straight into the result.
                let reads = s.network_reads - before.network_reads;
                assert_eq!(
                    (
                        s.network_read_bytes_small - before.network_read_bytes_small,
                        s.network_read_bytes_direct - before.network_read_bytes_direct
                    ),
                    (0, MIB + reads * READ_TRAILER_LEN as u64),
                    "{s:?}"
                );
            }
            assert!(got == pattern(i as u64, len), "/t/v{i}: wrong bytes");
            let result = u64::from(len >= LARGE);
            assert_eq!(
                (allocs, zeroed),
                (result, 0),
                "a get of {len} bytes makes no large allocation but its result, not zeroed"
            );
        }
        // A caller's buffer, filled by several reads in flight.
        let node = c.lookup("/f").await.unwrap();
        let mut buf = vec![0u8; file.len()];
        let (r, allocs, _) = large_allocations(node.read_at(0, &mut buf)).await;
        r.unwrap();
        expected += file.len() as u64;
        assert!(buf == file, "/f: wrong bytes");
        assert_eq!(
            allocs, 0,
            "reading into a caller's buffer allocates no buffer"
        );

        let s = c.data_path_stats();
        assert_eq!(s.mapped_reads, 0, "{s:?}");
        assert_eq!(
            s.network_read_bytes_copied, 0,
            "no byte of a large read went through a receive buffer: {s:?}"
        );
        // Each READ reply ends with its status byte, received with it:
        // straight into the reader's buffer, or (small reads: the 1000-byte
        // value, the short last blocks of the others) copied on purpose.
        let small = 2 * (values[0] as u64 + READ_TRAILER_LEN as u64);
        assert!(s.network_read_bytes_small >= small, "{s:?}");
        let status_bytes = s.network_reads * READ_TRAILER_LEN as u64;
        assert_eq!(
            s.network_read_bytes_direct + s.network_read_bytes_small,
            expected + status_bytes,
            "{s:?}"
        );
    });
}
