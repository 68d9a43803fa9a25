//! `GET /openapi.json`: an OpenAPI 3.1 document describing every route the app answers
//! (`AppState::routes`: the server's [`crate::routes::ROUTES`] and the extensions').

use axum::extract::State;
use serde_json::{Map, Value, json};

use crate::routes::RouteDoc;
use crate::state::SharedState;

fn request_schema(path: &str) -> Option<Value> {
    if path == "/v1/adapters" {
        return Some(
            json!({"type": "object", "required": ["id", "path"], "properties": {
                "id": {"type": "string", "description": "The name requests use (letters, digits, . _ -)"},
                "path": {"type": "string", "description": "The adapter's folder (PEFT or mlx-lm layout)"},
            }}),
        );
    }
    let sampling = json!({
        "adapter": {"type": "string", "description": "LoRA adapter id, \"a+b\" to stack, \"none\" for the base model"},
        "temperature": {"type": "number"}, "top_p": {"type": "number"}, "top_k": {"type": "integer"},
        "min_p": {"type": "number"}, "seed": {"type": "integer"},
        "repetition_penalty": {"type": "number"}, "presence_penalty": {"type": "number"},
        "frequency_penalty": {"type": "number"},
    });
    let mut props: Map<String, Value> = sampling.as_object().cloned().unwrap_or_default();
    let (required, extra) = match path {
        "/v1/chat/completions" => (
            vec!["messages"],
            json!({
                "messages": {"type": "array", "items": {"type": "object"}},
                "stream": {"type": "boolean"}, "stream_options": {"type": "object"},
                "max_tokens": {"type": "integer"}, "max_completion_tokens": {"type": "integer"},
                "stop": {"type": ["string", "array"]}, "logprobs": {"type": "boolean"},
                "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 11},
                "logit_bias": {"type": "object"}, "tools": {"type": "array"}, "tool_choice": {},
            }),
        ),
        "/v1/completions" => (
            vec!["prompt"],
            json!({
                "prompt": {"type": "string"}, "stream": {"type": "boolean"},
                "max_tokens": {"type": "integer"}, "stop": {"type": ["string", "array"]},
                "logprobs": {"type": "integer", "minimum": 0, "maximum": 11},
            }),
        ),
        "/v1/messages" => (
            vec!["messages", "max_tokens"],
            json!({
                "messages": {"type": "array", "items": {"type": "object"}},
                "system": {"type": ["string", "array"]}, "max_tokens": {"type": "integer"},
                "stop_sequences": {"type": "array", "items": {"type": "string"}},
                "stream": {"type": "boolean"}, "tools": {"type": "array"}, "tool_choice": {"type": "object"},
            }),
        ),
        "/v1/messages/count_tokens" => (
            vec!["messages"],
            json!({
                "messages": {"type": "array", "items": {"type": "object"}},
                "system": {"type": ["string", "array"]}, "max_tokens": {"type": "integer"},
                "stop_sequences": {"type": "array", "items": {"type": "string"}},
                "stream": {"type": "boolean"}, "tools": {"type": "array"}, "tool_choice": {"type": "object"},
            }),
        ),
        _ => return None,
    };
    props.extend(extra.as_object().cloned().unwrap_or_default());
    Some(json!({"type": "object", "required": required, "properties": props}))
}

/// The request body of a lab or jobs route: a JSON object, whose keys its docs list.
fn extension_schema(path: &str) -> Option<Value> {
    if path == "/api/jobs" {
        return Some(
            json!({"type": "object", "required": ["kind"], "properties": {
                "kind": {"type": "string", "description": "The job kind (docs/jobs.md)"},
                "config": {"type": "object", "description": "The kind's settings"},
            }}),
        );
    }
    let keys = path.starts_with("/api/") && !path.contains('{');
    keys.then(|| json!({"type": "object", "description": "The job's config keys (docs/lab.md)"}))
}

/// `{name}` segments of `path` as path parameters.
fn path_parameters(path: &str) -> Vec<Value> {
    (path.split('/'))
        .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
        .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
        .collect()
}

/// One operation's description.
fn operation(method: &str, path: &str, summary: &str) -> Value {
    let mut op = json!({
        "summary": summary,
        "responses": {
            "200": {"description": "OK"},
            "400": {"description": "Invalid request (the message names the field)"},
            "401": {"description": "Missing or wrong API key"},
        },
    });
    let schema = match method {
        "POST" => request_schema(path).or_else(|| extension_schema(path)),
        _ => None,
    };
    if let Some(schema) = schema {
        op["requestBody"] =
            json!({"required": true, "content": {"application/json": {"schema": schema}}});
        op["responses"]["413"] = json!({"description": "Body too large"});
        if path.starts_with("/v1/") && path != "/v1/adapters" {
            op["responses"]["503"] = json!({"description": "Queue full; retry after Retry-After"});
        }
    }
    let parameters = path_parameters(path);
    if !parameters.is_empty() {
        let missing = if method == "DELETE" {
            "Not mounted"
        } else {
            "Not found"
        };
        op["responses"]["404"] = json!({"description": missing});
        op["parameters"] = Value::Array(parameters);
    }
    op
}

/// The document over `routes`.
pub fn document(model: &str, routes: &[RouteDoc]) -> Value {
    let mut paths = Map::new();
    for (method, path, summary) in routes {
        let entry = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        entry[method.to_ascii_lowercase()] = operation(method, path, summary);
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "kiln", "version": env!("CARGO_PKG_VERSION"),
                 "description": format!("Local LLM server serving {model}")},
        "components": {"securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"},
            "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"},
        }},
        "paths": paths,
    })
}

/// `GET /openapi.json`.
pub async fn spec(State(state): State<SharedState>) -> axum::Json<Value> {
    axum::Json(document(state.models.default_id(), &state.routes))
}
