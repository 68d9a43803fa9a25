//! Arbitrary bytes as the JSON body of a generation request: the first byte picks the endpoint
//! (chat completions, completions, messages, responses), the rest is the body. Parsing into the
//! typed request and every model-independent check after it (message normalisation, the
//! Anthropic → OpenAI conversion, Responses input items and tools, `response_format` /
//! `text.format`, `tool_choice`, stop strings) must return a request or an `ApiError`, never
//! panic. The same bytes are also read as model output by the tool-call parser in every format,
//! and by the typed-turn builder in pieces.

#![no_main]

use axum::body::Bytes;
use kiln_server::anthropic::{MessagesRequest, to_openai};
use kiln_server::body::parse_request;
use kiln_server::errors::Flavor;
use kiln_server::openai::chat::ChatRequest;
use kiln_server::openai::completions::CompletionRequest;
use kiln_server::openai::responses::{ResponsesRequest, input};
use kiln_server::structured::{
    anthropic_tool_choice, chat_response_format, openai_tool_choice, text_format,
};
use kiln_server::tools::ToolFormat;
use kiln_server::turn::{TurnBuilder, TurnShape};
use kiln_server::prompt::normalize_messages;
use kiln_server::sampling::parse_stop;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&endpoint, body)) = data.split_first() else {
        return;
    };
    let bytes = || Ok(Bytes::copy_from_slice(body));
    match endpoint % 4 {
        0 => {
            if let Ok(req) = parse_request::<ChatRequest>(bytes(), Flavor::OpenAi) {
                let _ = normalize_messages(&req.messages);
                let _ = parse_stop(req.stop.as_ref(), "stop");
                let _ = chat_response_format(req.response_format.as_ref());
                let _ = openai_tool_choice(req.tool_choice.as_ref());
            }
        }
        3 => {
            if let Ok(req) = parse_request::<ResponsesRequest>(bytes(), Flavor::OpenAi) {
                if let Some(i) = &req.input
                    && let Ok(m) = input::messages(i)
                {
                    let _ = normalize_messages(&serde_json::Value::Array(m));
                }
                let _ = input::tools(req.tools.as_ref());
                let _ = text_format(req.text.as_ref());
                let _ = openai_tool_choice(req.tool_choice.as_ref());
            }
        }
        1 => {
            if let Ok(req) = parse_request::<CompletionRequest>(bytes(), Flavor::OpenAi) {
                let _ = parse_stop(req.stop.as_ref(), "stop");
            }
        }
        _ => {
            if let Ok(req) = parse_request::<MessagesRequest>(bytes(), Flavor::Anthropic) {
                if let Ok((messages, _tools)) = to_openai(&req) {
                    let _ = normalize_messages(&messages);
                }
                let _ = parse_stop(req.stop_sequences.as_ref(), "stop_sequences");
                let _ = anthropic_tool_choice(req.tool_choice.as_ref());
            }
        }
    }
    if let Ok(text) = std::str::from_utf8(body) {
        let _ = kiln_server::tools::parse_tool_calls(text);
        for format in [ToolFormat::Hermes, ToolFormat::QwenXml, ToolFormat::Llama3, ToolFormat::Mistral] {
            let _ = kiln_server::tools::parse_tool_calls_as(format, text);
        }
        // The turn builder in pieces cut at char boundaries chosen by the endpoint byte.
        let shape = TurnShape {
            thinking_open: endpoint & 4 != 0,
            tools: Some(ToolFormat::Generic),
            max_calls: None,
        };
        let mut b = TurnBuilder::new(shape);
        let step = usize::from(endpoint % 7) + 1;
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(step) {
            b.push(&piece.iter().collect::<String>());
        }
        let (_, turn) = b.finish(String::new);
        assert_eq!(turn, TurnBuilder::whole(shape, text, String::new));
    }
});
