//! Stop-string matching on decoded text with hold-back (spec §3.1 "Stop semantics").
//!
//! Text that could still turn into a stop string is withheld until it is ruled out, so no part
//! of a stop string ever reaches the client. Matching uses an Aho–Corasick automaton over the
//! stop strings' bytes: its state after any input is exactly the longest suffix of the text that
//! is a prefix of some stop, which is both the hold-back length and the match detector. Each
//! pushed byte costs amortised O(1) regardless of how many stop strings there are.

use thiserror::Error;

/// Errors from building a [`StopMatcher`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StopError {
    /// An empty stop string would match everywhere; the API drops these before this point.
    #[error("stop string {index} is empty")]
    Empty {
        /// Position of the empty string in the list.
        index: usize,
    },
}

/// What one [`StopMatcher::push`] releases.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopOutput {
    /// Text that is now safe to send: it can no longer be part of a stop string.
    pub emit: String,
    /// Index (into the list given to [`StopMatcher::new`]) of the stop string that matched;
    /// once set, generation should end and later pushes emit nothing.
    pub stopped: Option<usize>,
}

#[derive(Debug, Clone)]
struct Node {
    /// Outgoing edges sorted by byte, for binary search.
    next: Vec<(u8, u32)>,
    /// Longest proper suffix of this node's string that is also a trie node.
    fail: u32,
    /// Length in bytes of this node's string.
    depth: u32,
    /// Longest stop string that is a suffix of this node's string: `(length, stop index)`.
    /// The longest one starts earliest, which is what the earliest-match rule needs.
    best: Option<(u32, u32)>,
}

impl Node {
    fn new(depth: u32) -> Self {
        Self {
            next: Vec::new(),
            fail: 0,
            depth,
            best: None,
        }
    }

    fn child(&self, b: u8) -> Option<u32> {
        self.next
            .binary_search_by_key(&b, |&(k, _)| k)
            .ok()
            .map(|i| self.next[i].1)
    }
}

/// Streams decoded text through a set of stop strings.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    nodes: Vec<Node>,
    state: u32,
    /// Text withheld so far: always the string of `state`, i.e. its last `depth` bytes.
    pending: String,
    stopped: Option<usize>,
}

impl StopMatcher {
    /// Rejects stop lists the matcher cannot honour (currently: empty strings).
    pub fn validate(stops: &[String]) -> Result<(), StopError> {
        match stops.iter().position(|s| s.is_empty()) {
            Some(index) => Err(StopError::Empty { index }),
            None => Ok(()),
        }
    }

    /// Builds the matcher; an empty list passes all text straight through.
    pub fn new(stops: Vec<String>) -> Result<Self, StopError> {
        Self::validate(&stops)?;
        let mut nodes = vec![Node::new(0)];
        for (si, s) in stops.iter().enumerate() {
            let mut cur = 0usize;
            for &b in s.as_bytes() {
                cur = match nodes[cur].child(b) {
                    Some(n) => n as usize,
                    None => {
                        let id = nodes.len() as u32;
                        let depth = nodes[cur].depth + 1;
                        nodes.push(Node::new(depth));
                        let pos = nodes[cur].next.partition_point(|&(k, _)| k < b);
                        nodes[cur].next.insert(pos, (b, id));
                        id as usize
                    }
                };
            }
            // A duplicate keeps the first index so `stopped` is stable.
            if nodes[cur].best.is_none() {
                nodes[cur].best = Some((nodes[cur].depth, si as u32));
            }
        }
        // Breadth-first so every node's fail target is finished before the node itself.
        let mut queue = std::collections::VecDeque::new();
        let root_children: Vec<u32> = nodes[0].next.iter().map(|&(_, n)| n).collect();
        queue.extend(root_children);
        while let Some(u) = queue.pop_front() {
            let u = u as usize;
            if nodes[u].best.is_none() {
                nodes[u].best = nodes[nodes[u].fail as usize].best;
            }
            let edges = nodes[u].next.clone();
            for (b, v) in edges {
                let mut f = nodes[u].fail;
                let fail = loop {
                    if let Some(n) = nodes[f as usize].child(b) {
                        // The root's own children fail to the root, never to themselves.
                        break if n == v { 0 } else { n };
                    }
                    if f == 0 {
                        break 0;
                    }
                    f = nodes[f as usize].fail;
                };
                nodes[v as usize].fail = fail;
                queue.push_back(v);
            }
        }
        Ok(Self {
            nodes,
            state: 0,
            pending: String::new(),
            stopped: None,
        })
    }

    fn step(&self, mut s: u32, b: u8) -> u32 {
        loop {
            if let Some(n) = self.nodes[s as usize].child(b) {
                return n;
            }
            if s == 0 {
                return 0;
            }
            s = self.nodes[s as usize].fail;
        }
    }

    /// Feeds newly decoded text; returns what can be sent and whether a stop string matched.
    ///
    /// When several stop strings complete within this push, the one that starts earliest wins
    /// (ties go to the one that completes first). The stop text and anything after it are
    /// dropped.
    pub fn push(&mut self, new_text: &str) -> StopOutput {
        if self.stopped.is_some() {
            return StopOutput {
                emit: String::new(),
                stopped: self.stopped,
            };
        }
        let base = self.pending.len();
        self.pending.push_str(new_text);
        let mut state = self.state;
        let mut hit: Option<(usize, usize)> = None;
        for (i, &b) in new_text.as_bytes().iter().enumerate() {
            state = self.step(state, b);
            if let Some((len, si)) = self.nodes[state as usize].best {
                let start = base + i + 1 - len as usize;
                if hit.is_none_or(|(s, _)| start < s) {
                    hit = Some((start, si as usize));
                }
            }
        }
        if let Some((start, si)) = hit {
            // A match starts on a stop string's first byte, which is never a UTF-8
            // continuation byte, so `start` is a char boundary.
            self.pending.truncate(start);
            self.stopped = Some(si);
            return StopOutput {
                emit: std::mem::take(&mut self.pending),
                stopped: Some(si),
            };
        }
        self.state = state;
        // Same argument: the held suffix begins with a stop string's first byte.
        let keep = self.nodes[state as usize].depth as usize;
        let mut cut = self.pending.len() - keep;
        while !self.pending.is_char_boundary(cut) {
            cut -= 1;
        }
        let rest = self.pending.split_off(cut);
        StopOutput {
            emit: std::mem::replace(&mut self.pending, rest),
            stopped: None,
        }
    }

    /// Text currently withheld because it may begin a stop string.
    pub fn held(&self) -> &str {
        &self.pending
    }

    /// The index of the stop string that matched, if any.
    pub fn stopped(&self) -> Option<usize> {
        self.stopped
    }

    /// Ends the stream: returns the withheld text, which can no longer become a stop string.
    /// Empty after a stop, because text after a stop string is discarded.
    pub fn finish(self) -> String {
        if self.stopped.is_some() {
            String::new()
        } else {
            self.pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(stops.iter().map(|s| s.to_string()).collect()).expect("valid stops")
    }

    /// Pushes every chunk; returns (all emitted text, stop index, the chunk index that stopped).
    fn feed(m: &mut StopMatcher, chunks: &[&str]) -> (String, Option<usize>, Option<usize>) {
        let mut out = String::new();
        for (i, c) in chunks.iter().enumerate() {
            let o = m.push(c);
            out.push_str(&o.emit);
            if o.stopped.is_some() {
                return (out, o.stopped, Some(i));
            }
        }
        (out, None, None)
    }

    #[test]
    fn no_stops_passes_through() {
        let mut m = matcher(&[]);
        assert_eq!(m.push("hello").emit, "hello");
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn holds_back_possible_prefix_then_releases() {
        let mut m = matcher(&["</s>"]);
        assert_eq!(m.push("abc<").emit, "abc");
        assert_eq!(m.held(), "<");
        assert_eq!(m.push("/").emit, "");
        assert_eq!(m.push("x").emit, "</x");
        assert_eq!(m.push("<").emit, "");
        assert_eq!(m.finish(), "<");
    }

    #[test]
    fn stop_spanning_many_pushes() {
        let mut m = matcher(&["STOP HERE"]);
        let (out, stop, at) = feed(&mut m, &["a", "S", "T", "O", "P", " ", "H", "ERE", "tail"]);
        assert_eq!((out.as_str(), stop, at), ("a", Some(0), Some(7)));
        assert_eq!(m.push("more").emit, "");
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn text_before_match_in_same_push_is_emitted() {
        let mut m = matcher(&["\n\n"]);
        let o = m.push("hello\n\nworld");
        assert_eq!(o.emit, "hello");
        assert_eq!(o.stopped, Some(0));
    }

    #[test]
    fn overlapping_candidates() {
        // "abab" vs text "ababab": the failure link must re-use the overlap "ab".
        let mut m = matcher(&["ababc"]);
        let (out, stop, _) = feed(&mut m, &["ab", "ab", "ab", "c"]);
        assert_eq!((out.as_str(), stop), ("ab", Some(0)));

        // "aab" after "aa": the held "aa" must collapse to "a" then match.
        let mut m = matcher(&["aab"]);
        let (out, stop, _) = feed(&mut m, &["x", "a", "a", "a", "b"]);
        assert_eq!((out.as_str(), stop), ("xa", Some(0)));
    }

    #[test]
    fn hold_back_is_longest_prefix_over_all_stops() {
        let mut m = matcher(&["abcd", "bcx", "cz"]);
        assert_eq!(m.push("zab").emit, "z");
        assert_eq!(m.held(), "ab");
        assert_eq!(m.push("c").emit, "");
        assert_eq!(m.held(), "abc");
        // "abce": nothing can continue; all released.
        assert_eq!(m.push("e").emit, "abce");
        assert_eq!(m.held(), "");
    }

    #[test]
    fn earliest_start_wins_within_a_push() {
        // "bc" completes first, but "abcd" starts earlier and completes in the same push.
        let mut m = matcher(&["bc", "abcd"]);
        let o = m.push("xabcdy");
        assert_eq!((o.emit.as_str(), o.stopped), ("x", Some(1)));

        // Across pushes the first completed match ends generation.
        let mut m = matcher(&["bc", "abcd"]);
        let (out, stop, _) = feed(&mut m, &["xab", "c", "d"]);
        assert_eq!((out.as_str(), stop), ("xa", Some(0)));

        // Shorter stop that is a suffix of a longer one.
        let mut m = matcher(&["world", "o"]);
        let o = m.push("hello world");
        assert_eq!((o.emit.as_str(), o.stopped), ("hell", Some(1)));
    }

    #[test]
    fn duplicate_stops_report_first_index() {
        let mut m = matcher(&["x", "end", "end"]);
        assert_eq!(m.push("the end").stopped, Some(1));
    }

    #[test]
    fn utf8_only_split_on_char_boundaries() {
        let mut m = matcher(&["é!", "😀x"]);
        assert_eq!(m.push("café").emit, "caf");
        assert_eq!(m.held(), "é");
        assert_eq!(m.push("?").emit, "é?");
        assert_eq!(m.push("a😀").emit, "a");
        let o = m.push("x tail");
        assert_eq!((o.emit.as_str(), o.stopped), ("", Some(1)));

        // A stop whose first byte also occurs as a continuation byte elsewhere: "©" is C2 A9 and
        // "é" is C3 A9; a stop starting with a lone continuation byte cannot exist.
        let mut m = matcher(&["©©"]);
        let (out, stop, _) = feed(&mut m, &["é", "©", "é", "©", "©"]);
        assert_eq!((out.as_str(), stop), ("é©é", Some(0)));
    }

    #[test]
    fn empty_stop_rejected() {
        assert_eq!(
            StopMatcher::validate(&["a".into(), String::new()]),
            Err(StopError::Empty { index: 1 })
        );
        assert!(StopMatcher::new(vec![String::new()]).is_err());
        assert!(StopMatcher::validate(&[]).is_ok());
    }

    #[test]
    fn many_stops_stay_fast_and_correct() {
        // 1,000 long stops sharing a prefix, fed a long adversarial stream one byte at a time.
        let stops: Vec<String> = (0..1000)
            .map(|i| format!("{}{i:04}", "a".repeat(200)))
            .collect();
        let mut m = StopMatcher::new(stops).expect("valid");
        let mut out = String::new();
        for _ in 0..20_000 {
            out.push_str(&m.push("a").emit);
        }
        // Everything but the 200 bytes that could still start a stop has been released.
        assert_eq!(out.len(), 20_000 - 200);
        assert_eq!(m.held().len(), 200);
        let (tail, stop, _) = feed(&mut m, &["0", "9", "9", "9"]);
        assert_eq!(stop, Some(999));
        assert_eq!(tail, "");
    }

    #[test]
    fn matches_naive_reference_on_random_streams() {
        // Cross-check hold-back and stop position against a brute-force implementation.
        let stops = ["ab", "aab", "bba", "abab", "c"];
        let mut x: u64 = 0x1234_5678;
        for _ in 0..300 {
            let mut chunks = Vec::new();
            for _ in 0..12 {
                let mut c = String::new();
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                for k in 0..(x >> 60) % 3 {
                    c.push(['a', 'b', 'x', 'c', 'a'][((x >> (10 + 8 * k)) % 5) as usize]);
                }
                chunks.push(c);
            }
            let chunk_refs: Vec<&str> = chunks.iter().map(|s| s.as_str()).collect();
            let mut m = matcher(&stops);
            let (out, stop, at) = feed(&mut m, &chunk_refs);

            // Naive: find the first push where the accumulated text contains a stop; choose the
            // earliest start among matches present at that point.
            let mut text = String::new();
            let mut expect = None;
            for (i, c) in chunks.iter().enumerate() {
                text.push_str(c);
                let best = stops
                    .iter()
                    .enumerate()
                    .filter_map(|(si, s)| text.find(s).map(|p| (p, si)))
                    .min_by_key(|&(p, _)| p);
                if let Some((p, _)) = best {
                    expect = Some((text[..p].to_string(), i));
                    break;
                }
            }
            match expect {
                Some((prefix, i)) => {
                    assert_eq!(out, prefix, "{chunks:?}");
                    assert_eq!(at, Some(i), "{chunks:?}");
                    assert!(stop.is_some());
                }
                None => {
                    assert_eq!(stop, None);
                    assert_eq!(out + &m.finish(), text, "{chunks:?}");
                }
            }
        }
    }
}
