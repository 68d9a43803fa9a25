//! Think-tag reasoning (spec §12.1): text inside `<think>…</think>` at the start of an answer
//! (or after a prompt that already opened `<think>`) is reasoning, reported apart from content
//! and never mixed into it. Streams hold back only what could still be the closing tag.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// A piece of classified output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Reasoning text.
    Reasoning(String),
    /// Answer text.
    Content(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Not yet known whether the answer opens with `<think>`.
    Undecided,
    Reasoning,
    Content,
}

/// Splits streamed text into reasoning and content.
#[derive(Debug)]
pub struct ThinkSplitter {
    mode: Mode,
    held: String,
    content: String,
    /// Whether answer text has begun; until then, newlines after `</think>` are dropped.
    content_started: bool,
}

impl ThinkSplitter {
    /// A splitter; `prompt_opened` when the rendered prompt ends inside `<think>`.
    pub fn new(prompt_opened: bool) -> Self {
        Self {
            mode: if prompt_opened {
                Mode::Reasoning
            } else {
                Mode::Undecided
            },
            held: String::new(),
            content: String::new(),
            content_started: false,
        }
    }

    /// Whether a rendered prompt leaves the model inside an open `<think>`.
    pub fn prompt_opens(rendered: &str) -> bool {
        let t = rendered.trim_end();
        t.ends_with(OPEN) || t.rfind(OPEN).is_some_and(|o| !t[o..].contains(CLOSE))
    }

    /// All content so far (for tool-call parsing at the end).
    pub fn content(&self) -> &str {
        &self.content
    }

    fn content_piece(&mut self, mut s: String, out: &mut Vec<Piece>) {
        if !self.content_started {
            s = s.trim_start_matches(['\n', '\r']).to_string();
            if s.is_empty() {
                return;
            }
            self.content_started = true;
        }
        self.content.push_str(&s);
        out.push(Piece::Content(s));
    }

    /// Adds text; returns what can be shown now.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.mode {
                Mode::Undecided => {
                    let lead = self.held.trim_start();
                    if let Some(rest) = lead.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.mode = Mode::Reasoning;
                    } else if OPEN.starts_with(lead) {
                        return out; // could still become `<think>`
                    } else {
                        // No reasoning: the answer is kept exactly, leading newlines included.
                        self.mode = Mode::Content;
                        self.content_started = true;
                    }
                }
                Mode::Reasoning => {
                    if let Some(at) = self.held.find(CLOSE) {
                        let r = self.held[..at].to_string();
                        self.held = self.held[at + CLOSE.len()..].to_string();
                        if !r.is_empty() {
                            out.push(Piece::Reasoning(r));
                        }
                        self.mode = Mode::Content;
                        continue;
                    }
                    let keep = (1..CLOSE.len())
                        .rev()
                        .find(|&n| self.held.ends_with(&CLOSE[..n]))
                        .unwrap_or(0);
                    let cut = self.held.len() - keep;
                    if cut > 0 {
                        let r: String = self.held.drain(..cut).collect();
                        out.push(Piece::Reasoning(r));
                    }
                    return out;
                }
                Mode::Content => {
                    let s = std::mem::take(&mut self.held);
                    if !s.is_empty() {
                        self.content_piece(s, &mut out);
                    }
                    return out;
                }
            }
        }
    }

    /// Ends the stream: whatever was held back.
    pub fn finish(&mut self) -> Vec<Piece> {
        let s = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.mode {
            Mode::Reasoning if !s.is_empty() => out.push(Piece::Reasoning(s)),
            Mode::Reasoning => {}
            _ if !s.is_empty() => {
                if self.mode == Mode::Undecided {
                    self.content_started = true;
                }
                self.content_piece(s, &mut out)
            }
            _ => {}
        }
        out
    }
}

/// `(reasoning, content)` of a whole answer.
pub fn split(text: &str, prompt_opened: bool) -> (String, String) {
    let mut s = ThinkSplitter::new(prompt_opened);
    let mut pieces = s.push(text);
    pieces.extend(s.finish());
    let reasoning = pieces
        .iter()
        .filter_map(|p| match p {
            Piece::Reasoning(r) => Some(r.as_str()),
            Piece::Content(_) => None,
        })
        .collect::<String>();
    (reasoning, s.content().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_answers() {
        assert_eq!(
            split("<think>\nhm\n</think>\n\nHi", false),
            ("\nhm\n".into(), "Hi".into())
        );
        assert_eq!(split("hm</think>Hi", true), ("hm".into(), "Hi".into()));
        assert_eq!(
            split("Hi <think>", false),
            (String::new(), "Hi <think>".into())
        );
        assert_eq!(split("<thin", false), (String::new(), "<thin".into()));
        assert_eq!(split("\n\nHi", false), (String::new(), "\n\nHi".into()));
        assert_eq!(split("  ", false), (String::new(), "  ".into()));
        assert_eq!(
            split("<think>unfinished", false),
            ("unfinished".into(), String::new())
        );
    }

    #[test]
    fn streamed_pieces_never_leak_tags() {
        let mut s = ThinkSplitter::new(false);
        let mut all = Vec::new();
        for p in ["<th", "ink>a", "b</th", "ink>\n", "An", "swer"] {
            all.extend(s.push(p));
        }
        all.extend(s.finish());
        let text: String = all
            .iter()
            .map(|p| match p {
                Piece::Reasoning(r) => format!("R[{r}]"),
                Piece::Content(c) => format!("C[{c}]"),
            })
            .collect();
        assert_eq!(text, "R[a]R[b]C[An]C[swer]");
    }

    #[test]
    fn prompt_detection() {
        assert!(ThinkSplitter::prompt_opens(
            "<|im_start|>assistant\n<think>\n"
        ));
        assert!(!ThinkSplitter::prompt_opens(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        assert!(!ThinkSplitter::prompt_opens("<|im_start|>assistant\n"));
    }
}
