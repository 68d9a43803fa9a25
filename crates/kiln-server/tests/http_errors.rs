//! Errors over HTTP in-process: malformed input, error shapes and statuses, API key, Host
//! check, CORS and the queue bound. A scripted generator stands in for the model.

mod common;

use std::time::Duration;

use axum::http::StatusCode;
use common::*;
use kiln_server::ServerConfig;
use serde_json::{Value, json};

#[tokio::test]
async fn malformed_inputs_are_4xx_with_messages() {
    let app = scripted(&["x"]);
    let big = format!("{{\"messages\": \"{}\"}}", "a".repeat(10 << 20));
    let many_stops: Vec<String> = (0..1000).map(|i| format!("s{i}")).collect();
    let cases: Vec<(String, StatusCode, &str)> = vec![
        ("{bad json".into(), StatusCode::BAD_REQUEST, "invalid JSON"),
        (json!({"messages": []}).to_string(), StatusCode::BAD_REQUEST, "messages must not be empty"),
        (json!({"messages": "hi"}).to_string(), StatusCode::BAD_REQUEST, "messages must be an array"),
        (json!({"messages": [{"role": "wizard", "content": "x"}]}).to_string(), StatusCode::BAD_REQUEST, "messages[0].role"),
        (json!({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).to_string(), StatusCode::BAD_REQUEST, "temperature"),
        (json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1_000_000_000u64}).to_string(), StatusCode::BAD_REQUEST, "max_tokens"),
        (json!({"messages": [{"role": "user", "content": "x"}], "stop": many_stops}).to_string(), StatusCode::BAD_REQUEST, "stop"),
        (json!({"messages": [{"role": "user", "content": "x"}], "logprobs": "yes"}).to_string(), StatusCode::BAD_REQUEST, "logprobs must be of type bool"),
        (json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 12, "logprobs": true}).to_string(), StatusCode::BAD_REQUEST, "top_logprobs must be at most 11"),
        (json!({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"a": 1}}).to_string(), StatusCode::BAD_REQUEST, "logit_bias"),
        (json!({"messages": [{"role": "user", "content": "x"}], "top_p": 2}).to_string(), StatusCode::BAD_REQUEST, "top_p"),
        (big, StatusCode::PAYLOAD_TOO_LARGE, "too large"),
    ];
    for (body, status, needle) in cases {
        let (s, text) = post(&app, "/v1/chat/completions", &body).await;
        assert_eq!(s, status, "{needle}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{needle:?} not in {msg:?}");
    }
    // Invalid UTF-8.
    let (s, text) = send(
        &app,
        "POST",
        "/v1/chat/completions",
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}".to_vec(),
        &[],
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{text}");
    // Completions: token arrays are rejected.
    let (s, _) = post(&app, "/v1/completions", r#"{"prompt": [1, 2]}"#).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // The server still answers.
    let (s, _) = send(&app, "GET", "/health", "", &[]).await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test]
async fn anthropic_errors_are_anthropic_shaped() {
    let app = scripted(&["x"]);
    let (s, text) = post(&app, "/v1/messages", r#"{"messages": [], "max_tokens": 5}"#).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("messages"),
        "{text}"
    );
}

#[tokio::test]
async fn anthropic_messages_require_max_tokens_and_count_tokens_does_not() {
    let app = scripted(&["x"]);
    let req = json!({"model": "test-model", "messages": [{"role": "user", "content": "hi"}]});
    for stream in [false, true] {
        let mut r = req.clone();
        r["stream"] = json!(stream);
        let (s, text) = post(&app, "/v1/messages", &r.to_string()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["message"], "max_tokens: Field required");
    }
    let (s, text) = post(&app, "/v1/messages/count_tokens", &req.to_string()).await;
    assert_eq!(s, StatusCode::OK, "{text}");
}

#[tokio::test]
async fn not_found_and_method() {
    let app = scripted(&["x"]);
    let (s, text) = send(&app, "GET", "/nope", "", &[]).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(text.contains("\"error\""));
    let (s, _) = send(&app, "GET", "/v1/chat/completions", "", &[]).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    let (s, _) = send(&app, "GET", "/v1/models/other", "", &[]).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, text) = send(&app, "GET", "/v1/models/test-model", "", &[]).await;
    assert_eq!(s, StatusCode::OK, "{text}");
}

#[tokio::test]
async fn api_key_host_and_cors() {
    let cfg = ServerConfig {
        api_key: Some("sekrit".into()),
        cors_origin: Some("http://app.example".into()),
        ..Default::default()
    };
    let app = app_with(script(&["x"]).serial(), cfg, 4);
    let (s, text) = send(&app, "GET", "/v1/models", "", &[]).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{text}");
    let (s, _) = send(
        &app,
        "GET",
        "/v1/models",
        "",
        &[("authorization", "Bearer sekrit")],
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = send(&app, "GET", "/v1/models", "", &[("x-api-key", "sekrit")]).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = send(&app, "GET", "/v1/models", "", &[("x-api-key", "wrong")]).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _) = send(&app, "GET", "/health", "", &[]).await;
    assert_eq!(s, StatusCode::OK);
    // DNS rebinding: a foreign Host on a loopback server is refused.
    let req = axum::http::Request::builder()
        .uri("/health")
        .header("host", "evil.example:8080")
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = tower::ServiceExt::oneshot(app.clone(), req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    // CORS preflight for the allowed origin only.
    let req = axum::http::Request::builder()
        .method("OPTIONS")
        .uri("/v1/chat/completions")
        .header("host", "127.0.0.1:8080")
        .header("origin", "http://app.example")
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = tower::ServiceExt::oneshot(app.clone(), req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        resp.headers()["access-control-allow-origin"],
        "http://app.example"
    );
    let req = axum::http::Request::builder()
        .uri("/health")
        .header("host", "127.0.0.1:8080")
        .header("origin", "http://other.example")
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = tower::ServiceExt::oneshot(app.clone(), req).await.unwrap();
    assert!(resp.headers().get("access-control-allow-origin").is_none());
}

#[tokio::test]
async fn full_queue_is_503_with_retry_after() {
    let mut g = script(&["a", "b", "c", "d", "e"]);
    g.delay = Duration::from_millis(100);
    let app = app_with(g.serial(), ServerConfig::default(), 1);
    let body = json!({"messages": [{"role": "user", "content": "x"}]}).to_string();
    let mut handles = vec![];
    for _ in 0..2 {
        let (app, body) = (app.clone(), body.clone());
        handles.push(tokio::spawn(async move {
            post(&app, "/v1/chat/completions", &body).await
        }));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let req = axum::http::Request::builder()
        .method("POST")
        .uri("/v1/chat/completions")
        .header("host", "127.0.0.1:8080")
        .body(axum::body::Body::from(body.clone()))
        .unwrap();
    let resp = tower::ServiceExt::oneshot(app.clone(), req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()["retry-after"], "1");
    for h in handles {
        assert_eq!(h.await.unwrap().0, StatusCode::OK);
    }
}
