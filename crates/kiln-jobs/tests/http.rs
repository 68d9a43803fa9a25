//! The HTTP API over loopback: submit, list, show, cancel, SSE, bad input, concurrency.

mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use kiln_jobs::{JobHost, JobStatus};
use serde_json::{Value, json};

async fn serve(host: JobHost) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, kiln_jobs::http::router(host)).await;
    });
    addr
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

/// A blocking request; returns the status and the JSON body.
fn call(method: &str, url: &str, body: Option<&str>) -> (u16, Value) {
    let agent = agent();
    let resp = match (method, body) {
        ("GET", _) => agent.get(url).call(),
        (_, Some(b)) => agent
            .post(url)
            .header("content-type", "application/json")
            .send(b),
        _ => agent.post(url).send_empty(),
    };
    let mut resp = resp.expect("request");
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn acall(method: &'static str, url: String, body: Option<String>) -> (u16, Value) {
    tokio::task::spawn_blocking(move || call(method, &url, body.as_deref()))
        .await
        .expect("join")
}

/// Reads an SSE stream to `event: end`; returns (ids, data objects, saw retry).
fn read_sse(url: &str, last_event_id: Option<u64>) -> (Vec<u64>, Vec<Value>, bool) {
    let mut req = agent().get(url);
    if let Some(n) = last_event_id {
        req = req.header("last-event-id", n.to_string());
    }
    let resp = req.call().expect("stream");
    assert_eq!(resp.status().as_u16(), 200);
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    let reader = BufReader::new(resp.into_body().into_reader());
    let (mut ids, mut data, mut retry, mut is_end) = (Vec::new(), Vec::new(), false, false);
    for line in reader.lines() {
        let line = line.expect("line");
        if line.starts_with("retry:") {
            retry = true;
        } else if let Some(id) = line.strip_prefix("id:") {
            ids.push(id.trim().parse().expect("numeric id"));
        } else if line == "event: end" {
            is_end = true;
        } else if let Some(d) = line.strip_prefix("data:") {
            if is_end {
                return (ids, data, retry);
            }
            data.push(serde_json::from_str(d.trim()).expect("data is JSON"));
        }
    }
    panic!("stream ended without `event: end`");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_show_list_cancel_and_page() {
    let (_dir, host) = host();
    let base = format!("http://{}", serve(host.clone()).await);
    let (code, body) = acall(
        "POST",
        format!("{base}/api/jobs"),
        Some(r#"{"kind":"noop"}"#.into()),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let id = body["job_id"].as_str().expect("job_id").to_string();
    wait_terminal(&host, &id, 20).await;
    let (code, body) = acall("GET", format!("{base}/api/jobs/{id}"), None).await;
    assert_eq!((code, body["job"]["status"].clone()), (200, json!("done")));
    let (code, body) = acall("GET", format!("{base}/api/jobs/job_0000000000000000"), None).await;
    assert_eq!((code, body["error"].clone()), (404, json!("job not found")));
    let (_, body) = acall("GET", format!("{base}/api/jobs?limit=5&kind=noop"), None).await;
    assert_eq!(body["jobs"].as_array().map(Vec::len), Some(1));
    let (_, body) = acall("GET", format!("{base}/api/jobs?kind=crash"), None).await;
    assert_eq!(body["jobs"].as_array().map(Vec::len), Some(0));
    let (code, _) = acall("POST", format!("{base}/api/jobs/{id}/cancel"), None).await;
    assert_eq!(code, 409);
    let (code, _) = acall(
        "POST",
        format!("{base}/api/jobs/job_0000000000000000/cancel"),
        None,
    )
    .await;
    assert_eq!(code, 404);
    let slow = host
        .submit("noop-inproc", json!({"delay_ms": 20000}))
        .expect("submit")
        .id;
    let (code, body) = acall("POST", format!("{base}/api/jobs/{slow}/cancel"), None).await;
    assert_eq!(
        (code, body["job"]["status"].clone()),
        (200, json!("cancelled"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_described_route_is_routed() {
    let (_dir, host) = host();
    let addr = serve(host).await;
    for (method, path, _) in kiln_jobs::http::ROUTES {
        let url = format!(
            "http://{addr}{}",
            path.replace("{id}", "job_0000000000000000")
        );
        // Malformed JSON for a POST: refused before anything is done.
        let (code, body) = acall(method, url, Some("{".into())).await;
        // The router's own fallbacks answer 404 and 405 with an empty body; handlers with JSON.
        let routed = code != 405 && !(code == 404 && body == Value::String(String::new()));
        assert!(routed, "{method} {path}: {code} {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_400_with_a_message_and_no_row() {
    let (_dir, host) = host();
    let addr = serve(host.clone()).await;
    let url = format!("http://{addr}/api/jobs");
    for body in [
        r#"{"kind":"nope","config":{}}"#,
        r#"{"kind":"noop","config":[1,2]}"#,
        r#"{"kind":"noop","config":"x"}"#,
        r#"{"config":{}}"#,
        r#"{"kind":"noop","#,
        "",
    ] {
        let (code, resp) = acall("POST", url.clone(), Some(body.into())).await;
        assert_eq!(code, 400, "{body}: {resp}");
        assert!(
            resp["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{resp}"
        );
    }
    // A 5 MB config: refused from its Content-Length, before any of it is read
    // (sending the body too would race the server's close into a reset).
    let reply = tokio::task::spawn_blocking(move || raw_post(addr, 5 << 20))
        .await
        .expect("join");
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(reply.contains("too large"), "{reply}");
    // A chunked body declares no length: refused once it crosses the limit.
    let reply = tokio::task::spawn_blocking(move || raw_chunked_post(addr, 1 << 20))
        .await
        .expect("join");
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(
        host.store().recent(100, None).expect("list").is_empty(),
        "a row was created"
    );
}

/// Sends `limit` bytes of chunks and then one more byte, and reads the reply; the server has
/// read everything sent by the time it refuses, so its close cannot reset the reply away.
fn raw_chunked_post(addr: SocketAddr, limit: usize) -> String {
    let mut s = post_head(addr, "transfer-encoding: chunked");
    let chunk = vec![b' '; 64 << 10];
    for _ in 0..limit / chunk.len() {
        s.write_all(b"10000\r\n").expect("write");
        s.write_all(&chunk).expect("write");
        s.write_all(b"\r\n").expect("write");
    }
    s.write_all(b"1\r\n \r\n").expect("write");
    read_refusal(s)
}

/// Declares a `len`-byte body, sends none of it, and reads the reply.
fn raw_post(addr: SocketAddr, len: usize) -> String {
    read_refusal(post_head(addr, &format!("content-length: {len}")))
}

/// A connection with the head of a JSON `POST /api/jobs` sent, `framing` its body header.
fn post_head(addr: SocketAddr, framing: &str) -> std::net::TcpStream {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let head = format!(
        "POST /api/jobs HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n{framing}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).expect("write");
    s
}

/// The reply, read until it says "too large" or the connection ends.
fn read_refusal(mut s: std::net::TcpStream) -> String {
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&reply).contains("too large") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&reply).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_replays_mid_job_then_follows_and_replays_after_the_end() {
    let (_dir, host) = host();
    let base = format!("http://{}", serve(host.clone()).await);
    let id = host
        .submit("noop", json!({"delay_ms": 600}))
        .expect("submit")
        .id;
    wait_row(&host, &id, 20, |r| r.progress >= 0.25).await;
    let url = format!("{base}/api/jobs/{id}/stream");
    let u = url.clone();
    let (ids, live, retry) = tokio::task::spawn_blocking(move || read_sse(&u, None))
        .await
        .expect("join");
    assert!(retry);
    let t = types(&live);
    assert_eq!(t.first().map(String::as_str), Some("started"), "{t:?}");
    assert_eq!(t.last().map(String::as_str), Some("done"), "{t:?}");
    assert!(t.iter().filter(|x| *x == "stage").count() == 2, "{t:?}");
    assert_eq!(ids, (0..live.len() as u64).collect::<Vec<_>>());
    // After the end: everything again, then `end`.
    let u = url.clone();
    let (_, after, _) = tokio::task::spawn_blocking(move || read_sse(&u, None))
        .await
        .expect("join");
    assert_eq!(after, live);
    // Resume after event 1.
    let (ids, rest, _) = tokio::task::spawn_blocking(move || read_sse(&url, Some(1)))
        .await
        .expect("join");
    assert_eq!(rest, live[2..].to_vec());
    assert_eq!(ids.first(), Some(&2));
    // An unknown job: a failed frame, then end.
    let u = format!("{base}/api/jobs/job_0000000000000000/stream");
    let (_, evs, _) = tokio::task::spawn_blocking(move || read_sse(&u, None))
        .await
        .expect("join");
    assert_eq!(types(&evs), ["failed"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_tolerates_a_partial_last_line() {
    let (_dir, host) = host();
    let base = format!("http://{}", serve(host.clone()).await);
    let id = host
        .submit("noop-inproc", json!({"delay_ms": 1500}))
        .expect("submit")
        .id;
    let log = wait_row(&host, &id, 10, |r| r.progress >= 0.25)
        .await
        .log_path;
    // A writer caught mid-line: the tail must wait for the rest, not choke.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .expect("open")
        .write_all(br#"{"type":"log","li"#)
        .expect("write");
    let url = format!("{base}/api/jobs/{id}/stream");
    let reader = tokio::task::spawn_blocking(move || read_sse(&url, None));
    tokio::time::sleep(Duration::from_millis(100)).await;
    std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .expect("open")
        .write_all(b"ne\":\"completed later\"}\n")
        .expect("write");
    let (_, evs, _) = reader.await.expect("join");
    assert!(
        evs.iter().any(|e| e["line"] == "completed later"),
        "{evs:?}"
    );
    assert_eq!(types(&evs).last().map(String::as_str), Some("done"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_submits_from_eight_clients() {
    let (_dir, host) = host();
    let url = format!("http://{}/api/jobs", serve(host.clone()).await);
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let url = url.clone();
            tokio::task::spawn_blocking(move || {
                (0..25)
                    .map(|i| {
                        let kind = if (c + i) % 4 == 0 {
                            "noop"
                        } else {
                            "noop-inproc"
                        };
                        let (code, body) =
                            call("POST", &url, Some(&json!({"kind": kind}).to_string()));
                        assert_eq!(code, 200, "{body}");
                        body["job_id"].as_str().expect("id").to_string()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut ids = Vec::new();
    for c in clients {
        ids.extend(c.await.expect("join"));
    }
    let distinct: HashSet<_> = ids.iter().collect();
    assert_eq!((ids.len(), distinct.len()), (200, 200));
    for id in &ids {
        assert_eq!(wait_terminal(&host, id, 60).await.status, JobStatus::Done);
    }
    assert_eq!(host.store().recent(1000, None).expect("list").len(), 200);
}
