//! The real accept loop on loopback, driven by raw sockets: header and idle timeouts, blank
//! lines, the connection cap, oversized and slow bodies refused with an answer the sending
//! client reads, and streams outliving the header timeout. A scripted generator stands in for
//! the model.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use kiln_server::{ConnectionLimits, Gateway, ServerConfig};

const HEADER_TIMEOUT: Duration = Duration::from_millis(800);
/// Room for scheduling noise on a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(3);

struct TestServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn limits() -> ConnectionLimits {
    ConnectionLimits {
        header_timeout: HEADER_TIMEOUT,
        body_timeout: Duration::from_secs(2),
        max_connections: 16,
    }
}

fn start(scripted: Scripted, limits: ConnectionLimits) -> TestServer {
    start_with_key(scripted, limits, None)
}

fn start_with_key(scripted: Scripted, limits: ConnectionLimits, key: Option<&str>) -> TestServer {
    let info = info();
    let api_key = key.map(str::to_string);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            addr_tx.send(listener.local_addr().expect("addr")).unwrap();
            let gateway = Arc::new(Gateway::start(scripted.serial(), 8, None));
            let config = ServerConfig {
                body_limit: kiln_server::DEFAULT_BODY_LIMIT,
                limits,
                api_key,
                ..ServerConfig::default()
            };
            let shutdown = async {
                let _ = stopped.await;
            };
            let models = Arc::new(kiln_server::Models::single(
                kiln_server::ServedModel::new(info, gateway),
                None,
            ));
            kiln_server::serve(listener, models, config, shutdown)
                .await
                .expect("serve");
        });
    });
    let addr = addr_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("server address");
    TestServer {
        addr,
        stop: Some(stop),
        thread: Some(thread),
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(HEADER_TIMEOUT + SLACK + SLACK))
        .unwrap();
    s
}

/// Reads until the server closes; returns what it sent and how long the close took.
fn read_to_close(s: &mut TcpStream) -> (String, Duration) {
    let t0 = Instant::now();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    (String::from_utf8_lossy(&out).into_owned(), t0.elapsed())
}

/// Sends `request` on a new connection; returns what the server sent until it closed, and how
/// long after the request that was.
fn exchange(addr: SocketAddr, request: &[u8]) -> (String, Duration) {
    let mut s = connect(addr);
    // The server may answer and close before it has read everything.
    let _ = s.write_all(request);
    read_to_close(&mut s)
}

fn status_of(response: &str) -> u16 {
    response
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[test]
fn idle_connections_are_closed_within_the_header_timeout() {
    let server = start(script(&["x"]), limits());
    let mut idle: Vec<TcpStream> = (0..10).map(|_| connect(server.addr)).collect();
    let t0 = Instant::now();
    for s in &mut idle {
        let mut byte = [0u8; 1];
        let n = s
            .read(&mut byte)
            .expect("the server closes, it does not hang");
        assert_eq!(n, 0, "an idle connection gets no bytes, only a close");
    }
    let took = t0.elapsed();
    assert!(
        took >= HEADER_TIMEOUT - Duration::from_millis(100),
        "{took:?}"
    );
    assert!(took < HEADER_TIMEOUT + SLACK, "{took:?}");
}

#[test]
fn blank_lines_alone_are_closed_within_the_header_timeout() {
    let server = start(script(&["x"]), limits());
    let (_, took) = exchange(server.addr, b"\r\n\r\n\r\n\r\n");
    assert!(took < HEADER_TIMEOUT + SLACK, "{took:?}");
}

#[test]
fn a_kept_alive_connection_is_closed_when_idle_and_a_slow_head_too() {
    let server = start(script(&["x"]), limits());
    let mut s = connect(server.addr);
    s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let (rest, took) = read_to_close(&mut s);
    assert!(rest.is_empty() && took < HEADER_TIMEOUT + SLACK, "{took:?}");

    // A head trickled in slower than the timeout allows: ~2.6 s for the whole head, which a
    // server without the timeout would answer with a 200 inside the loop's bound.
    let mut s = connect(server.addr);
    let t0 = Instant::now();
    let mut closed = false;
    for b in b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: yes\r\n\r\n" {
        if s.write_all(&[*b]).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        if t0.elapsed() > HEADER_TIMEOUT + SLACK {
            break;
        }
    }
    let (got, _) = read_to_close(&mut s);
    assert!(
        closed || !got.contains("200 OK"),
        "a slow head was served: {got}"
    );
    assert!(t0.elapsed() < HEADER_TIMEOUT + SLACK + SLACK);
}

#[test]
fn a_stream_longer_than_the_header_timeout_is_not_cut() {
    let pieces: Vec<String> = (0..12).map(|i| format!("p{i} ")).collect();
    let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let mut scripted = script(&refs);
    scripted.delay = Duration::from_millis(150);
    let server = start(scripted, limits());
    let mut s = connect(server.addr);
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"stream":true}"#;
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let (got, took) = read_to_close(&mut s);
    assert!(took > HEADER_TIMEOUT, "{took:?}");
    assert!(
        got.contains("p11 ") && got.contains("data: [DONE]"),
        "{got}"
    );
}

/// Sends a whole oversized body (as `requests` does: every byte first, then the answer) and
/// returns the answer.
fn send_everything_then_read(addr: SocketAddr, head: &str, body: &[u8]) -> String {
    let mut s = connect(addr);
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body)
        .expect("the server reads the body it refuses instead of resetting the connection");
    let (got, _) = read_to_close(&mut s);
    got
}

#[test]
fn an_oversized_body_gets_a_413_the_sending_client_reads() {
    let server = start(script(&["x"]), limits());
    let body = vec![b'a'; 12 << 20];
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    let got = send_everything_then_read(server.addr, &head, &body);
    assert_eq!(status_of(&got), 413, "{got}");
    assert!(
        got.contains("\"invalid_request_error\"") && got.contains("too large"),
        "{got}"
    );

    // Chunked: no length to refuse from, so the limit is found while reading.
    let mut chunked = Vec::new();
    for _ in 0..12 {
        chunked.extend_from_slice(format!("{:x}\r\n", 1 << 20).as_bytes());
        chunked.extend(std::iter::repeat_n(b'a', 1 << 20));
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let head = "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                Transfer-Encoding: chunked\r\n\r\n";
    let got = send_everything_then_read(server.addr, head, &chunked);
    assert_eq!(status_of(&got), 413, "{got}");
    assert!(
        got.contains("\"request_too_large\""),
        "Anthropic shape: {got}"
    );
}

#[test]
fn a_body_that_stalls_gets_a_408() {
    let server = start(script(&["x"]), limits());
    let (got, took) = exchange(
        server.addr,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"mess",
    );
    assert_eq!(status_of(&got), 408, "{got}");
    // The body timeout, then the drain's wait for more bytes that never come.
    let bound = limits().body_timeout + kiln_server::body_guard::DRAIN_IDLE + SLACK;
    assert!(took < bound, "{took:?}");
}

#[test]
fn connections_beyond_the_cap_get_a_503_and_the_server_recovers() {
    let mut l = limits();
    l.max_connections = 4;
    l.header_timeout = Duration::from_secs(5);
    let server = start(script(&["x"]), l);
    let held: Vec<TcpStream> = (0..4).map(|_| connect(server.addr)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let health = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    let (got, _) = exchange(server.addr, health);
    assert_eq!(status_of(&got), 503, "{got}");
    assert!(got.to_ascii_lowercase().contains("retry-after: 1"), "{got}");
    assert!(got.contains("open connections"), "{got}");
    drop(held);
    std::thread::sleep(Duration::from_millis(200));
    let (got, _) = exchange(server.addr, health);
    assert_eq!(status_of(&got), 200, "{got}");
}

#[test]
fn an_oversized_request_line_or_head_is_414_or_431() {
    let server = start(script(&["x"]), limits());
    let long_uri = format!(
        "GET /{} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        "a".repeat(500_000)
    );
    let big_head = format!(
        "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: {}\r\n\r\n",
        "b".repeat(1_000_000)
    );
    let many: String = (0..200).map(|i| format!("X-{i}: v\r\n")).collect();
    let many_headers = format!("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n{many}\r\n");
    // hyper answers 414 when it has parsed the request line, 431 when its buffer fills first
    // (which happens depends on how the bytes arrive).
    for (request, statuses) in [
        (long_uri, &[414, 431][..]),
        (big_head, &[431][..]),
        (many_headers, &[431][..]),
    ] {
        let (got, _) = exchange(server.addr, request.as_bytes());
        let status = status_of(&got);
        assert!(statuses.contains(&status), "{}", &got[..got.len().min(200)]);
    }
}

#[test]
fn a_refused_key_with_a_big_body_is_a_401_the_sending_client_reads() {
    // The key is checked before any body is buffered; the refused body is drained, not read.
    let server = start_with_key(script(&["x"]), limits(), Some("sekrit"));
    let body = vec![b'a'; 12 << 20];
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Authorization: Bearer wrong\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let got = send_everything_then_read(server.addr, &head, &body);
    assert_eq!(status_of(&got), 401, "{got}");
}
