//! A panic inside a kernel during a served request: that request gets a 500, the broken
//! engine is unloaded, and the next request is answered normally by the model loaded again. The real starter model
//! runs behind the real gateway; `kiln_kernels::pool::fault` makes one pool task panic.

mod common;

use axum::http::StatusCode;
use common::*;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_panic_is_a_500_and_the_next_request_is_served() {
    let app = app_reloading(engine, 4);
    let req = json!({
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8, "temperature": 0,
    })
    .to_string();
    let (s, baseline) = post(&app, "/v1/chat/completions", &req).await;
    assert_eq!(s, StatusCode::OK, "{baseline}");

    for stream in [false, true] {
        kiln_kernels::pool::fault::panic_next_tasks(1);
        let mut r: Value = serde_json::from_str(&req).unwrap();
        r["stream"] = json!(stream);
        let (s, text) = post(&app, "/v1/chat/completions", &r.to_string()).await;
        if stream {
            // The head (200) is sent before the first token; the failure is the stream's error event.
            assert_eq!(s, StatusCode::OK, "{text}");
            assert!(text.contains("internal error in the engine"), "{text}");
        } else {
            assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "{text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["error"]["type"], "server_error", "{text}");
        }
        let (s, again) = post(&app, "/v1/chat/completions", &req).await;
        assert_eq!(s, StatusCode::OK, "{again}");
        let content = |t: &str| {
            serde_json::from_str::<Value>(t).unwrap()["choices"][0]["message"]["content"].clone()
        };
        assert_eq!(
            content(&again),
            content(&baseline),
            "greedy output after recovery"
        );
    }
}
