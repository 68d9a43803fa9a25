//! The templates that write with the served model: style transfer, self-instruct, prompt
//! reconstruction, multi-turn chat, grounded Q&A and reasoning traces.

use serde_json::Value;

use super::llm::{ChatRequest, ask};
use super::local::parse_qa;
use super::output::{Row, message};
use super::{Gen, lines, paragraphs, sections};
use crate::LabError;

/// `style_transfer`: each paragraph of `raw_text` → its rewrite in the style of the samples.
pub fn style_transfer(g: &mut Gen) -> Result<Vec<Row>, LabError> {
    let samples = sections(g.inputs.text("reference_samples")).join("\n\n---\n\n");
    let system = "You rewrite text in the style of the samples you are given. Keep its meaning; \
                  change only the style. Answer with the rewritten text only.";
    let paras = paragraphs(g.inputs.text("raw_text"));
    let mut rows = Vec::new();
    for (i, para) in paras.iter().enumerate() {
        g.progress.step(i, paras.len(), "rewriting")?;
        let user = format!(
            "Samples of the style:\n\n{samples}\n\nRewrite this text in that style:\n\n{para}"
        );
        let out = ask(g.llm, Some(system), &user)?;
        push_nonempty(&mut rows, &out, |o| Row::prompt_completion(para, o));
    }
    Ok(rows)
}

/// `self_instruct`: `variants_per_seed` new instructions per seed (read from the model's
/// numbered or bulleted list), each then answered.
pub fn self_instruct(g: &mut Gen) -> Result<Vec<Row>, LabError> {
    let seeds = lines(g.inputs.text("seeds"));
    let n = g.inputs.number("variants_per_seed") as usize;
    let total = seeds.len() * (n + 1);
    let mut rows = Vec::new();
    for (i, seed) in seeds.iter().enumerate() {
        g.progress.step(i * (n + 1), total, "writing variants")?;
        let user = format!(
            "Write {n} new instructions of the same kind as this one, each different from it and \
             from each other:\n\n{seed}\n\nAnswer with a numbered list, one instruction per line."
        );
        let variants = list_items(&ask(g.llm, None, &user)?, n);
        for (j, v) in variants.iter().enumerate() {
            g.progress.step(i * (n + 1) + 1 + j, total, "answering")?;
            let answer = ask(g.llm, None, v)?;
            push_nonempty(&mut rows, &answer, |a| Row::chat(v, a));
        }
    }
    Ok(rows)
}

/// The items of a numbered (`1.`, `2)`) or bulleted (`-`, `*`, `•`) list, at most `n`; plain
/// non-empty lines when the text has no list.
pub fn list_items(text: &str, n: usize) -> Vec<String> {
    let marked: Vec<String> = text.lines().filter_map(strip_list_marker).collect();
    let items = if marked.is_empty() {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    } else {
        marked
    };
    items
        .into_iter()
        .filter(|s| !s.is_empty())
        .take(n)
        .collect()
}

fn strip_list_marker(line: &str) -> Option<String> {
    let t = line.trim();
    let rest = if let Some(r) = t.strip_prefix(['-', '*', '•']) {
        r
    } else {
        let digits = t.len() - t.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let r = t[digits..].strip_prefix(['.', ')', ':'])?;
        if digits == 0 {
            return None;
        }
        r
    };
    Some(rest.trim().trim_matches('*').trim().to_string())
}

/// `prompt_reconstruction`: for each target paragraph, the request that would produce it.
pub fn prompt_reconstruction(g: &mut Gen) -> Result<Vec<Row>, LabError> {
    let mut guide = format!("It is written in a {} style", g.inputs.text("style"));
    for (key, what) in [
        ("tone", "its tone is"),
        ("preserve", "keep"),
        ("avoid", "avoid"),
    ] {
        let v = g.inputs.text(key).trim();
        if !v.is_empty() {
            guide.push_str(&format!("; {what} {v}"));
        }
    }
    let paras = paragraphs(g.inputs.text("target_text"));
    let mut rows = Vec::new();
    for (i, para) in paras.iter().enumerate() {
        g.progress.step(i, paras.len(), "reconstructing prompts")?;
        let user = format!(
            "Here is a piece of writing. {guide}.\n\n{para}\n\nWrite the one request a user would \
             give an assistant to get exactly this text back. Answer with the request only."
        );
        let prompt = ask(g.llm, None, &user)?;
        push_nonempty(&mut rows, &prompt, |p| Row::chat(p, para));
    }
    Ok(rows)
}

/// `multi_turn_chat`: from each seed, `turns` assistant turns with the simulated user's
/// replies between them; the assistant speaks under `persona`.
pub fn multi_turn_chat(g: &mut Gen) -> Result<Vec<Row>, LabError> {
    let seeds = lines(g.inputs.text("seeds"));
    let turns = (g.inputs.number("turns") as usize).max(1);
    let persona = g.inputs.text("persona").to_string();
    let user_persona = match g.inputs.text("user_persona").trim() {
        "" => "You are a curious person chatting with an assistant.".to_string(),
        p => p.to_string(),
    };
    let per_seed = 2 * turns - 1;
    let mut rows = Vec::new();
    for (i, seed) in seeds.iter().enumerate() {
        let mut chat = vec![message("user", seed)];
        for t in 0..turns {
            g.progress.step(
                i * per_seed + 2 * t,
                seeds.len() * per_seed,
                "assistant turn",
            )?;
            chat.push(message("assistant", &reply(g, &persona, &chat, false)?));
            if t + 1 < turns {
                g.progress.step(
                    i * per_seed + 2 * t + 1,
                    seeds.len() * per_seed,
                    "user turn",
                )?;
                chat.push(message("user", &reply(g, &user_persona, &chat, true)?));
            }
        }
        if chat
            .iter()
            .all(|m| m["content"].as_str().is_some_and(|c| !c.is_empty()))
        {
            let mut messages = vec![message("system", &persona)];
            messages.extend(chat);
            rows.push(Row::messages(messages));
        }
    }
    Ok(rows)
}

/// The next turn of `chat`: the assistant's, or (`as_user`) the simulated user's, who sees
/// the conversation with the roles swapped.
fn reply(g: &mut Gen, system: &str, chat: &[Value], as_user: bool) -> Result<String, LabError> {
    let mut messages = Vec::new();
    if !system.trim().is_empty() {
        let sys = if as_user {
            format!("{system} Write only your next message to the assistant.")
        } else {
            system.to_string()
        };
        messages.push(message("system", &sys));
    }
    for m in chat {
        let role = m["role"].as_str().unwrap_or("user");
        let role = match (as_user, role) {
            (true, "user") => "assistant",
            (true, _) => "user",
            (false, r) => r,
        };
        messages.push(message(role, m["content"].as_str().unwrap_or("")));
    }
    Ok(g.llm
        .chat(&ChatRequest {
            messages,
            tools: None,
        })?
        .content)
}

/// `rag_qa`: each document cut into chunks of at least `min_chunk_chars`, and
/// `questions_per_chunk` Q/A pairs per chunk, answered from the chunk.
pub fn rag_qa(g: &mut Gen) -> Result<Vec<Row>, LabError> {
    let min = g.inputs.number("min_chunk_chars") as usize;
    let k = g.inputs.number("questions_per_chunk") as usize;
    let chunks: Vec<String> = sections(g.inputs.text("documents"))
        .iter()
        .flat_map(|d| chunk(d, min))
        .collect();
    let mut rows = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        g.progress.step(i, chunks.len(), "writing questions")?;
        let user = format!(
            "Write {k} questions that this text answers, each followed by its answer, using only \
             facts from the text. Format each pair as\nQ: the question\nA: the answer\n\nText:\n{c}"
        );
        for (q, a) in parse_qa(&ask(g.llm, None, &user)?).into_iter().take(k) {
            let prompt = format!("Context:\n{c}\n\nQuestion: {q}");
            rows.push(Row::chat(&prompt, &a));
        }
    }
    Ok(rows)
}

/// Paragraphs of `doc` joined until each chunk has `min` characters; a short remainder joins
/// the chunk before it, and a document shorter than `min` is one chunk.
pub fn chunk(doc: &str, min: usize) -> Vec<String> {
    let mut chunks: Vec<String> = Vec::new();
    let mut cur = String::new();
    // A running count: recounting the chunk per paragraph is quadratic on hostile input.
    let mut cur_chars = 0;
    for p in paragraphs(doc) {
        if !cur.is_empty() {
            cur.push_str("\n\n");
            cur_chars += 2;
        }
        cur.push_str(&p);
        cur_chars += p.chars().count();
        if cur_chars >= min {
            chunks.push(std::mem::take(&mut cur));
            cur_chars = 0;
        }
    }
    match chunks.last_mut() {
        Some(last) if !cur.is_empty() => {
            last.push_str("\n\n");
            last.push_str(&cur);
        }
        None if !cur.is_empty() => chunks.push(cur),
        _ => {}
    }
    chunks
}

/// `cot_synthesis`: each question answered with its reasoning, then a final answer line.
pub fn cot_synthesis(g: &mut Gen) -> Result<Vec<Row>, LabError> {
    let mut system = "Think step by step. Write your reasoning, then finish with a line \
                      `Answer: …`."
        .to_string();
    let category = g.inputs.text("category").trim();
    if !category.is_empty() {
        system = format!("The questions are about {category}. {system}");
    }
    let questions = lines(g.inputs.text("questions"));
    let mut rows = Vec::new();
    for (i, q) in questions.iter().enumerate() {
        g.progress.step(i, questions.len(), "reasoning")?;
        let out = ask(g.llm, Some(&system), q)?;
        push_nonempty(&mut rows, &out, |o| Row::chat(q, o));
    }
    Ok(rows)
}

/// Pushes `make(text)` unless the model answered nothing.
pub(super) fn push_nonempty(rows: &mut Vec<Row>, text: &str, make: impl FnOnce(&str) -> Row) {
    if !text.trim().is_empty() {
        rows.push(make(text.trim()));
    }
}
