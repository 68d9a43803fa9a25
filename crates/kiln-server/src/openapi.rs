//! `GET /openapi.json`: an OpenAPI 3.1 document describing every route of [`ROUTES`].

use axum::extract::State;
use serde_json::{Map, Value, json};

use crate::routes::ROUTES;
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

/// The document.
pub fn document(model: &str) -> Value {
    let mut paths = Map::new();
    for (method, path, summary) in ROUTES {
        let schema = if *method == "POST" {
            request_schema(path)
        } else {
            None
        };
        let mut op = json!({
            "summary": summary,
            "responses": {
                "200": {"description": "OK"},
                "400": {"description": "Invalid request (the message names the field)"},
                "401": {"description": "Missing or wrong API key"},
            },
        });
        if let Some(schema) = schema {
            op["requestBody"] =
                json!({"required": true, "content": {"application/json": {"schema": schema}}});
            op["responses"]["413"] = json!({"description": "Body too large"});
            if *path != "/v1/adapters" {
                op["responses"]["503"] =
                    json!({"description": "Queue full; retry after Retry-After"});
            }
        }
        if *method == "DELETE" {
            op["responses"]["404"] = json!({"description": "Not mounted"});
        }
        if path.contains("{id}") {
            op["parameters"] = json!([{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}]);
        }
        let entry = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        entry[method.to_ascii_lowercase()] = op;
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
    axum::Json(document(&state.info.id))
}
