//! Helpers for tests of authentication, here and in other crates: a
//! thread running as another user, and a proxy that records what a client
//! sends (to replay it).

use std::future::Future;

/// Runs `f` on a thread of its own whose credentials (only) are user and
/// group 65534 (`nobody`); `None` (the test is skipped, saying so) unless
/// this process runs as root. On Linux credentials belong to a thread, and
/// `setresuid(2)` called directly (not through libc's wrapper, which
/// changes every thread) leaves the process's other threads alone; the
/// kernel records the connecting thread's credentials for `SO_PEERCRED`.
pub async fn as_nobody<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: dropping to another user needs root");
        return None;
    }
    let t = std::thread::spawn(move || {
        // SAFETY: raw syscalls changing the calling thread's credentials.
        unsafe {
            assert_eq!(
                libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<u32>()),
                0
            );
            assert_eq!(libc::syscall(libc::SYS_setresgid, 65534, 65534, 65534), 0);
            assert_eq!(libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534), 0);
        }
        f()
    });
    Some(
        tokio::task::spawn_blocking(move || t.join().expect("the thread ran"))
            .await
            .expect("joined"),
    )
}

/// Forwards one TCP connection to `to`; returns the address to connect to
/// and a future resolving, once the connection ended, to every byte the
/// client sent.
pub async fn recording_proxy(to: String) -> (String, impl Future<Output = Vec<u8>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("address").to_string();
    let task = tokio::spawn(async move {
        let (mut c, _) = l.accept().await.expect("accept");
        let mut s = tokio::net::TcpStream::connect(&to).await.expect("connect");
        let (mut cr, mut cw) = c.split();
        let (mut sr, mut sw) = s.split();
        let mut sent = Vec::new();
        let up = async {
            let mut buf = [0u8; 4096];
            while let Ok(n) = cr.read(&mut buf).await {
                if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
                sent.extend_from_slice(&buf[..n]);
            }
            let _ = sw.shutdown().await;
        };
        let down = async {
            let _ = tokio::io::copy(&mut sr, &mut cw).await;
        };
        tokio::join!(up, down);
        sent
    });
    (addr, async move { task.await.expect("the proxy ran") })
}
