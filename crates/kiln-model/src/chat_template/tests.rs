use serde_json::{Value, json};

use super::{ChatTemplate, prompt_ids};
use crate::ModelError;
use crate::gguf::GgufFile;
use crate::tokenizer::test_support::{reference_dir, test_model_path};
use crate::tokenizer::tests::{smollm2_tokenizer, spm_metadata};
use crate::tokenizer::tokenizer_from_metadata;

fn render(source: &str, messages: &[Value], extra: Option<Value>) -> Result<String, ModelError> {
    let tmpl = ChatTemplate::new(source, Some("<s>"), Some("</s>"))?;
    let extra = extra.map(|e| e.as_object().cloned().unwrap_or_default());
    tmpl.render(messages, None, false, extra.as_ref())
}

#[test]
fn smollm2_template_matches_transformers() {
    let path = reference_dir().join("transformers_reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reference: Value = serde_json::from_str(&text).expect("reference JSON");
    let case = &reference["cases"]["chat_capital_france"];

    let file = GgufFile::open(&test_model_path()).expect("open test model");
    let tok = smollm2_tokenizer();
    let tmpl = ChatTemplate::from_gguf(file.header(), tok)
        .expect("compile")
        .expect("GGUF has a template");
    let messages = case["input"].as_array().expect("messages");
    let rendered = tmpl.render(messages, None, true, None).expect("render");
    assert_eq!(
        rendered,
        case["rendered_prompt"].as_str().expect("rendered_prompt")
    );

    let want: Vec<u32> = case["prompt_token_ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect();
    assert_eq!(prompt_ids(tok, &rendered).expect("encode"), want);
}

#[test]
fn raise_exception_reports_its_message() {
    let source = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with a user message') }}{% endif %}ok";
    let err = render(
        source,
        &[json!({"role": "assistant", "content": "hi"})],
        None,
    )
    .expect_err("raises");
    match err {
        ModelError::ChatTemplate(msg) => {
            assert_eq!(msg, "Conversation must start with a user message")
        }
        other => panic!("unexpected error {other}"),
    }
    assert_eq!(
        render(source, &[json!({"role": "user", "content": "hi"})], None).expect("render"),
        "ok"
    );
}

#[test]
fn compile_and_render_errors_are_chat_template_errors() {
    let err = ChatTemplate::new("{% for %}", None, None).expect_err("bad syntax");
    assert!(
        matches!(err, ModelError::ChatTemplate(ref m) if m.starts_with("compile")),
        "{err}"
    );
    let err = render(
        "{{ messages[0].content + 1 }}",
        &[json!({"role": "user", "content": "x"})],
        None,
    )
    .expect_err("type error");
    assert!(
        matches!(err, ModelError::ChatTemplate(ref m) if m.starts_with("render")),
        "{err}"
    );
}

#[test]
fn tojson_prints_like_python_json_dumps() {
    let extra = json!({"x": {"a": [1, 2.5, "é<>&'\n"], "b": null, "c": true, "d": {}}});
    let out = render("{{ x | tojson }}", &[], Some(extra.clone())).expect("render");
    assert_eq!(
        out,
        r#"{"a": [1, 2.5, "é<>&'\n"], "b": null, "c": true, "d": {}}"#
    );
    let out = render("{{ x.a | tojson(indent=2) }}", &[], Some(extra.clone())).expect("render");
    assert_eq!(out, "[\n  1,\n  2.5,\n  \"é<>&'\\n\"\n]");
    let out = render(
        "{{ x.a[2] | tojson(ensure_ascii=true) }}",
        &[],
        Some(extra.clone()),
    )
    .expect("render");
    assert_eq!(out, r#""\u00e9<>&'\n""#);
    let out = render("{{ x.d | tojson }}|{{ 3.0 | tojson }}", &[], Some(extra)).expect("render");
    assert_eq!(out, "{}|3.0");
}

#[test]
fn strftime_now_formats_the_current_date() {
    let out = render("{{ strftime_now('%Y-%m-%d') }}", &[], None).expect("render");
    assert_eq!(out.len(), 10, "{out}");
    assert!(out.starts_with("20"), "{out}");
    // 1_700_000_000 s = Tuesday 2023-11-14 22:13:20 UTC.
    let f = |fmt| super::functions::strftime(fmt, 1_700_000_000).expect("strftime");
    assert_eq!(f("%d %b %Y"), "14 Nov 2023");
    assert_eq!(
        f("%A %B %-d, %H:%M:%S %p %j %y"),
        "Tuesday November 14, 22:13:20 PM 318 23"
    );
    assert_eq!(
        super::functions::strftime("%Y-%m-%d", 951_782_400).expect("leap day"),
        "2000-02-29"
    );
    assert!(super::functions::strftime("%Q", 0).is_err());
}

#[test]
fn python_string_and_dict_methods() {
    let source = "{{ messages[0].content.strip() }}|{{ 'a,b,c'.split(',') | join('+') }}|\
        {% if messages[0].content.strip().startswith('hi') %}yes{% endif %}|\
        {{ 'Hello'.lower() }}{{ 'x'.upper() }}|{{ 'a-b'.replace('-', '_') }}|\
        {% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{{ d.get('missing', 'dflt') }}";
    let out = render(
        source,
        &[json!({"role": "user", "content": "  hi there \n"})],
        Some(json!({"d": {"k": 1}})),
    )
    .expect("render");
    assert_eq!(out, "hi there|a+b+c|yes|helloX|a_b|k=1;|dflt");
}

#[test]
fn loop_controls_and_trim_blocks() {
    let source = "{% for m in messages %}\n  {% if m.role == 'system' %}{% continue %}{% endif %}\n  {% if loop.index > 3 %}{% break %}{% endif %}\n{{ m.content }},\n{% endfor %}\n";
    let messages: Vec<Value> = ["system", "user", "assistant", "user", "assistant"]
        .iter()
        .enumerate()
        .map(|(i, r)| json!({"role": r, "content": format!("m{i}")}))
        .collect();
    // trim_blocks/lstrip_blocks drop the indentation and the newline after each tag, and the
    // template's final newline is dropped, as in Jinja2's defaults.
    assert_eq!(
        render(source, &messages, None).expect("render"),
        "m1,\nm2,\n"
    );
}

#[test]
fn bos_eos_variables_and_extra_kwargs() {
    let source = "{{ bos_token }}{% if enable_thinking is defined and not enable_thinking %}nothink{% endif %}{{ eos_token }}";
    let out = render(source, &[], Some(json!({"enable_thinking": false}))).expect("render");
    assert_eq!(out, "<s>nothink</s>");
    // Without BOS/EOS the variables are undefined and render as nothing.
    let tmpl = ChatTemplate::new(source, None, None).expect("compile");
    assert_eq!(tmpl.render(&[], None, false, None).expect("render"), "");
}

#[test]
fn generation_tags_render_their_body() {
    let source =
        "{% for m in messages %}{% generation %}{{ m.content }}{%- endgeneration %}{% endfor %}";
    let out = render(
        source,
        &[json!({"role": "assistant", "content": "a"})],
        None,
    )
    .expect("render");
    assert_eq!(out, "a");
}

/// A trimmed Qwen2.5 template: tools in the system prompt, assistant tool calls, tool results.
const QWEN_TOOLS: &str = r#"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

#[test]
fn qwen_style_template_with_tools() {
    // Keys are in alphabetical order at every level so the expected text does not depend on
    // whether serde_json keeps insertion order (its `preserve_order` feature).
    let tools = [json!({
        "function": {
            "description": "Get the weather",
            "name": "get_weather",
            "parameters": {
                "properties": {"city": {"description": "City name", "type": "string"}},
                "required": ["city"],
                "type": "object"
            }
        },
        "type": "function"
    })];
    let messages = [
        json!({"role": "user", "content": "Weather in Paris?"}),
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        ]}),
        json!({"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 20}"}),
        json!({"role": "tool", "tool_call_id": "call_2", "content": "sunny"}),
    ];
    let tmpl = ChatTemplate::new(QWEN_TOOLS, None, Some("<|im_end|>")).expect("compile");
    let out = tmpl
        .render(&messages, Some(&tools), true, None)
        .expect("render");
    let want = concat!(
        "<|im_start|>system\nYou are Qwen.\n\n# Tools\n\n<tools>\n",
        r#"{"function": {"description": "Get the weather", "name": "get_weather", "parameters": {"properties": {"city": {"description": "City name", "type": "string"}}, "required": ["city"], "type": "object"}}, "type": "function"}"#,
        "\n</tools><|im_end|>\n",
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n",
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n",
        "<|im_start|>user\n<tool_response>\n{\"temperature\": 20}\n</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>\n",
        "<|im_start|>assistant\n",
    );
    assert_eq!(out, want);
    // Without tools the system block is left out.
    let out = tmpl
        .render(&messages[..1], None, false, None)
        .expect("render");
    assert_eq!(out, "<|im_start|>user\nWeather in Paris?<|im_end|>\n");
}

#[test]
fn template_bos_is_not_doubled() {
    // A SentencePiece-style tokenizer that adds BOS (`<s>`) by default.
    let tok = tokenizer_from_metadata(&spm_metadata(None, None)).expect("tokenizer");
    assert!(tok.add_bos());
    let bos = tok.bos_id().expect("bos");
    let messages = [json!({"role": "user", "content": "hello"})];

    let with_bos = ChatTemplate::new(
        "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}",
        Some("<s>"),
        None,
    )
    .expect("compile");
    let rendered = with_bos
        .render(&messages, None, false, None)
        .expect("render");
    assert_eq!(rendered, "<s>hello");
    let ids = prompt_ids(&tok, &rendered).expect("encode");
    assert_eq!(ids.iter().filter(|&&i| i == bos).count(), 1, "{ids:?}");
    assert_eq!(ids[0], bos);

    // A template that does not write BOS still gets the model's one.
    let without = ChatTemplate::new(
        "{% for m in messages %}{{ m.content }}{% endfor %}",
        Some("<s>"),
        None,
    )
    .expect("compile");
    let rendered = without
        .render(&messages, None, false, None)
        .expect("render");
    assert_eq!(prompt_ids(&tok, &rendered).expect("encode"), ids);
}
