//! Chat templates: the Jinja templates shipped with models (GGUF `tokenizer.chat_template`,
//! `tokenizer_config.json`), rendered with minijinja set up to behave like Hugging Face's
//! `apply_chat_template` environment.
//!
//! **BOS rule**: many templates write `{{ bos_token }}` themselves. [`prompt_ids`] encodes a
//! rendered prompt with `add_special = false` when the text already starts with the BOS string,
//! and with `add_special = true` otherwise (so BOS is added when the model wants one and the
//! template did not write it). Either way the prompt starts with at most one BOS, as in
//! llama.cpp's server.

mod functions;
mod value;

#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::collections::BTreeMap;

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Value};

use crate::ModelError;
use crate::gguf::GgufHeader;
use crate::tokenizer::KilnTokenizer;

/// The template's name inside its environment (no `.html`, so nothing is auto-escaped).
const NAME: &str = "chat_template";

/// A compiled chat template with the model's BOS/EOS strings.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: std::sync::Arc<str>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatTemplate {
    /// Compiles `source`. `bos_token`/`eos_token` become the template variables of those names
    /// (left undefined when `None`, as Hugging Face does for a tokenizer without them).
    pub fn new(
        source: &str,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Self, ModelError> {
        let mut env = Environment::new();
        // Hugging Face: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ModelError::ChatTemplate(format!("syntax: {e}")))?;
        env.set_syntax(syntax);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", functions::raise_exception);
        env.add_function("strftime_now", functions::strftime_now);
        env.add_filter("tojson", functions::tojson);
        env.add_template_owned(NAME, rewrite_generation_tags(source).into_owned())
            .map_err(|e| ModelError::ChatTemplate(format!("compile: {e}")))?;
        Ok(Self {
            env,
            source: source.into(),
            bos_token: bos_token.map(str::to_string),
            eos_token: eos_token.map(str::to_string),
        })
    }

    /// The template's source (to read which tool-call markup the model uses).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The GGUF's `tokenizer.chat_template` with the tokenizer's BOS/EOS, or `None` if the file
    /// has no template.
    pub fn from_gguf(
        header: &GgufHeader,
        tokenizer: &KilnTokenizer,
    ) -> Result<Option<Self>, ModelError> {
        let Some(source) = header
            .get("tokenizer.chat_template")
            .and_then(|v| v.as_str())
        else {
            return Ok(None);
        };
        let (bos, eos) = (tokenizer.bos_token(), tokenizer.eos_token());
        Self::new(source, bos.as_deref(), eos.as_deref()).map(Some)
    }

    /// Renders a conversation. `messages` are OpenAI-style objects (`role`, `content`, and
    /// `tool_calls` / `tool_call_id` / `name` where used); `tools` are the tool schemas;
    /// `extra` adds template variables (`enable_thinking`, `documents`, …).
    pub fn render(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        extra: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String, ModelError> {
        let mut ctx: Vec<(String, Value)> = Vec::new();
        if let Some(extra) = extra {
            ctx.extend(extra.iter().map(|(k, v)| (k.clone(), value::from_json(v))));
        }
        let has = |ctx: &[(String, Value)], key: &str| ctx.iter().any(|(k, _)| k == key);
        // Hugging Face passes documents=None when none are given; templates test `documents`.
        if !has(&ctx, "documents") {
            ctx.push(("documents".into(), Value::from(())));
        }
        let msgs: Vec<Value> = messages.iter().map(value::from_json).collect();
        let tools = match tools {
            Some(t) => Value::from(t.iter().map(value::from_json).collect::<Vec<_>>()),
            None => Value::from(()),
        };
        // The fixed variables win over `extra` keys of the same name.
        ctx.retain(|(k, _)| !matches!(k.as_str(), "messages" | "tools" | "add_generation_prompt"));
        ctx.push(("messages".into(), Value::from(msgs)));
        ctx.push(("tools".into(), tools));
        ctx.push((
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        ));
        for (key, tok) in [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
        ] {
            if let Some(t) = tok
                && !has(&ctx, key)
            {
                ctx.push((key.into(), Value::from(t.as_str())));
            }
        }
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| ModelError::ChatTemplate(e.to_string()))?;
        let ctx: BTreeMap<String, Value> = ctx.into_iter().collect();
        template.render(Value::from(ctx)).map_err(render_error)
    }
}

/// Token ids of a rendered chat prompt, with at most one BOS (see the module's BOS rule).
pub fn prompt_ids(tokenizer: &KilnTokenizer, rendered: &str) -> Result<Vec<u32>, ModelError> {
    let has_bos = tokenizer
        .bos_token()
        .is_some_and(|b| !b.is_empty() && rendered.starts_with(b.as_str()));
    tokenizer.encode(rendered, !has_bos)
}

/// A render error: a template's own `raise_exception` message as is, anything else with the
/// template location minijinja gives.
fn render_error(err: minijinja::Error) -> ModelError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<functions::Raised>() {
            return ModelError::ChatTemplate(raised.0.clone());
        }
        source = e.source();
    }
    ModelError::ChatTemplate(format!("render: {err}"))
}

/// Hugging Face's `{% generation %}…{% endgeneration %}` (which marks assistant text for
/// training masks) is not Jinja; it renders its body, so it becomes `{% if true %}…{% endif %}`,
/// keeping any `-`/`+` whitespace markers.
fn rewrite_generation_tags(source: &str) -> Cow<'_, str> {
    if !source.contains("generation") {
        return Cow::Borrowed(source);
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let Some(len) = rest[start..].find("%}") else {
            break;
        };
        let tag = &rest[start..start + len + 2];
        let inner = &tag[2..tag.len() - 2];
        let body = inner
            .trim_start_matches(['-', '+'])
            .trim_end_matches(['-', '+'])
            .trim();
        out.push_str(&rest[..start]);
        match body {
            "generation" | "endgeneration" => {
                let keyword = if body == "generation" {
                    "if true"
                } else {
                    "endif"
                };
                let lead = &inner[..inner.len() - inner.trim_start_matches(['-', '+']).len()];
                let trail = &inner[inner.trim_end_matches(['-', '+']).len()..];
                out.push_str(&format!("{{%{lead} {keyword} {trail}%}}"));
            }
            _ => out.push_str(tag),
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}
