//! Parser tests on recorded model outputs.

use super::*;

fn call(name: &str, args: &str) -> ToolCall {
    ToolCall {
        name: name.into(),
        arguments: args.into(),
    }
}

#[test]
fn hermes_qwen_json() {
    // Qwen2.5-7B-Instruct, recorded.
    let out = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>";
    let p = parse_tool_calls(out);
    assert_eq!(p.content, "");
    assert_eq!(
        p.calls,
        vec![call("get_weather", r#"{"city":"Paris","unit":"celsius"}"#)]
    );
}

#[test]
fn hermes_two_calls_with_preamble_and_unterminated_last() {
    let out = "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}";
    let p = parse_tool_calls(out);
    assert_eq!(p.content, "Let me check.");
    assert_eq!(p.calls, vec![call("a", "{}"), call("b", r#"{"x":1}"#)]);
}

#[test]
fn qwen3_coder_xml() {
    let out = "<tool_call>\n<function=search>\n<parameter=query>\nrust axum\n</parameter>\n<parameter=limit>\n5\n</parameter>\n</function>\n</tool_call>";
    let p = parse_tool_calls(out);
    assert_eq!(
        p.calls,
        vec![call("search", r#"{"query":"rust axum","limit":5}"#)]
    );
}

#[test]
fn llama3_json_and_python_tag() {
    // Llama-3.1-8B-Instruct, recorded.
    let out = "{\"name\": \"get_current_conditions\", \"parameters\": {\"location\": \"San Francisco, CA\", \"unit\": \"Fahrenheit\"}}";
    let p = parse_tool_calls(out);
    assert_eq!(
        p.calls,
        vec![call(
            "get_current_conditions",
            r#"{"location":"San Francisco, CA","unit":"Fahrenheit"}"#
        )]
    );
    let out = "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", \"parameters\": {\"a\": [1]}}";
    let p = parse_tool_calls(out);
    assert_eq!(p.calls, vec![call("f", "{}"), call("g", r#"{"a":[1]}"#)]);
}

#[test]
fn mistral_both_forms() {
    let out = "[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}]";
    assert_eq!(
        parse_tool_calls(out).calls,
        vec![call("add", r#"{"a":1,"b":2}"#)]
    );
    let out = "[TOOL_CALLS]add[ARGS]{\"a\": 1}";
    assert_eq!(parse_tool_calls(out).calls, vec![call("add", r#"{"a":1}"#)]);
}

#[test]
fn malformed_markup_stays_content() {
    for out in [
        "<tool_call>\n{\"name\": \"x\", \"arguments\": {\"a\": }\n</tool_call>",
        "{\"not\": \"a call\"}",
        "{ this is just braces }",
        "[TOOL_CALLS] nonsense",
        "plain answer",
    ] {
        let p = parse_tool_calls(out);
        assert!(p.calls.is_empty(), "{out}");
        assert_eq!(p.content, out);
    }
}

#[test]
fn stream_filter_withholds_markup_only() {
    let mut f = ToolStreamFilter::default();
    let pieces = [
        "Sure",
        ", calling",
        " now.\n<to",
        "ol_call>\n{\"name\": \"a\", ",
        "\"arguments\": {}}\n</tool_call>",
    ];
    let mut shown = String::new();
    for p in pieces {
        shown.push_str(&f.push(p));
    }
    // The newline before the call is dropped, as the whole-text parse drops it.
    assert_eq!(shown, "Sure, calling now.");
    let full: String = pieces.concat();
    let (parsed, rest) = f.finish(&full);
    assert_eq!(parsed.calls, vec![call("a", "{}")]);
    assert_eq!(rest, "");
}

#[test]
fn stream_filter_releases_held_prefix_when_not_markup() {
    let mut f = ToolStreamFilter::default();
    let mut shown = f.push("a < b and [x]");
    shown.push_str(&f.push(" done <"));
    let full = "a < b and [x] done <";
    let (parsed, rest) = f.finish(full);
    shown.push_str(&rest);
    assert!(parsed.calls.is_empty());
    assert_eq!(shown, full);
}

#[test]
fn stream_filter_bare_json_not_a_call_is_released_at_end() {
    let mut f = ToolStreamFilter::default();
    let full = "{\"answer\": 42}";
    assert_eq!(f.push(full), "");
    let (parsed, rest) = f.finish(full);
    assert!(parsed.calls.is_empty());
    assert_eq!(rest, full);
}
