//! The admin HTTP endpoint of NodeKernel's servers: `/metrics`
//! (Prometheus text format), `/status` (JSON), `/healthz`, `/readyz`,
//! `/policy` (the tiering policy: `GET`, and `POST` with the settings in
//! the query string) and a live dashboard page (`/`).
//!
//! This crate only serves: what the routes say comes from the embedding
//! server (the metadata or a storage server) through a [`Source`], so it
//! depends on neither. It speaks HTTP/1.1 (hyper), answers `GET` and
//! `HEAD` (and `POST /policy`), never reads a request body, and bounds what a peer can make
//! it hold: [`MAX_CONNECTIONS`] connections, [`MAX_HEADER_BYTES`] of
//! request head each, [`HEADER_TIMEOUT`] to send it, and
//! [`MAX_CONNECTION_AGE`] per connection.
//!
//! It proves no token, so it keeps web pages out (`docs/security.md`, *The
//! admin endpoint*): every request must name in its `Host` an address
//! literal, `localhost`, this machine's host name or the name in the
//! configured address (a page that got its own name to
//! resolve to this host, DNS rebinding, is answered 421), and a `POST
//! /policy` must carry [`REQUEST_HEADER`]`: 1`, no form content type, and
//! no `Origin` but the endpoint's own (else 403): a browser sends none of
//! that from another site without a preflight, which is never answered.

pub mod metrics;
pub mod status;

pub use prometheus_client;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_TYPE, HOST, ORIGIN};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// Most connections served at once; further ones are closed at accept.
pub const MAX_CONNECTIONS: usize = 64;
/// Most bytes of one request's head (request line and headers) buffered.
pub const MAX_HEADER_BYTES: usize = 16 << 10;
/// Most header lines in one request.
pub const MAX_HEADERS: usize = 64;
/// A request head must arrive within this long (an idle keep-alive
/// connection is closed after it too).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection is asked to close (after the request in progress) once it
/// is this old, so no peer holds a slot for ever.
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(300);

/// The content type of `/metrics` (Prometheus text exposition 0.0.4, as
/// `prometheus-client` writes it).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The dashboard page, one file with its CSS and JavaScript (no external
/// assets).
pub const DASHBOARD_HTML: &str = include_str!("dashboard.html");

/// What the routes serve; implemented by the embedding server.
pub trait Source: Send + Sync + 'static {
    /// The body of `/metrics`: Prometheus/OpenMetrics text.
    fn metrics(&self) -> String;
    /// The body of `/status`: a JSON document.
    fn status(&self) -> String;
    /// `Ok` while the server serves; `Err(reason)` answers `/healthz`
    /// with 503 and the reason.
    fn health(&self) -> Result<(), String>;
    /// `Ok` once the server is ready for clients (a metadata server: its
    /// expected storage servers are alive); `Err(reason)` answers
    /// `/readyz` with 503 and the reason. Default: [`Source::health`].
    fn ready(&self) -> Result<(), String> {
        self.health()
    }
    /// `/policy`: the tiering policy as JSON after changing the settings
    /// in `set` (empty for a `GET`); `None`: this server has none (404);
    /// `Some(Err(reason))`: the change was refused (400).
    fn policy(&self, _set: &[(String, String)]) -> Option<Result<String, String>> {
        None
    }
    /// `Err(reason)` when this endpoint may not change anything (`POST`
    /// is then answered 403 with the reason): the HTTP endpoint proves no
    /// cluster token, so a server with one keeps its changes to the
    /// authenticated RPC path. Default: changes allowed.
    fn changes_allowed(&self) -> Result<(), String> {
        Ok(())
    }
}

/// `(key, value)` pairs as one JSON object of strings, in order.
pub fn pairs_json(pairs: &[(String, String)]) -> String {
    let obj: serde_json::Map<String, serde_json::Value> = pairs
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    serde_json::Value::Object(obj).to_string()
}

/// The header a `POST /policy` must carry, with the value `1`: a browser
/// sends a custom header to another origin only after a preflight
/// (`OPTIONS`), which this endpoint never answers.
pub const REQUEST_HEADER: &str = "x-nodekernel-request";

/// The content types a web page may send to any site without a preflight
/// (an HTML form's, or `fetch`'s `no-cors`): a `POST` with one is refused.
const FORM_TYPES: [&str; 3] = [
    "application/x-www-form-urlencoded",
    "multipart/form-data",
    "text/plain",
];

/// The names a request's `Host` may give (DNS rebinding: a page of another
/// site whose name was made to resolve to this host still sends its own
/// name). Any address literal passes: a page served from that address
/// is this origin or another server's, never a renamed one.
#[derive(Debug)]
struct HostCheck {
    names: Vec<String>,
}

impl HostCheck {
    /// `localhost`, this machine's host name, and the host in `addr` (the
    /// configured listen address) when it is a name.
    fn new(addr: &str) -> HostCheck {
        let mut names = vec!["localhost".to_string()];
        if let Ok(a) = addr.parse::<hyper::http::uri::Authority>() {
            names.push(a.host().to_ascii_lowercase());
        }
        if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            names.push(h.trim().to_ascii_lowercase());
        }
        names.retain(|n| !n.is_empty());
        HostCheck { names }
    }

    /// Whether a `Host` header (`host[:port]`) names this endpoint.
    fn allows(&self, host: &str) -> bool {
        let Ok(a) = host.parse::<hyper::http::uri::Authority>() else {
            return false;
        };
        if host.contains('@') {
            return false; // user information: no browser sends it
        }
        let h = a.host();
        // `http` takes any port text; only a number is a port.
        let port_ok = match host.get(h.len()..) {
            Some("") => true,
            Some(p) => p
                .strip_prefix(':')
                .is_some_and(|p| p.parse::<u16>().is_ok()),
            None => false,
        };
        if !port_ok {
            return false;
        }
        let literal = h.parse::<std::net::Ipv4Addr>().is_ok()
            || h.strip_prefix('[')
                .and_then(|v6| v6.strip_suffix(']'))
                .is_some_and(|v6| v6.parse::<std::net::Ipv6Addr>().is_ok());
        literal || self.names.iter().any(|n| n.eq_ignore_ascii_case(h))
    }
}

/// Most `key=value` pairs one `POST /policy` may carry.
pub const MAX_POLICY_PAIRS: usize = 64;

/// The `key=value` pairs of a query string, in order (no percent
/// decoding: the keys and values are plain words).
fn query_pairs(query: &str) -> Result<Vec<(String, String)>, String> {
    let pairs: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    if pairs.len() > MAX_POLICY_PAIRS {
        return Err(format!("at most {MAX_POLICY_PAIRS} settings at once"));
    }
    pairs
        .into_iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(format!("{p:?} is not key=value")),
        })
        .collect()
}

/// Why the admin endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on admin address {addr}: {error}")]
pub struct AdminError {
    pub addr: String,
    pub error: std::io::Error,
}

/// A running admin endpoint; stops when dropped.
pub struct AdminServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl AdminServer {
    /// Binds `addr` and serves `source` on it in the current tokio
    /// runtime.
    pub async fn start(addr: &str, source: Arc<dyn Source>) -> Result<AdminServer, AdminError> {
        let listener = TcpListener::bind(addr).await.map_err(|error| AdminError {
            addr: addr.to_string(),
            error,
        })?;
        let local = listener.local_addr().map_err(|error| AdminError {
            addr: addr.to_string(),
            error,
        })?;
        let task = tokio::spawn(accept_loop(listener, source, HostCheck::new(addr)));
        Ok(AdminServer { addr: local, task })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR/`, the dashboard's address.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Stops accepting; connections in progress end with their runtime or
    /// their age limit.
    pub fn shutdown(&self) {
        self.task.abort();
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn accept_loop(listener: TcpListener, source: Arc<dyn Source>, hosts: HostCheck) {
    let hosts = Arc::new(hosts);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors and the like: wait instead of spinning.
                tracing::warn!("admin endpoint: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::debug!("admin endpoint: {MAX_CONNECTIONS} connections open, closing {peer}");
            continue;
        };
        let (source, hosts) = (source.clone(), hosts.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |req| {
                let (source, hosts) = (source.clone(), hosts.clone());
                async move { Ok::<_, std::convert::Infallible>(route(&*source, &hosts, &req)) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_HEADER_BYTES)
                .max_headers(MAX_HEADERS);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let aged = tokio::time::sleep(MAX_CONNECTION_AGE);
            tokio::pin!(aged);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                () = &mut aged => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::debug!("admin endpoint: connection from {peer}: {e}");
            }
        });
    }
}

fn reply(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn check(r: Result<(), String>) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    match r {
        Ok(()) => reply(StatusCode::OK, TEXT, "ok\n"),
        Err(why) => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("{why}\n")),
    }
}

/// Why a `POST` may not change anything from where it came: `Err` for a
/// request a web page could have sent (see the crate docs).
fn same_site_post(req: &Request<Incoming>) -> Result<(), String> {
    let h = req.headers();
    if h.get(REQUEST_HEADER).map(|v| v.as_bytes()) != Some(b"1") {
        return Err(format!(
            "a POST needs the header {REQUEST_HEADER}: 1 (web pages of other sites cannot send it)"
        ));
    }
    if let Some(t) = h.get(CONTENT_TYPE) {
        let t = t.to_str().unwrap_or_default();
        let essence = t.split(';').next().unwrap_or_default().trim();
        if FORM_TYPES.iter().any(|f| f.eq_ignore_ascii_case(essence)) {
            return Err(format!(
                "a POST with content type {essence} (a web form's) changes nothing: send the settings in the query string"
            ));
        }
    }
    if let Some(origin) = h.get(ORIGIN) {
        let host = h
            .get(HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if origin.as_bytes() != format!("http://{host}").as_bytes() {
            return Err(format!(
                "a POST from origin {} (another site) changes nothing",
                String::from_utf8_lossy(origin.as_bytes())
            ));
        }
    }
    Ok(())
}

/// Answers one request. The body is never read (GET and HEAD; a `POST
/// /policy` carries its settings in the query string).
fn route(source: &dyn Source, hosts: &HostCheck, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    // HTTP/1.1 requires a Host; none comes from a browser.
    if let Some(host) = req.headers().get(HOST) {
        let host = host.to_str().unwrap_or_default();
        if !hosts.allows(host) {
            return reply(
                StatusCode::MISDIRECTED_REQUEST,
                TEXT,
                format!(
                    "Host {host:?} is not this endpoint: use its address, localhost or the configured name\n"
                ),
            );
        }
    }
    if req.uri().path() == "/policy"
        && (req.method() == Method::GET || req.method() == Method::POST)
    {
        let set = if req.method() == Method::POST {
            if let Err(why) = source.changes_allowed().and_then(|()| same_site_post(req)) {
                return reply(StatusCode::FORBIDDEN, TEXT, format!("{why}\n"));
            }
            match query_pairs(req.uri().query().unwrap_or_default()) {
                Ok(set) => set,
                Err(e) => return reply(StatusCode::BAD_REQUEST, TEXT, format!("{e}\n")),
            }
        } else {
            Vec::new()
        };
        return match source.policy(&set) {
            Some(Ok(json)) => reply(StatusCode::OK, "application/json", json),
            Some(Err(e)) => reply(StatusCode::BAD_REQUEST, TEXT, format!("{e}\n")),
            None => reply(StatusCode::NOT_FOUND, TEXT, "no tiering policy here\n"),
        };
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "only GET and HEAD\n");
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    // hyper sends no body in answer to HEAD.
    match req.uri().path() {
        "/" | "/index.html" => reply(StatusCode::OK, "text/html; charset=utf-8", DASHBOARD_HTML),
        "/metrics" => reply(StatusCode::OK, METRICS_CONTENT_TYPE, source.metrics()),
        "/status" => reply(StatusCode::OK, "application/json", source.status()),
        "/healthz" => check(source.health()),
        "/readyz" => check(source.ready()),
        _ => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: try /, /metrics, /status, /healthz, /readyz or /policy\n",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::HostCheck;

    #[test]
    fn only_addresses_and_this_endpoints_names_pass_the_host_check() {
        let named = HostCheck::new("nk-admin.internal:9070");
        let plain = HostCheck::new("127.0.0.1:0");
        for host in [
            "127.0.0.1",
            "127.0.0.1:9070",
            "10.1.2.3:1",
            "[::1]:9070",
            "[::1]",
            "localhost",
            "LOCALHOST:80",
        ] {
            assert!(named.allows(host) && plain.allows(host), "{host}");
        }
        assert!(named.allows("nk-admin.internal:9070"));
        assert!(named.allows("NK-Admin.Internal"));
        assert!(!plain.allows("nk-admin.internal:9070"));
        for host in [
            "attacker.example",
            "attacker.example:9070",
            "localhost.attacker.example",
            "127.0.0.1.attacker.example",
            "localhost:notaport",
            "[::1",
            "::1",
            "",
            "user@localhost",
            "localhost/x",
        ] {
            assert!(!named.allows(host) && !plain.allows(host), "{host:?}");
        }
    }
}
