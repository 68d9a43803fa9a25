//! The HTTP surface in-process: framing, tool-call deltas, error shapes and statuses, auth,
//! Host check, CORS, queue bound. A scripted generator stands in for the model so the output
//! is known; tokenizer and template are the starter model's.

mod common;

use std::time::Duration;

use axum::http::StatusCode;
use common::*;
use kiln_server::ServerConfig;
use serde_json::{Value, json};

const HERMES: &[&str] = &[
    "Checking",
    " now.",
    "\n<tool",
    "_call>\n{\"name\": \"get_weather\", ",
    "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
];

fn tools_body(stream: bool) -> String {
    json!({
        "model": "x", "stream": stream,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    })
    .to_string()
}

#[tokio::test]
async fn chat_tool_calls_non_stream() {
    let app = scripted(HERMES);
    let (s, body) = post(&app, "/v1/chat/completions", &tools_body(false)).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], "Checking now.");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    // `arguments` is a JSON *string*.
    assert_eq!(call["function"]["arguments"], r#"{"city":"Paris"}"#);
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
}

#[tokio::test]
async fn chat_tool_calls_stream_deltas() {
    let app = scripted(HERMES);
    let (s, body) = post(&app, "/v1/chat/completions", &tools_body(true)).await;
    assert_eq!(s, StatusCode::OK);
    let (frames, done) = data_frames(&body);
    assert!(done);
    assert_eq!(frames[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = frames
        .iter()
        .filter_map(|f| f["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "Checking now.\n");
    assert!(!content.contains("<tool"), "markup leaked: {content:?}");
    let calls: Vec<&Value> = frames
        .iter()
        .filter(|f| !f["choices"][0]["delta"]["tool_calls"].is_null())
        .collect();
    assert_eq!(calls.len(), 1);
    let c = &calls[0]["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(c["index"], 0);
    assert_eq!(c["function"]["arguments"], r#"{"city":"Paris"}"#);
    let last = frames.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
}

#[tokio::test]
async fn chat_without_tools_keeps_markup_as_text() {
    let app = scripted(HERMES);
    let body = json!({"messages": [{"role": "user", "content": "hi"}]}).to_string();
    let (_, body) = post(&app, "/v1/chat/completions", &body).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["message"]["content"], HERMES.concat());
}

#[tokio::test]
async fn anthropic_stream_grammar_with_tool_use() {
    let app = scripted(HERMES);
    let body = json!({
        "model": "x", "max_tokens": 50, "stream": true,
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [{"name": "get_weather", "description": "w", "input_schema": {"type": "object"}}],
    })
    .to_string();
    let (s, body) = post(&app, "/v1/messages", &body).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let ev = events(&body);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    for (name, data) in &ev {
        assert_eq!(data["type"], name.as_str());
    }
    assert_eq!(ev[6].1["content_block"]["type"], "tool_use");
    assert_eq!(ev[7].1["delta"]["type"], "input_json_delta");
    assert_eq!(ev[7].1["delta"]["partial_json"], r#"{"city":"Paris"}"#);
    assert_eq!(ev[9].1["delta"]["stop_reason"], "tool_use");
}

#[tokio::test]
async fn anthropic_tool_round_trip_history_and_malformed_call() {
    let app = scripted(&["It is sunny."]);
    let body = json!({
        "model": "x", "max_tokens": 20, "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}
        ],
    })
    .to_string();
    let (s, body) = post(&app, "/v1/messages", &body).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["content"][0]["text"], "It is sunny.");
    assert_eq!(v["stop_reason"], "end_turn");

    // A malformed call in the OpenAI history is accepted, not a hang or a 500.
    let body = json!({"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "err"}
    ]})
    .to_string();
    let (s, body) = post(&app, "/v1/chat/completions", &body).await;
    assert_eq!(s, StatusCode::OK, "{body}");
}

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
    let (s, text) = post(&app, "/v1/messages", r#"{"messages": []}"#).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
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
    let app = app_with(script(&["x"]), cfg, 4);
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
    let app = app_with(g, ServerConfig::default(), 1);
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

#[tokio::test]
async fn discovery_endpoints() {
    let app = scripted(&["x"]);
    for path in [
        "/v1",
        "/v1/models",
        "/stats",
        "/openapi.json",
        "/ready",
        "/health",
    ] {
        let (s, text) = send(&app, "GET", path, "", &[]).await;
        assert_eq!(s, StatusCode::OK, "{path}");
        serde_json::from_str::<Value>(&text).unwrap();
    }
    let (_, text) = send(&app, "GET", "/openapi.json", "", &[]).await;
    let v: Value = serde_json::from_str(&text).unwrap();
    for (method, path, _) in kiln_server::routes::ROUTES {
        assert!(
            !v["paths"][path][method.to_ascii_lowercase()].is_null(),
            "{method} {path}"
        );
    }
    let (_, text) = send(&app, "GET", "/metrics", "", &[]).await;
    assert!(text.contains("vllm:num_requests_running"));
    assert!(text.contains("vllm:num_requests_waiting"));
    assert!(text.contains("vllm:gpu_cache_usage_perc"));
    let (s, text) = send(&app, "GET", "/", "", &[]).await;
    assert_eq!(s, StatusCode::OK);
    assert!(text.contains("<title>kiln</title>"));
}

#[tokio::test]
async fn count_tokens_matches_usage() {
    let app = scripted(&["ok"]);
    let req = json!({"model": "x", "max_tokens": 5, "messages": [{"role": "user", "content": "Count me"}]});
    let (_, text) = post(&app, "/v1/messages/count_tokens", &req.to_string()).await;
    let n = serde_json::from_str::<Value>(&text).unwrap()["input_tokens"].clone();
    let (_, text) = post(&app, "/v1/messages", &req.to_string()).await;
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["usage"]["input_tokens"], n);
}
