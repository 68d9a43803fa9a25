//! The templates whose rows record actions: tool-use traces with mocked results, and code
//! checked by running its own asserts.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use super::llm::{ChatRequest, ask};
use super::output::{Row, message};
use super::synth::push_nonempty;
use super::{Gen, lines};
use crate::LabError;

/// Tool rounds per scenario before the trace is given up.
const MAX_TOOL_ROUNDS: usize = 4;

/// `tool_use_traces`: each scenario asked with the tools; every call the model makes gets
/// its mocked result as a `tool` message, until it answers in words. Traces that never reach
/// an answer are dropped (a warning says how many).
pub fn tool_use_traces(g: &mut Gen) -> Result<Vec<Row>, LabError> {
    let tools = parse_tools(g.inputs.text("tools_json"))?;
    let mocks = parse_mocks(g.inputs.text("mock_results"))?;
    let scenarios = lines(g.inputs.text("scenarios"));
    let (mut rows, mut dropped) = (Vec::new(), 0);
    for (i, scenario) in scenarios.iter().enumerate() {
        g.progress.step(i, scenarios.len(), "tracing")?;
        match trace(g, &tools, &mocks, scenario)? {
            Some(messages) => rows.push(Row::messages(messages).with("tools", tools.clone())),
            None => dropped += 1,
        }
    }
    if dropped > 0 {
        g.progress.warn(&format!(
            "{dropped} scenario(s) dropped: no answer after {MAX_TOOL_ROUNDS} tool rounds"
        ));
    }
    Ok(rows)
}

fn trace(
    g: &mut Gen,
    tools: &Value,
    mocks: &Map<String, Value>,
    scenario: &str,
) -> Result<Option<Vec<Value>>, LabError> {
    let mut messages = vec![message("user", scenario)];
    for _ in 0..MAX_TOOL_ROUNDS {
        let req = ChatRequest {
            messages: messages.clone(),
            tools: Some(tools.clone()),
        };
        let reply = g.llm.chat(&req)?;
        if reply.tool_calls.is_empty() {
            if reply.content.is_empty() {
                return Ok(None);
            }
            messages.push(message("assistant", &reply.content));
            return Ok(Some(messages));
        }
        messages.push(
            json!({"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls}),
        );
        for call in &reply.tool_calls {
            let name = call["function"]["name"].as_str().unwrap_or("");
            let result = match mocks.get(name) {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => json!({"ok": true, "result": format!("{name} completed")}).to_string(),
            };
            messages.push(json!({
                "role": "tool",
                "tool_call_id": call["id"].as_str().unwrap_or(""),
                "name": name,
                "content": result,
            }));
        }
    }
    Ok(None)
}

/// `tools_json` and `mock_results` parse.
pub(super) fn check_inputs(inputs: &super::Inputs) -> Result<(), LabError> {
    parse_tools(inputs.text("tools_json"))?;
    parse_mocks(inputs.text("mock_results")).map(|_| ())
}

/// A non-empty JSON array of OpenAI function tools.
fn parse_tools(text: &str) -> Result<Value, LabError> {
    let field = "inputs.tools_json";
    let tools: Value = serde_json::from_str(text)
        .map_err(|e| LabError::config(field, format!("not valid JSON: {e}")))?;
    let list = tools
        .as_array()
        .filter(|a| !a.is_empty())
        .ok_or_else(|| LabError::config(field, "must be a non-empty JSON array of tools"))?;
    for (i, t) in list.iter().enumerate() {
        if !t["function"]["name"].is_string() {
            return Err(LabError::config(
                field,
                format!(
                    "tool {i} has no function.name (OpenAI form: {{\"type\":\"function\",\"function\":{{\"name\":…}}}})"
                ),
            ));
        }
    }
    Ok(tools)
}

/// A JSON object of tool name → result, or nothing.
fn parse_mocks(text: &str) -> Result<Map<String, Value>, LabError> {
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str(text) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(LabError::config(
            "inputs.mock_results",
            "must be a JSON object of tool name → result",
        )),
    }
}

/// Longest a generated program may run.
const VERIFY_TIMEOUT: Duration = Duration::from_secs(10);

/// `verified_code`: each spec answered with code ending in three asserts. Python answers run
/// under `python3` (in an empty folder, no stdin, 10 s): ones that have a module-level
/// `assert` and exit 0 are kept with `verified: true`, the rest dropped. Without `python3`, or for other languages, rows are
/// kept with `verified: false`.
pub fn verified_code(g: &mut Gen) -> Result<Vec<Row>, LabError> {
    let language = g.inputs.text("language").trim().to_lowercase();
    let python = language == "python" && python3_available();
    if language == "python" && !python {
        g.progress
            .warn("python3 not found: rows are kept unverified (verified: false)");
    }
    let system = format!(
        "You write {language} code. Answer with one fenced code block that defines what is asked \
         and ends with three module-level assert statements that test it."
    );
    let specs = lines(g.inputs.text("specs"));
    let (mut rows, mut failed) = (Vec::new(), 0);
    for (i, spec) in specs.iter().enumerate() {
        g.progress.step(i, specs.len(), "writing code")?;
        let code = code_block(&ask(g.llm, Some(&system), spec)?);
        let verified = python && has_module_assert(&code) && run_python(&code, VERIFY_TIMEOUT);
        if python && !verified {
            failed += 1;
            continue;
        }
        let answer = format!("```{language}\n{}\n```", code.trim_end());
        push_nonempty(&mut rows, &code, |_| {
            Row::chat(spec, &answer).with("verified", Value::Bool(verified))
        });
    }
    if failed > 0 {
        g.progress.warn(&format!(
            "{failed} answer(s) dropped: no module-level assert, or the asserts failed"
        ));
    }
    Ok(rows)
}

/// Whether a line of `code` is a module-level `assert` (code without one proves nothing).
fn has_module_assert(code: &str) -> bool {
    code.lines()
        .any(|l| l.starts_with("assert ") || l.starts_with("assert("))
}

/// The first fenced block's body, or the whole text when there is none.
pub fn code_block(text: &str) -> String {
    let Some(start) = text.find("```") else {
        return text.trim().to_string();
    };
    let after = &text[start + 3..];
    let body = after.split_once('\n').map_or("", |(_, b)| b);
    body.split("```").next().unwrap_or(body).to_string()
}

fn python3_available() -> bool {
    Command::new("python3")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether `code` exits 0 under `python3 -I -c` within `timeout`.
fn run_python(code: &str, timeout: Duration) -> bool {
    let Ok(dir) = tempfile::tempdir() else {
        return false;
    };
    let child = Command::new("python3")
        .arg("-I")
        .arg("-c")
        .arg(code)
        .current_dir(dir.path())
        // The model's code gets no secrets of the server (API key, HF token): only PATH.
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut child) = child else { return false };
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status.success(),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_blocks_are_taken_from_fences() {
        assert_eq!(code_block("x\n```python\nprint(1)\n```\ny"), "print(1)\n");
        assert_eq!(code_block("print(2)"), "print(2)");
    }

    #[test]
    fn python_verification_runs_the_asserts() {
        if !python3_available() {
            return;
        }
        let t = Duration::from_secs(5);
        assert!(run_python(
            "def f(x):\n    return x + 1\nassert f(1) == 2\n",
            t
        ));
        assert!(!run_python("assert 1 == 2\n", t));
        assert!(has_module_assert(
            "def f():\n    assert x\nassert f() is None\n"
        ));
        assert!(!has_module_assert("def f():\n    assert x\n"));
        let started = Instant::now();
        assert!(!run_python(
            "import time\ntime.sleep(30)\n",
            Duration::from_millis(300)
        ));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a hung program is killed"
        );
    }
}
