use super::*;

fn ids() -> impl FnMut() -> String {
    let mut n = 0;
    move || {
        n += 1;
        format!("call_{n}")
    }
}

fn streamed(shape: TurnShape, pieces: &[&str]) -> (String, String, Turn) {
    let mut b = TurnBuilder::new(shape);
    let mut deltas = Vec::new();
    for p in pieces {
        deltas.extend(b.push(p));
    }
    let (tail, turn) = b.finish(ids());
    deltas.extend(tail);
    let (mut r, mut c) = (String::new(), String::new());
    for d in deltas {
        match d {
            Delta::Reasoning(t) => r.push_str(&t),
            Delta::Content(t) => c.push_str(&t),
        }
    }
    (r, c, turn)
}

#[test]
fn stream_and_whole_agree() {
    let hermes = TurnShape {
        thinking_open: false,
        tools: Some(ToolFormat::Hermes),
        max_calls: None,
    };
    let plain = TurnShape {
        thinking_open: false,
        tools: None,
        max_calls: None,
    };
    let cases: &[(TurnShape, &[&str])] = &[
        (plain, &["Hel", "lo"]),
        (plain, &["<think>", "hm", "</think>\n", "Yes"]),
        (
            hermes,
            &[
                "Sure. ",
                "<tool_",
                "call>\n{\"name\": \"f\", ",
                "\"arguments\": {\"x\": 1}}\n</tool_call>",
            ],
        ),
        (hermes, &["no call, just <tool text"]),
    ];
    for (shape, pieces) in cases {
        let whole = TurnBuilder::whole(*shape, &pieces.concat(), ids());
        let (r, c, turn) = streamed(*shape, pieces);
        assert_eq!(turn, whole, "{pieces:?}");
        assert_eq!(r, whole.reasoning);
        assert_eq!(c, whole.content, "{pieces:?}");
    }
    let call = TurnBuilder::whole(hermes, &cases[2].1.concat(), ids());
    assert_eq!(call.content, "Sure.");
    assert_eq!(call.calls[0].name, "f");
    assert_eq!(call.calls[0].arguments, r#"{"x":1}"#);
    assert_eq!(call.calls[0].id, "call_1");
}

#[test]
fn only_the_models_own_markup_is_a_call() {
    let mistral = TurnShape {
        thinking_open: false,
        tools: Some(ToolFormat::Mistral),
        max_calls: None,
    };
    let text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
    let t = TurnBuilder::whole(mistral, text, ids());
    assert!(t.calls.is_empty());
    assert_eq!(t.content, text);
}
