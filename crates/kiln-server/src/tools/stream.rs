//! Streaming with tools: content before tool markup streams live; from the first marker on,
//! everything is withheld and parsed when generation ends.

use super::{ParsedOutput, ToolFormat, parse_tool_calls_as};

/// Decides which streamed text is safe to show as content.
#[derive(Debug)]
pub struct ToolStreamFilter {
    format: ToolFormat,
    text: String,
    emitted: usize,
    locked: bool,
}

impl Default for ToolStreamFilter {
    fn default() -> Self {
        Self::new(ToolFormat::Generic)
    }
}

impl ToolStreamFilter {
    /// A filter for calls written in `format`.
    pub fn new(format: ToolFormat) -> Self {
        Self {
            format,
            text: String::new(),
            emitted: 0,
            locked: false,
        }
    }

    /// Adds a piece; returns the content that can be shown now.
    pub fn push(&mut self, piece: &str) -> String {
        self.text.push_str(piece);
        if self.locked {
            return String::new();
        }
        let lead = self.text.trim_start();
        let bare = self.format.bare_json() && (lead.starts_with('{') || lead.starts_with('['));
        if self.emitted == 0 && (lead.is_empty() || bare) {
            // Leading whitespace, or possibly a bare JSON call (Llama 3): wait.
            if !lead.is_empty() {
                self.locked = true;
            }
            return String::new();
        }
        let markers = self.format.markers();
        if let Some(at) = markers.iter().filter_map(|m| self.text.find(m)).min() {
            self.locked = true;
            return self.release(at);
        }
        // Hold back a suffix that could still grow into a marker.
        let safe = self.text.len() - longest_marker_prefix_suffix(&self.text, markers);
        self.release(safe)
    }

    /// Shows text up to `upto`, less trailing whitespace: it is dropped if a call follows
    /// (as the whole-text parse drops it), and shown with the next text otherwise.
    fn release(&mut self, upto: usize) -> String {
        let upto = self.text[..upto].trim_end().len();
        if upto <= self.emitted {
            return String::new();
        }
        let s = self.text[self.emitted..upto].to_string();
        self.emitted = upto;
        s
    }

    /// Ends the stream: the parsed output (of the whole text) and the content not yet shown.
    pub fn finish(&mut self, full_text: &str) -> (ParsedOutput, String) {
        let parsed = parse_tool_calls_as(self.format, full_text);
        let rest = parsed
            .content
            .get(self.emitted..)
            .filter(|_| parsed.content.is_char_boundary(self.emitted))
            .unwrap_or("")
            .to_string();
        self.emitted = parsed.content.len().max(self.emitted);
        (parsed, rest)
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of some marker.
fn longest_marker_prefix_suffix(text: &str, markers: &[&str]) -> usize {
    let mut best = 0;
    for m in markers {
        for len in (1..m.len()).rev() {
            if len <= best {
                break;
            }
            if text.ends_with(&m[..len]) {
                best = len;
                break;
            }
        }
    }
    best
}
