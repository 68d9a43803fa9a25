//! The HTTP surface in-process: SSE framing, tool-call deltas, the Anthropic event grammar,
//! discovery endpoints and cancellation. A scripted generator stands in for the model so the
//! output is known; tokenizer and template are the starter model's.

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
        "model": "test-model", "stream": stream,
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
    // The same content as the whole response: the newline before the call is not content.
    assert_eq!(content, "Checking now.");
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
        "model": "test-model", "max_tokens": 50, "stream": true,
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
    assert_eq!(ev[5].1["content_block"]["type"], "tool_use");
    assert_eq!(ev[6].1["delta"]["type"], "input_json_delta");
    assert_eq!(ev[6].1["delta"]["partial_json"], r#"{"city":"Paris"}"#);
    assert_eq!(ev[8].1["delta"]["stop_reason"], "tool_use");
}

#[tokio::test]
async fn anthropic_tool_round_trip_history_and_malformed_call() {
    let app = scripted(&["It is sunny."]);
    let body = json!({
        "model": "test-model", "max_tokens": 20, "system": [{"type": "text", "text": "Be brief."}],
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
    for name in [
        "vllm:kv_cache_usage_perc",
        "vllm:lora_requests_info{",
        "vllm:cache_config_info{",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
    ] {
        assert!(text.contains(name), "{name}");
    }
    let (s, text) = send(&app, "GET", "/", "", &[]).await;
    assert_eq!(s, StatusCode::OK);
    assert!(text.contains("<title>kiln</title>"));
}

#[tokio::test]
async fn count_tokens_matches_usage() {
    let app = scripted(&["ok"]);
    let req = json!({"model": "test-model", "max_tokens": 5, "messages": [{"role": "user", "content": "Count me"}]});
    let (_, text) = post(&app, "/v1/messages/count_tokens", &req.to_string()).await;
    let n = serde_json::from_str::<Value>(&text).unwrap()["input_tokens"].clone();
    let (_, text) = post(&app, "/v1/messages", &req.to_string()).await;
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["usage"]["input_tokens"], n);
}

#[tokio::test]
async fn dropping_a_stream_cancels_its_generation() {
    use futures_util::StreamExt;
    let pieces: Vec<String> = (0..200).map(|i| format!("w{i} ")).collect();
    let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let mut g = script(&refs);
    g.delay = Duration::from_millis(10);
    let app = app_with(g.serial(), ServerConfig::default(), 4);
    let body = json!({"messages": [{"role": "user", "content": "x"}], "stream": true}).to_string();
    let req = axum::http::Request::builder()
        .method("POST")
        .uri("/v1/chat/completions")
        .header("host", "127.0.0.1:8080")
        .body(axum::body::Body::from(body))
        .unwrap();
    let resp = tower::ServiceExt::oneshot(app.clone(), req).await.unwrap();
    let mut stream = resp.into_body().into_data_stream();
    for _ in 0..3 {
        stream.next().await.unwrap().unwrap();
    }
    drop(stream);
    let started = std::time::Instant::now();
    loop {
        let (_, text) = send(&app, "GET", "/stats", "", &[]).await;
        let v: Value = serde_json::from_str(&text).unwrap();
        if v["requests"]["cancelled"] == 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_millis(100),
            "not cancelled: {v}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
