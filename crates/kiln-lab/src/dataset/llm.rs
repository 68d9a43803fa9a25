//! The model the LLM templates talk to: kiln's own `/v1/chat/completions` over loopback (spec
//! §9), with the server's API key when it has one.

use std::time::Duration;

use serde_json::{Value, json};

use crate::LabError;

/// One chat turn sent to the model.
#[derive(Debug, Clone, Default)]
pub struct ChatRequest {
    /// OpenAI-style messages.
    pub messages: Vec<Value>,
    /// OpenAI-style tools, when the template offers them.
    pub tools: Option<Value>,
}

/// What the model answered.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatReply {
    /// The answer text (reasoning already split off by the server).
    pub content: String,
    /// The `tool_calls` of the answer, as the API returned them.
    pub tool_calls: Vec<Value>,
}

/// Something that answers chats: the served model, or a script in tests.
pub trait ChatClient: Send + Sync {
    /// One completion of `req`.
    fn chat(&self, req: &ChatRequest) -> Result<ChatReply, LabError>;
}

/// Where the served model listens and how to call it.
#[derive(Debug, Clone)]
pub struct Loopback {
    /// Base URL, e.g. `http://127.0.0.1:8080`.
    pub url: String,
    /// The server's API key, when it was started with one.
    pub api_key: Option<String>,
}

/// A [`ChatClient`] over HTTP with spec §9's request body.
#[derive(Debug, Clone)]
pub struct HttpChat {
    endpoint: Loopback,
    /// `model` of each request (`local` when not given: the serving model's default, so the
    /// field is left out and the server picks its default model).
    pub model: String,
    /// `max_tokens` of each request (spec: 512).
    pub max_tokens: u32,
    /// `temperature` of each request (spec: 0.7).
    pub temperature: f64,
    agent: ureq::Agent,
}

/// The spec's default `model_name`: whatever the local server serves by default.
pub const LOCAL_MODEL: &str = "local";

/// Longest a single completion may take before the template gives up.
const CALL_TIMEOUT: Duration = Duration::from_secs(900);

impl HttpChat {
    /// A client of `endpoint` with the spec's defaults.
    pub fn new(endpoint: Loopback) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(CALL_TIMEOUT))
            .build()
            .into();
        HttpChat {
            endpoint,
            model: "local".into(),
            max_tokens: 512,
            temperature: 0.7,
            agent,
        }
    }

    fn body(&self, req: &ChatRequest) -> Value {
        let mut body = json!({
            "messages": req.messages,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "chat_template_kwargs": {"enable_thinking": false},
        });
        if self.model != LOCAL_MODEL {
            body["model"] = json!(self.model);
        }
        if let Some(tools) = &req.tools {
            body["tools"] = tools.clone();
        }
        body
    }
}

impl ChatClient for HttpChat {
    fn chat(&self, req: &ChatRequest) -> Result<ChatReply, LabError> {
        let url = format!(
            "{}/v1/chat/completions",
            self.endpoint.url.trim_end_matches('/')
        );
        let mut call = self
            .agent
            .post(&url)
            .header("content-type", "application/json");
        if let Some(key) = &self.endpoint.api_key {
            call = call.header("authorization", &format!("Bearer {key}"));
        }
        let unreachable =
            |e: ureq::Error| LabError::Generate(format!("cannot reach the model at {url}: {e}"));
        let mut resp = call
            .send(self.body(req).to_string().as_bytes())
            .map_err(unreachable)?;
        let status = resp.status();
        let text = resp
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(unreachable)?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if !status.is_success() {
            let msg = value["error"]["message"]
                .as_str()
                .or(value["error"].as_str())
                .map(str::to_string)
                .unwrap_or_else(|| value.to_string());
            return Err(LabError::Generate(format!(
                "the model answered {status}: {msg}"
            )));
        }
        parse_reply(&value)
    }
}

/// The first choice's message of a chat completion.
pub fn parse_reply(value: &Value) -> Result<ChatReply, LabError> {
    let message = &value["choices"][0]["message"];
    if !message.is_object() {
        return Err(LabError::Generate(format!(
            "the model's answer has no choices[0].message: {}",
            clip(&value.to_string())
        )));
    }
    Ok(ChatReply {
        content: message["content"].as_str().unwrap_or("").trim().to_string(),
        tool_calls: message["tool_calls"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
    })
}

fn clip(s: &str) -> String {
    s.chars().take(200).collect()
}

/// Asks one question, with an optional system prompt; the answer's text.
pub fn ask(llm: &dyn ChatClient, system: Option<&str>, user: &str) -> Result<String, LabError> {
    let mut messages = Vec::new();
    if let Some(s) = system.filter(|s| !s.trim().is_empty()) {
        messages.push(super::output::message("system", s));
    }
    messages.push(super::output::message("user", user));
    Ok(llm
        .chat(&ChatRequest {
            messages,
            tools: None,
        })?
        .content)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_is_the_specs_and_carries_tools() {
        let c = HttpChat::new(Loopback {
            url: "http://127.0.0.1:1".into(),
            api_key: None,
        });
        let b = c.body(&ChatRequest {
            messages: vec![json!({"role": "user", "content": "hi"})],
            tools: Some(json!([{"type": "function"}])),
        });
        // `local` is the server's default model: no `model` is sent.
        assert!(b.get("model").is_none());
        assert_eq!(b["max_tokens"], 512);
        assert_eq!(b["temperature"], 0.7);
        assert_eq!(b["chat_template_kwargs"]["enable_thinking"], false);
        assert_eq!(b["tools"][0]["type"], "function");
    }

    #[test]
    fn an_unreachable_model_is_a_clear_error() {
        let c = HttpChat::new(Loopback {
            url: "http://127.0.0.1:9".into(),
            api_key: Some("k".into()),
        });
        let e = c.chat(&ChatRequest::default()).unwrap_err().to_string();
        assert!(
            e.starts_with("cannot reach the model at http://127.0.0.1:9/v1/chat/completions"),
            "{e}"
        );
    }

    #[test]
    fn replies_without_a_message_are_refused() {
        assert!(parse_reply(&json!({"choices": []})).is_err());
        let r = parse_reply(
            &json!({"choices": [{"message": {"content": " a ", "tool_calls": [{"id": "1"}]}}]}),
        )
        .unwrap();
        assert_eq!((r.content.as_str(), r.tool_calls.len()), ("a", 1));
    }
}
