//! Turning checked rows into token ids with the position where the loss starts.

use kiln_model::chat_template::{ChatTemplate, prompt_ids};
use kiln_model::tokenizer::KilnTokenizer;
use serde_json::{Value, json};

use super::rows::Row;

/// One tokenized sequence and where its loss starts: the loss is on predicting
/// `tokens[prompt_len..]` (`prompt_len = 0` for `text`: every token after the first is a target).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftExample {
    /// The whole sequence, prompt then response.
    pub tokens: Vec<u32>,
    /// How many leading tokens are prompt (no loss on predicting them).
    pub prompt_len: usize,
}

impl SftExample {
    /// How many tokens the loss is on: those at positions `max(prompt_len, 1)..`, since the first
    /// token has nothing before it to be predicted from.
    pub fn n_targets(&self) -> usize {
        self.tokens.len().saturating_sub(self.prompt_len.max(1))
    }

    /// Keeps the first `max_len` tokens; says whether any were cut.
    fn truncate(&mut self, max_len: usize) -> bool {
        let cut = self.tokens.len() > max_len;
        self.tokens.truncate(max_len);
        cut
    }
}

/// A preference pair sharing one prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreferenceExample {
    /// The prompt and the preferred answer.
    pub chosen: SftExample,
    /// The prompt and the dispreferred answer.
    pub rejected: SftExample,
}

/// How to turn rows into tokens.
#[derive(Debug, Clone, Copy)]
pub struct Tokenize<'a> {
    /// The model's tokenizer.
    pub tokenizer: &'a KilnTokenizer,
    /// The model's chat template; the `messages` format needs one.
    pub template: Option<&'a ChatTemplate>,
    /// Sequences are cut to this many tokens.
    pub max_seq_length: usize,
}

/// What one row became, before truncation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tokenized {
    /// A `messages`, `prompt_completion` or `text` row.
    Sft(SftExample),
    /// A `preference` row.
    Preference(PreferenceExample),
}

impl Tokenized {
    /// Cuts every sequence to `max_len` tokens. Returns whether anything was cut and whether
    /// every sequence still has a loss token (a pair is only usable whole).
    pub(crate) fn truncate(&mut self, max_len: usize) -> (bool, bool) {
        match self {
            Tokenized::Sft(ex) => (ex.truncate(max_len), ex.n_targets() > 0),
            Tokenized::Preference(pair) => {
                let cut = pair.chosen.truncate(max_len) | pair.rejected.truncate(max_len);
                let usable = pair.chosen.n_targets() > 0 && pair.rejected.n_targets() > 0;
                (cut, usable)
            }
        }
    }
}

impl Tokenize<'_> {
    /// The tokens of one row (not yet truncated); the error says why it could not be tokenized.
    pub(crate) fn row(&self, row: &Row) -> Result<Tokenized, String> {
        Ok(match row {
            Row::Messages(turns) => Tokenized::Sft(self.chat(turns)?),
            Row::PromptCompletion { prompt, completion } => {
                Tokenized::Sft(self.prompt_completion(prompt, completion)?)
            }
            Row::Text(text) => Tokenized::Sft(self.text(text)?),
            Row::Preference {
                prompt,
                chosen,
                rejected,
            } => Tokenized::Preference(PreferenceExample {
                chosen: self.prompt_completion(prompt, chosen)?,
                rejected: self.prompt_completion(prompt, rejected)?,
            }),
        })
    }

    /// A conversation through the chat template: the prompt is everything before the final turn
    /// rendered with the generation prompt, the sequence the whole conversation.
    fn chat(&self, turns: &[Value]) -> Result<SftExample, String> {
        let template = self
            .template
            .ok_or("the model has no chat template, which the `messages` format needs")?;
        let earlier = turns.split_last().map_or(&[][..], |(_, rest)| rest);
        let render = |msgs: &[Value], generation: bool| {
            template
                .render(msgs, None, generation, None)
                .and_then(|text| prompt_ids(self.tokenizer, &text))
                .map_err(|e| e.to_string())
        };
        let prompt = render(earlier, true)?;
        let tokens = render(turns, false)?;
        // A template may render the earlier turns differently once a reply follows them (e.g.
        // dropping reasoning); the loss then starts where the two renderings part.
        let prompt_len = common_prefix(&prompt, &tokens);
        Ok(SftExample { tokens, prompt_len })
    }

    /// A prompt and its completion: as a two-turn chat with a template, else the prompt's ids
    /// (with BOS when the model adds one), the completion's, and EOS.
    fn prompt_completion(&self, prompt: &str, completion: &str) -> Result<SftExample, String> {
        if self.template.is_some() {
            let turns = [
                json!({"role": "user", "content": prompt}),
                json!({"role": "assistant", "content": completion}),
            ];
            return self.chat(&turns);
        }
        let tok = self.tokenizer;
        let mut tokens = tok
            .encode(prompt, tok.add_bos())
            .map_err(|e| e.to_string())?;
        let prompt_len = tokens.len();
        tokens.extend(tok.encode(completion, false).map_err(|e| e.to_string())?);
        self.end_with_eos(&mut tokens);
        Ok(SftExample { tokens, prompt_len })
    }

    /// Plain text: its ids with the model's special tokens, then EOS, all of it learned.
    fn text(&self, text: &str) -> Result<SftExample, String> {
        let mut tokens = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| e.to_string())?;
        self.end_with_eos(&mut tokens);
        Ok(SftExample {
            tokens,
            prompt_len: 0,
        })
    }

    /// Appends the primary EOS unless the sequence already ends generation, so the model learns
    /// to stop (and a text that spells its own EOS does not get two).
    fn end_with_eos(&self, tokens: &mut Vec<u32>) {
        let ends = tokens.last().is_some_and(|&t| self.tokenizer.is_eog(t));
        if let Some(&eos) = self.tokenizer.eos_ids().first()
            && !ends
        {
            tokens.push(eos);
        }
    }
}

/// How many leading ids `a` and `b` share.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(len: usize, prompt_len: usize) -> SftExample {
        SftExample {
            tokens: (0..len as u32).collect(),
            prompt_len,
        }
    }

    #[test]
    fn targets_start_after_the_prompt_and_never_at_the_first_token() {
        assert_eq!(ex(10, 4).n_targets(), 6);
        assert_eq!(ex(10, 0).n_targets(), 9);
        assert_eq!(ex(4, 4).n_targets(), 0);
        assert_eq!(ex(3, 7).n_targets(), 0);
        assert_eq!(ex(1, 0).n_targets(), 0);
    }

    #[test]
    fn truncation_keeps_the_head_and_reports_usability() {
        let mut t = Tokenized::Sft(ex(10, 4));
        assert_eq!(t.truncate(6), (true, true));
        assert_eq!(
            t,
            Tokenized::Sft(SftExample {
                tokens: (0..6).collect(),
                prompt_len: 4
            })
        );
        assert_eq!(t.truncate(6), (false, true));
        assert_eq!(t.truncate(4), (true, false));

        // A pair is dropped when either side loses its answer.
        let mut pair = Tokenized::Preference(PreferenceExample {
            chosen: ex(5, 3),
            rejected: ex(9, 3),
        });
        assert_eq!(pair.truncate(8), (true, true));
        assert_eq!(pair.truncate(3), (true, false));
    }

    #[test]
    fn common_prefix_stops_at_the_first_difference() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 3, 4]), 3);
        assert_eq!(common_prefix(&[1, 9, 3], &[1, 2, 3, 4]), 1);
        assert_eq!(common_prefix(&[], &[1]), 0);
    }
}
