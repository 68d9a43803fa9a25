//! Think-tag reasoning over HTTP with a scripted model: OpenAI `reasoning` fields and deltas,
//! Anthropic `thinking` blocks with their `signature_delta`, and tool calls after reasoning.

mod common;

use axum::http::StatusCode;
use common::*;
use serde_json::{Value, json};

const THINKING: &[&str] = &[
    "<think>",
    "\nThe user",
    " greets.\n</th",
    "ink>\n\n",
    "Hello",
    "!",
];

fn chat(stream: bool) -> String {
    json!({"stream": stream, "messages": [{"role": "user", "content": "hi"}]}).to_string()
}

#[tokio::test]
async fn openai_reasoning_is_apart_from_content() {
    let app = scripted(THINKING);
    let (s, body) = post(&app, "/v1/chat/completions", &chat(false)).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let m = &v["choices"][0]["message"];
    assert_eq!(m["content"], "Hello!");
    assert_eq!(m["reasoning"], "\nThe user greets.\n");

    let (_, body) = post(&app, "/v1/chat/completions", &chat(true)).await;
    let (frames, done) = data_frames(&body);
    assert!(done);
    let field = |k: &str| -> String {
        frames
            .iter()
            .filter_map(|f| f["choices"][0]["delta"][k].as_str())
            .collect()
    };
    assert_eq!(field("content"), "Hello!");
    assert_eq!(field("reasoning"), "\nThe user greets.\n");
    assert!(!body.contains("think>"), "a tag leaked: {body}");
}

#[tokio::test]
async fn anthropic_thinking_block_then_text() {
    let app = scripted(THINKING);
    let req =
        json!({"max_tokens": 50, "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let (s, body) = post(&app, "/v1/messages", &req.to_string()).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let ev = events(&body);
    let kinds: Vec<String> = ev
        .iter()
        .map(|(n, d)| match n.as_str() {
            "content_block_start" => {
                format!("start:{}", d["content_block"]["type"].as_str().unwrap())
            }
            "content_block_delta" => format!("delta:{}", d["delta"]["type"].as_str().unwrap()),
            other => other.to_string(),
        })
        .collect();
    let mut want = vec!["message_start", "start:thinking"];
    want.extend(["delta:thinking_delta"; 2]);
    want.extend(["delta:signature_delta", "content_block_stop", "start:text"]);
    want.extend(["delta:text_delta"; 2]);
    want.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(kinds, want);
    assert_eq!(ev[6].1["index"], 1, "the text block is the second block");

    let req = json!({"max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]});
    let (_, body) = post(&app, "/v1/messages", &req.to_string()).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["content"][0]["type"], "thinking");
    assert_eq!(v["content"][1], json!({"type": "text", "text": "Hello!"}));
}

#[tokio::test]
async fn tool_call_after_reasoning() {
    let app = scripted(&[
        "<think>need weather</think>\n",
        "<tool_call>\n{\"name\": \"w\", \"arguments\": {}}\n</tool_call>",
    ]);
    let body = json!({"messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]})
    .to_string();
    let (_, body) = post(&app, "/v1/chat/completions", &body).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls");
    assert_eq!(c["message"]["reasoning"], "need weather");
    assert_eq!(c["message"]["tool_calls"][0]["function"]["name"], "w");
}

#[tokio::test]
async fn reasoning_effort_is_validated() {
    let app = scripted(&["x"]);
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "max"});
    let (s, text) = post(&app, "/v1/chat/completions", &body.to_string()).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("reasoning_effort"));
}
