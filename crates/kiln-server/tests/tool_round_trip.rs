//! A full tool-call round trip through a tool-aware template (Qwen2.5's, trimmed): the tools
//! reach the prompt, the model's `<tool_call>` comes back as an OpenAI tool call with string
//! arguments, and the client's follow-up (that call plus a `tool` message) renders back into
//! the prompt as the template expects.

mod common;

use std::sync::Arc;

use axum::http::StatusCode;
use common::*;
use kiln_model::chat_template::ChatTemplate;
use kiln_server::ServerConfig;
use serde_json::{Value, json};

const QWEN25: &str = r#"{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
{{- "\n\n# Tools\n\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object within <tool_call></tool_call> XML tags.<|im_end|>\n" }}
{%- endif %}
{%- for message in messages %}
{%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
{%- elif message.role == "assistant" %}
{{- '<|im_start|>' + message.role }}
{%- if message.content %}{{- '\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\n<tool_call>\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}{{- tool_call.arguments | tojson }}{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == "tool" %}
{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' }}{{- message.content }}{{- '\n</tool_response>' }}
{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"#;

#[tokio::test]
async fn openai_tool_call_round_trip_through_a_tool_template() {
    let mut info = info();
    info.template = Some(ChatTemplate::new(QWEN25, None, Some("<|im_end|>")).unwrap());
    let tok = info.tokenizer.clone();
    let g = script(&[
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    ]);
    let seen = Arc::clone(&g.seen);
    let app = app_with_info(g.serial(), ServerConfig::default(), 4, info);
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Current weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let user = json!({"role": "user", "content": "Weather in Paris?"});

    let body = json!({"messages": [user], "tools": tools}).to_string();
    let (s, text) = post(&app, "/v1/chat/completions", &body).await;
    assert_eq!(s, StatusCode::OK, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let message = v["choices"][0]["message"].clone();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    assert!(message["content"].is_null());
    let call = &message["tool_calls"][0];
    assert_eq!(call["function"]["arguments"], r#"{"city":"Paris"}"#);
    let first_prompt = tok.decode(&seen.lock().unwrap()[0].prompt, false).unwrap();
    assert!(first_prompt.contains("# Tools"), "{first_prompt}");
    assert!(
        first_prompt.contains(r#""name": "get_weather""#),
        "{first_prompt}"
    );

    // The client sends the call back (arguments as the string it got) with the tool's answer.
    let tool_msg = json!({"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21C"});
    let body = json!({"messages": [user, message, tool_msg], "tools": tools}).to_string();
    let (s, text) = post(&app, "/v1/chat/completions", &body).await;
    assert_eq!(s, StatusCode::OK, "{text}");
    let second_prompt = tok.decode(&seen.lock().unwrap()[1].prompt, false).unwrap();
    // String arguments were turned back into an object for the template (no double encoding).
    assert!(
        second_prompt.contains(r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#),
        "{second_prompt}"
    );
    assert!(second_prompt.contains("<tool_response>\nsunny, 21C\n</tool_response>"));
    assert!(second_prompt.ends_with("<|im_start|>assistant\n"));
}
