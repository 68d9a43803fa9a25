//! One table of scripted turns, rendered by every API both whole and streamed: the stream,
//! reassembled, must say what the whole response says (text, reasoning, tool calls, finish,
//! usage), and the chat-shaped APIs must agree with each other.

mod common;

use axum::http::StatusCode;
use common::*;
use serde_json::{Value, json};

/// What a rendering says, with ids left out.
#[derive(Debug, Clone, PartialEq)]
struct Said {
    reasoning: String,
    content: String,
    calls: Vec<(String, Value)>,
    finish: String,
    output_tokens: u64,
}

const CASES: &[(&str, &[&str], bool)] = &[
    ("plain", &["Hel", "lo, ", "world."], false),
    (
        "thinking",
        &["<think>", "let me see", "</think>\n\n", "Yes."],
        false,
    ),
    (
        "call",
        &[
            "Checking.",
            "\n<tool",
            "_call>\n{\"name\": \"w\", ",
            "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        ],
        true,
    ),
    (
        "markup without tools",
        &["<tool_call>\n{\"name\": \"w\"}\n</tool_call>"],
        false,
    ),
    ("not markup", &["a < b and [x] {y}"], true),
];

fn tools_chat() -> Value {
    json!([{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}])
}

fn body(api: &str, stream: bool, tools: bool) -> String {
    let user = "Weather?";
    let mut b = match api {
        "chat" => json!({"messages": [{"role": "user", "content": user}],
                         "stream_options": {"include_usage": true}}),
        "completions" => json!({"prompt": user}),
        "messages" => json!({"max_tokens": 50, "messages": [{"role": "user", "content": user}]}),
        _ => json!({"input": user}),
    };
    b["stream"] = json!(stream);
    if tools {
        b["tools"] = match api {
            "chat" => tools_chat(),
            "messages" => json!([{"name": "w", "input_schema": {"type": "object"}}]),
            _ => json!([{"type": "function", "name": "w", "parameters": {"type": "object"}}]),
        };
    }
    b.to_string()
}

fn args(s: &str) -> Value {
    serde_json::from_str(s).expect("arguments are JSON")
}

fn chat_whole(v: &Value) -> Said {
    let m = &v["choices"][0]["message"];
    Said {
        reasoning: m["reasoning"].as_str().unwrap_or("").into(),
        content: m["content"].as_str().unwrap_or("").into(),
        calls: m["tool_calls"]
            .as_array()
            .map(|c| {
                c.iter()
                    .map(|c| {
                        (
                            c["function"]["name"].as_str().unwrap().into(),
                            args(c["function"]["arguments"].as_str().unwrap()),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
        finish: v["choices"][0]["finish_reason"].as_str().unwrap().into(),
        output_tokens: v["usage"]["completion_tokens"].as_u64().unwrap(),
    }
}

fn chat_stream(body: &str) -> Said {
    let (frames, done) = data_frames(body);
    assert!(done);
    let mut s = Said {
        reasoning: String::new(),
        content: String::new(),
        calls: vec![],
        finish: String::new(),
        output_tokens: 0,
    };
    for f in &frames {
        if let Some(u) = f.get("usage").filter(|u| !u.is_null()) {
            s.output_tokens = u["completion_tokens"].as_u64().unwrap();
        }
        let Some(c) = f["choices"].get(0) else {
            continue;
        };
        let d = &c["delta"];
        s.reasoning.push_str(d["reasoning"].as_str().unwrap_or(""));
        s.content.push_str(d["content"].as_str().unwrap_or(""));
        for call in d["tool_calls"].as_array().into_iter().flatten() {
            s.calls.push((
                call["function"]["name"].as_str().unwrap().into(),
                args(call["function"]["arguments"].as_str().unwrap()),
            ));
        }
        if let Some(r) = c["finish_reason"].as_str() {
            s.finish = r.into();
        }
    }
    s
}

fn completion_whole(v: &Value) -> Said {
    Said {
        reasoning: String::new(),
        content: v["choices"][0]["text"].as_str().unwrap().into(),
        calls: vec![],
        finish: v["choices"][0]["finish_reason"].as_str().unwrap().into(),
        output_tokens: v["usage"]["completion_tokens"].as_u64().unwrap(),
    }
}

fn completion_stream(body: &str) -> Said {
    let (frames, done) = data_frames(body);
    assert!(done);
    let mut s = Said {
        reasoning: String::new(),
        content: String::new(),
        calls: vec![],
        finish: String::new(),
        output_tokens: 0,
    };
    for f in &frames {
        s.content
            .push_str(f["choices"][0]["text"].as_str().unwrap_or(""));
        if let Some(r) = f["choices"][0]["finish_reason"].as_str() {
            s.finish = r.into();
            s.output_tokens = f["usage"]["completion_tokens"].as_u64().unwrap();
        }
    }
    s
}

fn message_blocks(blocks: &[Value], stop: &str, output_tokens: u64) -> Said {
    let mut s = Said {
        reasoning: String::new(),
        content: String::new(),
        calls: vec![],
        finish: stop.into(),
        output_tokens,
    };
    for b in blocks {
        match b["type"].as_str().unwrap() {
            "thinking" => s.reasoning.push_str(b["thinking"].as_str().unwrap()),
            "text" => s.content.push_str(b["text"].as_str().unwrap()),
            "tool_use" => s
                .calls
                .push((b["name"].as_str().unwrap().into(), b["input"].clone())),
            other => panic!("block {other}"),
        }
    }
    s
}

fn messages_whole(v: &Value) -> Said {
    message_blocks(
        v["content"].as_array().unwrap(),
        v["stop_reason"].as_str().unwrap(),
        v["usage"]["output_tokens"].as_u64().unwrap(),
    )
}

fn messages_stream(body: &str) -> Said {
    let mut blocks: Vec<Value> = vec![];
    let mut partial = String::new();
    let (mut stop, mut tokens) = (String::new(), 0);
    for (name, d) in events(body) {
        match name.as_str() {
            "content_block_start" => blocks.push(d["content_block"].clone()),
            "content_block_delta" => {
                let b = blocks.last_mut().unwrap();
                match d["delta"]["type"].as_str().unwrap() {
                    "text_delta" => {
                        b["text"] = json!(format!(
                            "{}{}",
                            b["text"].as_str().unwrap(),
                            d["delta"]["text"].as_str().unwrap()
                        ))
                    }
                    "thinking_delta" => {
                        b["thinking"] = json!(format!(
                            "{}{}",
                            b["thinking"].as_str().unwrap(),
                            d["delta"]["thinking"].as_str().unwrap()
                        ))
                    }
                    "input_json_delta" => {
                        partial.push_str(d["delta"]["partial_json"].as_str().unwrap())
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                let b = blocks.last_mut().unwrap();
                if b["type"] == "tool_use" {
                    b["input"] = args(&std::mem::take(&mut partial));
                }
            }
            "message_delta" => {
                stop = d["delta"]["stop_reason"].as_str().unwrap().into();
                tokens = d["usage"]["output_tokens"].as_u64().unwrap();
            }
            _ => {}
        }
    }
    // Anthropic's whole answer drops an empty text block only when other blocks exist.
    blocks.retain(|b| !(b["type"] == "text" && b["text"] == ""));
    message_blocks(&blocks, &stop, tokens)
}

fn response_items(r: &Value) -> Said {
    let mut s = Said {
        reasoning: String::new(),
        content: String::new(),
        calls: vec![],
        finish: r["status"].as_str().unwrap().into(),
        output_tokens: r["usage"]["output_tokens"].as_u64().unwrap(),
    };
    for item in r["output"].as_array().unwrap() {
        match item["type"].as_str().unwrap() {
            "reasoning" => {
                for p in item["summary"].as_array().unwrap() {
                    s.reasoning.push_str(p["text"].as_str().unwrap());
                }
            }
            "message" => s
                .content
                .push_str(item["content"][0]["text"].as_str().unwrap()),
            "function_call" => s.calls.push((
                item["name"].as_str().unwrap().into(),
                args(item["arguments"].as_str().unwrap()),
            )),
            other => panic!("item {other}"),
        }
    }
    s
}

fn responses_stream(body: &str) -> (Said, Said) {
    let ev = events(body);
    let kinds: Vec<&str> = ev.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(&kinds[..2], ["response.created", "response.in_progress"]);
    assert_eq!(*kinds.last().unwrap(), "response.completed");
    let mut s = Said {
        reasoning: String::new(),
        content: String::new(),
        calls: vec![],
        finish: String::new(),
        output_tokens: 0,
    };
    for (i, (k, d)) in ev.iter().enumerate() {
        assert_eq!(d["sequence_number"], i as u64, "{k}");
        assert_eq!(d["type"], k.as_str());
        match k.as_str() {
            "response.output_text.delta" => s.content.push_str(d["delta"].as_str().unwrap()),
            "response.reasoning_summary_text.delta" => {
                s.reasoning.push_str(d["delta"].as_str().unwrap())
            }
            "response.function_call_arguments.done" => s.calls.push((
                d["name"].as_str().unwrap().into(),
                args(d["arguments"].as_str().unwrap()),
            )),
            _ => {}
        }
    }
    let last = response_items(&ev.last().unwrap().1["response"]);
    s.finish = last.finish.clone();
    s.output_tokens = last.output_tokens;
    (s, last)
}

async fn whole_and_stream(api: &str, pieces: &[&str], tools: bool) -> (Said, Said) {
    let path = match api {
        "chat" => "/v1/chat/completions",
        "completions" => "/v1/completions",
        "messages" => "/v1/messages",
        _ => "/v1/responses",
    };
    let (s, whole) = post(&scripted(pieces), path, &body(api, false, tools)).await;
    assert_eq!(s, StatusCode::OK, "{api}: {whole}");
    let (s, stream) = post(&scripted(pieces), path, &body(api, true, tools)).await;
    assert_eq!(s, StatusCode::OK, "{api}: {stream}");
    let v: Value = serde_json::from_str(&whole).unwrap();
    match api {
        "chat" => (chat_whole(&v), chat_stream(&stream)),
        "completions" => (completion_whole(&v), completion_stream(&stream)),
        "messages" => (messages_whole(&v), messages_stream(&stream)),
        _ => {
            let (streamed, completed) = responses_stream(&stream);
            assert_eq!(
                completed,
                response_items(&v),
                "responses: completed event vs whole"
            );
            (response_items(&v), streamed)
        }
    }
}

#[tokio::test]
async fn every_api_streams_what_it_answers_whole() {
    for (name, pieces, tools) in CASES {
        let mut said = vec![];
        for api in ["chat", "completions", "messages", "responses"] {
            let (whole, streamed) = whole_and_stream(api, pieces, *tools).await;
            assert_eq!(whole, streamed, "{name} / {api}");
            assert_eq!(whole.output_tokens, pieces.len() as u64, "{name} / {api}");
            said.push(whole);
        }
        assert_eq!(
            said[1].content,
            pieces.concat(),
            "{name}: completions are raw text"
        );
        for (api, s) in [("messages", &said[2]), ("responses", &said[3])] {
            assert_eq!(
                (&s.reasoning, &s.content, &s.calls),
                (&said[0].reasoning, &said[0].content, &said[0].calls),
                "{name}: {api} vs chat"
            );
        }
        let chat = &said[0];
        match *name {
            "thinking" => assert_eq!(
                (chat.reasoning.as_str(), chat.content.as_str()),
                ("let me see", "Yes.")
            ),
            "call" => {
                assert_eq!(chat.content, "Checking.");
                assert_eq!(
                    chat.calls,
                    vec![("w".to_string(), json!({"city": "Paris"}))]
                );
                assert_eq!(chat.finish, "tool_calls");
                assert_eq!(said[2].finish, "tool_use");
            }
            _ => assert!(chat.calls.is_empty() && chat.reasoning.is_empty(), "{name}"),
        }
    }
}

#[tokio::test]
async fn constraints_are_checked_before_anything_runs() {
    let app = scripted(&["x"]);
    let user = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (
            "/v1/chat/completions",
            json!({"messages": user, "tool_choice": "required"}),
            "no tools were given",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "tools": tools_chat(),
            "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "not among the tools",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "tools": tools_chat(), "tool_choice": "required",
            "response_format": {"type": "json_object"}}),
            "cannot be combined",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "response_format": {"type": "yaml"}}),
            "response_format.type",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "no_such_type"}}}}),
            "invalid or unsupported schema",
        ),
        (
            "/v1/responses",
            json!({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}),
            "text.format.schema is required",
        ),
        (
            "/v1/responses",
            json!({"input": "hi", "text": "json"}),
            "text must be an object",
        ),
        (
            "/v1/responses",
            json!({"input": "hi", "conversation": "conv_1"}),
            "conversation is not supported",
        ),
        (
            "/v1/responses",
            json!({"input": "hi", "previous_response_id": "resp_unknown"}),
            "not found",
        ),
        (
            "/v1/messages",
            json!({"max_tokens": 5, "messages": user, "tool_choice": {"type": "any"}}),
            "no tools were given",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "best_of": 3}),
            "best_of",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "suffix": "end"}),
            "suffix",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "functions": [{"name": "f"}]}),
            "functions",
        ),
    ];
    for (path, body, needle) in cases {
        let (s, text) = post(&app, path, &body.to_string()).await;
        let expected = if needle == "not found" {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::BAD_REQUEST
        };
        assert_eq!(s, expected, "{path} {body}: {text}");
        assert!(text.contains(needle), "{path} {body}: {text}");
    }
}

#[tokio::test]
async fn parallel_tool_calls_false_keeps_the_first_call() {
    let two = &[
        "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"n\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"n\": 2}}\n</tool_call>",
    ];
    let user = json!([{"role": "user", "content": "hi"}]);
    for (parallel, expected) in [(None, 2), (Some(false), 1)] {
        let mut b = json!({"messages": user, "tools": tools_chat()});
        if let Some(p) = parallel {
            b["parallel_tool_calls"] = json!(p);
        }
        let (_, text) = post(&scripted(two), "/v1/chat/completions", &b.to_string()).await;
        let v: Value = serde_json::from_str(&text).unwrap();
        let calls = v["choices"][0]["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), expected, "{text}");
        assert_eq!(
            args(calls[0]["function"]["arguments"].as_str().unwrap()),
            json!({"n": 1})
        );
    }
    let r =
        json!({"input": "hi", "max_tool_calls": 1, "tools": [{"type": "function", "name": "w"}]});
    let (_, text) = post(&scripted(two), "/v1/responses", &r.to_string()).await;
    let v: Value = serde_json::from_str(&text).unwrap();
    let calls: Vec<&Value> = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call")
        .collect();
    assert_eq!(calls.len(), 1, "{text}");
}
