//! The admin HTTP endpoints of a running cluster: `/metrics` parses as
//! Prometheus text and its counters move with traffic, `/status` is the
//! status JSON, `/healthz` and `/readyz` answer, `/` is the dashboard, and
//! anything but GET/HEAD is refused; requests a web page of another site
//! could make (another `Host`, a form `POST`) are refused.

use crate::common;

use common::{config, start_with, BS};
use nodekernel_client::{CreateOptions, NodeType};
use prometheus_parse::{Scrape, Value};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

/// Every wait here only catches a hang.
const HANG: Duration = Duration::from_secs(120);

/// One raw HTTP/1.1 request with the header lines `headers`
/// (`Connection: close` added): status code, head and body.
fn http_raw(addr: SocketAddr, method: &str, path: &str, headers: &[&str]) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the admin endpoint");
    s.set_read_timeout(Some(HANG)).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read the answer");
    let text = String::from_utf8(raw).expect("UTF-8 answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    (code, head.to_string(), body.to_string())
}

/// One request as a script makes it: `Host` is the endpoint's address, and
/// a `POST` says it is no web form (`X-NodeKernel-Request: 1`).
fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let host = format!("Host: {addr}");
    let mut headers = vec![host.as_str()];
    if method == "POST" {
        headers.push("X-NodeKernel-Request: 1");
    }
    let (code, _, body) = http_raw(addr, method, path, &headers);
    (code, body)
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || http(addr, "GET", &path))
        .await
        .unwrap()
}

pub(crate) async fn scrape(addr: SocketAddr) -> Scrape {
    let (code, body) = get(addr, "/metrics").await;
    assert_eq!(code, 200, "{body}");
    Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("Prometheus text")
}

fn value(v: &Value) -> f64 {
    match v {
        Value::Counter(x) | Value::Gauge(x) | Value::Untyped(x) => *x,
        Value::Histogram(_) | Value::Summary(_) => f64::NAN,
    }
}

/// The sum of the samples of `metric` whose labels include `labels`.
pub(crate) fn sum(s: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    s.samples
        .iter()
        .filter(|x| x.metric == metric)
        .filter(|x| labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .map(|x| value(&x.value))
        .sum()
}

/// The one sample of `metric` whose labels include `labels`; `None` if
/// there is none (or several): a missing gauge is not a zero.
pub(crate) fn only(s: &Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = s
        .samples
        .iter()
        .filter(|x| x.metric == metric)
        .filter(|x| labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)));
    match (found.next(), found.next()) {
        (Some(x), None) => Some(value(&x.value)),
        _ => None,
    }
}

fn has(s: &Scrape, metric: &str) -> bool {
    s.samples.iter().any(|x| x.metric == metric)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_serve_metrics_status_health_and_the_dashboard() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(8 << 20, 8 << 20, &dir);
    // Every block over the network, so the stores see the traffic.
    cfg.client.shared_memory = false;
    let t = start_with(cfg, dir).await;
    let meta = t
        .cluster
        .meta
        .admin_addr()
        .expect("meta.admin is on by default");
    let store = t.cluster.stores[0]
        .admin_addr()
        .expect("store admin is on by default");
    assert!(meta.ip().is_loopback() && store.ip().is_loopback());
    assert_eq!(t.cluster.admin_url().unwrap(), format!("http://{meta}/"));

    for addr in [meta, store] {
        assert_eq!(get(addr, "/healthz").await, (200, "ok\n".into()));
        let (code, page) = get(addr, "/").await;
        assert_eq!(code, 200);
        assert!(
            page.contains("<canvas") && page.contains("NodeKernel"),
            "{page}"
        );
        assert_eq!(get(addr, "/nope").await.0, 404);
        let post = tokio::task::spawn_blocking(move || http(addr, "POST", "/metrics"))
            .await
            .unwrap();
        assert_eq!(post.0, 405);
    }
    // Both stores registered: ready.
    let deadline = tokio::time::Instant::now() + HANG;
    while get(meta, "/readyz").await.0 != 200 {
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    t.client
        .create("/t", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
    let payload = vec![7u8; 3 * BS as usize];
    t.client.put("/t/a", &payload).await.unwrap();
    assert_eq!(t.client.get("/t/a").await.unwrap(), payload);

    let m1 = scrape(meta).await;
    for family in [
        "nodekernel_meta_requests_total",
        "nodekernel_meta_nodes",
        "nodekernel_meta_write_leases",
        "nodekernel_meta_server_capacity_bytes",
        "nodekernel_meta_server_used_bytes",
        "nodekernel_meta_server_alive",
        "nodekernel_meta_server_read_bytes_total",
        "nodekernel_meta_server_written_bytes_total",
        "nodekernel_meta_class_capacity_bytes",
        "nodekernel_meta_class_used_bytes",
    ] {
        assert!(has(&m1, family), "{family} missing");
    }
    assert!(
        m1.samples.iter().any(|x| x
            .metric
            .starts_with("nodekernel_meta_request_duration_seconds")),
        "latency histogram missing"
    );
    let creates = sum(&m1, "nodekernel_meta_requests_total", &[("op", "create")]);
    assert!(creates >= 1.0, "the put's create was counted");
    assert_eq!(
        sum(&m1, "nodekernel_meta_server_alive", &[]),
        2.0,
        "both servers alive"
    );
    assert_eq!(
        sum(
            &m1,
            "nodekernel_meta_class_capacity_bytes",
            &[("class", "dram")]
        ),
        (8 << 20) as f64
    );
    assert!(sum(&m1, "nodekernel_meta_server_used_bytes", &[]) >= (3 * BS) as f64);

    let s1 = scrape(store).await;
    for family in [
        "nodekernel_store_requests_total",
        "nodekernel_store_read_bytes_total",
        "nodekernel_store_written_bytes_total",
        "nodekernel_store_capacity_bytes",
    ] {
        assert!(has(&s1, family), "{family} missing");
    }
    let written1 = sum(&s1, "nodekernel_store_written_bytes_total", &[]);
    let reads1 = sum(&s1, "nodekernel_store_requests_total", &[("op", "read")]);
    assert!(written1 >= payload.len() as f64, "{written1}");

    // More traffic: the counters grow, on the store at once and on the
    // metadata server with the next heartbeats.
    let meta_written1 = sum(&m1, "nodekernel_meta_server_written_bytes_total", &[]);
    t.client.put("/t/b", &payload).await.unwrap();
    assert_eq!(t.client.get("/t/b").await.unwrap(), payload);
    let s2 = scrape(store).await;
    assert!(sum(&s2, "nodekernel_store_written_bytes_total", &[]) > written1);
    assert!(sum(&s2, "nodekernel_store_requests_total", &[("op", "read")]) > reads1);
    let m2 = scrape(meta).await;
    assert!(sum(&m2, "nodekernel_meta_requests_total", &[("op", "create")]) > creates);
    let deadline = tokio::time::Instant::now() + HANG;
    loop {
        let m = scrape(meta).await;
        if sum(&m, "nodekernel_meta_server_written_bytes_total", &[]) > meta_written1
            && sum(&m, "nodekernel_meta_class_read_bytes_total", &[]) > 0.0
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "heartbeats never carried the stores' counters"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // /status: the same JSON as `nk status --json`, for this partition.
    let (code, body) = get(meta, "/status").await;
    assert_eq!(code, 200);
    let st: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(st["ready"], true);
    assert_eq!(st["servers"].as_array().unwrap().len(), 2);
    assert_eq!(st["classes"].as_array().unwrap().len(), 2);
    assert_eq!(
        st["partitions"][0]["addr"],
        t.cluster.meta_addr().to_string()
    );
    let written: u64 = st["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["bytes_written"].as_u64().unwrap())
        .sum();
    assert!(written > 0, "{st}");
    for key in [
        "block_size",
        "nodes",
        "alive_servers",
        "logs",
        "unreachable",
    ] {
        assert!(st.get(key).is_some(), "{key} missing: {st}");
    }

    let (code, body) = get(store, "/status").await;
    assert_eq!(code, 200);
    let ss: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(ss["role"], "store");
    assert_eq!(ss["addr"], t.cluster.stores[0].advertised_addr());
    assert_eq!(ss["capacity_bytes"], 8u64 << 20);
    assert!(ss["bytes_written"].as_u64().unwrap() > 0, "{ss}");
    assert_eq!(get(store, "/readyz").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_admin_address_turns_the_endpoint_off() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(1 << 20, 0, &dir);
    cfg.meta.admin = String::new();
    let mut store = cfg.up_stores().remove(0);
    store.admin = String::new();
    cfg.store = vec![store];
    let t = start_with(cfg, dir).await;
    assert!(t.cluster.meta.admin_addr().is_none());
    assert!(t.cluster.admin_url().is_none());
    assert!(t.cluster.stores[0].admin_addr().is_none());
}

/// `/policy` on the metadata server: `GET` reads the tiering policy as
/// JSON, `POST /policy?key=value&...` changes it (all or none; a refusal
/// is a 400 naming the key), and a storage server has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_is_read_and_changed_over_http() {
    let dir = tempfile::tempdir().unwrap();
    // Without a token: with one, the endpoint only reads.
    let mut cfg = config(8 << 20, 8 << 20, &dir);
    cfg.security.insecure = true;
    let t = start_with(cfg, dir).await;
    let meta = t.cluster.meta.admin_addr().unwrap();
    let store = t.cluster.stores[0].admin_addr().unwrap();
    let json = |body: &str| -> serde_json::Value { serde_json::from_str(body).unwrap() };
    let (code, body) = get(meta, "/policy").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["high_watermark"], "90");
    let post = |path: &'static str| tokio::task::spawn_blocking(move || http(meta, "POST", path));
    let (code, body) = post("/policy?low_watermark=40&high_watermark=60")
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["high_watermark"], "60");
    // The change is the cluster's: the client sees it.
    let seen = t.client.policy(&[]).await.unwrap();
    assert!(seen[0].contains(&("low_watermark".into(), "40".into())));
    let (code, body) = post("/policy?colour=red").await.unwrap();
    assert_eq!(code, 400);
    assert!(body.contains("colour"), "{body}");
    let (code, _) = post("/policy?nonsense").await.unwrap();
    assert_eq!(code, 400);
    assert_eq!(json(&get(meta, "/policy").await.1)["high_watermark"], "60");
    assert_eq!(get(store, "/policy").await.0, 404);
}

/// With a cluster token, the admin endpoint (which proves none) still
/// reads the policy but changes nothing: `POST` is a 403 pointing at the
/// authenticated `nk policy set`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_the_admin_endpoint_only_reads() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(8 << 20, 8 << 20, &dir);
    cfg.security.token = Some("a token of at least sixteen bytes".into());
    let t = start_with(cfg, dir).await;
    let meta = t.cluster.meta.admin_addr().unwrap();
    let (code, body) =
        tokio::task::spawn_blocking(move || http(meta, "POST", "/policy?high_watermark=60"))
            .await
            .unwrap();
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("nk policy set"), "{body}");
    let (code, body) = get(meta, "/policy").await;
    assert_eq!(code, 200, "{body}");
    let policy: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(policy["high_watermark"], "90", "unchanged");
    // The authenticated path changes it.
    t.client
        .policy(&[("high_watermark".into(), "95".into())])
        .await
        .unwrap();
    let policy: serde_json::Value = serde_json::from_str(&get(meta, "/policy").await.1).unwrap();
    assert_eq!(policy["high_watermark"], "95");
}

/// DNS rebinding: a page of another site whose name was made to resolve
/// to this host sends its own name as `Host`; no route answers it (421),
/// on the metadata and the storage servers alike. The address, loopback
/// literals and `localhost` are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_another_host_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let t = start_with(config(8 << 20, 8 << 20, &dir), dir).await;
    let meta = t.cluster.meta.admin_addr().unwrap();
    let store = t.cluster.stores[0].admin_addr().unwrap();
    for addr in [meta, store] {
        let port = addr.port();
        for path in ["/status", "/metrics", "/", "/policy"] {
            for host in [
                format!("rebind.attacker.example:{port}"),
                "rebind.attacker.example".to_string(),
                format!("localhost.attacker.example:{port}"),
            ] {
                let (code, _, body) = tokio::task::spawn_blocking({
                    let h = format!("Host: {host}");
                    move || http_raw(addr, "GET", path, &[&h])
                })
                .await
                .unwrap();
                assert_eq!(code, 421, "{addr}{path} for {host}: {body}");
                assert!(!body.contains("\"servers\""), "{body}");
            }
        }
        for host in [
            addr.to_string(),
            format!("localhost:{port}"),
            format!("LocalHost:{port}"),
            format!("127.0.0.1:{port}"),
            format!("[::1]:{port}"),
        ] {
            let (code, _, body) = tokio::task::spawn_blocking({
                let h = format!("Host: {host}");
                move || http_raw(addr, "GET", "/status", &[&h])
            })
            .await
            .unwrap();
            assert_eq!(code, 200, "{addr} for {host}: {body}");
        }
    }
}

/// Cross-site request forgery on a cluster without a token: a web page can
/// make a browser `POST` a form (three content types), with or without its
/// `Origin`, but cannot add a custom header without a preflight, which is
/// never answered. Each such `POST /policy` is refused (403) and changes
/// nothing; a script's, with `X-NodeKernel-Request: 1` and no `Origin` or
/// the endpoint's own, is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_post_a_web_page_could_send_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Without a token (with one, the endpoint takes no POST at all).
    let mut cfg = config(8 << 20, 8 << 20, &dir);
    cfg.security.insecure = true;
    let t = start_with(cfg, dir).await;
    let meta = t.cluster.meta.admin_addr().unwrap();
    let host = format!("Host: {meta}");
    let own = format!("Origin: http://{meta}");
    let custom = "X-NodeKernel-Request: 1";
    let forged: Vec<Vec<String>> = [
        vec![],
        vec!["Content-Type: application/x-www-form-urlencoded", custom],
        vec!["Content-Type: multipart/form-data; boundary=x", custom],
        vec!["Content-Type: text/plain;charset=UTF-8", custom],
        vec!["Origin: http://attacker.example", custom],
        vec!["Origin: null", custom],
        vec![own.as_str(), "Content-Type: text/plain"],
        vec!["Origin: http://attacker.example"],
        vec!["X-NodeKernel-Request: yes"],
    ]
    .into_iter()
    .map(|extra| {
        let mut h = vec![host.clone()];
        h.extend(extra.into_iter().map(String::from));
        h
    })
    .collect();
    let post = |headers: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let h: Vec<&str> = headers.iter().map(String::as_str).collect();
            http_raw(meta, "POST", "/policy?high_watermark=95", &h)
        })
    };
    for headers in forged {
        let (code, _, body) = post(headers.clone()).await.unwrap();
        assert_eq!(code, 403, "{headers:?}: {body}");
    }
    // The browser's preflight for the custom header gets no permission.
    let (code, head, _) = tokio::task::spawn_blocking({
        let h = host.clone();
        move || {
            http_raw(
                meta,
                "OPTIONS",
                "/policy",
                &[
                    &h,
                    "Origin: http://attacker.example",
                    "Access-Control-Request-Method: POST",
                    "Access-Control-Request-Headers: x-nodekernel-request",
                ],
            )
        }
    })
    .await
    .unwrap();
    assert!(code >= 400, "{head}");
    assert!(
        !head.to_ascii_lowercase().contains("access-control-allow"),
        "{head}"
    );
    let policy: serde_json::Value = serde_json::from_str(&get(meta, "/policy").await.1).unwrap();
    assert_eq!(policy["high_watermark"], "90", "unchanged");
    // A script's POST, and one from the dashboard's own origin, are served.
    for extra in [vec![custom], vec![custom, own.as_str()]] {
        let mut headers = vec![host.clone()];
        headers.extend(extra.iter().map(|s| s.to_string()));
        let (code, _, body) = post(headers).await.unwrap();
        assert_eq!(code, 200, "{body}");
    }
    let policy: serde_json::Value = serde_json::from_str(&get(meta, "/policy").await.1).unwrap();
    assert_eq!(policy["high_watermark"], "95");
}
