//! Stored responses for `previous_response_id` (spec §3.4): per process, each entry kept for a
//! TTL, the whole store capped in bytes with the least recently used entries dropped first.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a response stays retrievable.
pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);
/// Bytes (of serialized conversation) the store holds at most.
pub const DEFAULT_MAX_BYTES: usize = 32 << 20;

/// A stored turn: the whole conversation up to and including the response's output, as
/// OpenAI-style chat messages, and the instructions it ran with.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    /// Chat messages (no system message: instructions are kept apart).
    pub messages: Vec<Value>,
    /// The `instructions` in force.
    pub instructions: Option<String>,
}

struct Entry {
    value: StoredResponse,
    bytes: usize,
    stored: Instant,
    used: u64,
}

/// The store.
pub struct ResponseStore {
    inner: Mutex<Inner>,
    ttl: Duration,
    max_bytes: usize,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    bytes: usize,
    clock: u64,
}

impl Default for ResponseStore {
    fn default() -> Self {
        Self::new(DEFAULT_TTL, DEFAULT_MAX_BYTES)
    }
}

impl ResponseStore {
    /// A store keeping entries `ttl`, at most `max_bytes` in all.
    pub fn new(ttl: Duration, max_bytes: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            ttl,
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Saves `value` under `id`; one larger than the whole store is not kept.
    pub fn put(&self, id: String, value: StoredResponse) {
        let bytes = id.len()
            + value
                .messages
                .iter()
                .map(|m| m.to_string().len())
                .sum::<usize>()
            + value.instructions.as_ref().map_or(0, String::len);
        if bytes > self.max_bytes {
            return;
        }
        let mut g = self.lock();
        g.clock += 1;
        let used = g.clock;
        if let Some(old) = g.entries.remove(&id) {
            g.bytes -= old.bytes;
        }
        self.expire(&mut g);
        while g.bytes + bytes > self.max_bytes {
            let Some(lru) = g
                .entries
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(e) = g.entries.remove(&lru) {
                g.bytes -= e.bytes;
            }
        }
        g.bytes += bytes;
        let stored = Instant::now();
        g.entries.insert(
            id,
            Entry {
                value,
                bytes,
                stored,
                used,
            },
        );
    }

    /// The response stored under `id`, unless unknown or expired.
    pub fn get(&self, id: &str) -> Option<StoredResponse> {
        let mut g = self.lock();
        self.expire(&mut g);
        g.clock += 1;
        let now = g.clock;
        let e = g.entries.get_mut(id)?;
        e.used = now;
        Some(e.value.clone())
    }

    fn expire(&self, g: &mut Inner) {
        let ttl = self.ttl;
        let mut freed = 0;
        g.entries.retain(|_, e| {
            let keep = e.stored.elapsed() < ttl;
            if !keep {
                freed += e.bytes;
            }
            keep
        });
        g.bytes -= freed;
    }

    /// `/stats`: entries, bytes, cap and TTL.
    pub fn stats(&self) -> Value {
        let mut g = self.lock();
        self.expire(&mut g);
        serde_json::json!({
            "entries": g.entries.len(),
            "bytes": g.bytes,
            "max_bytes": self.max_bytes,
            "ttl_secs": self.ttl.as_secs(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn turn(text: &str) -> StoredResponse {
        StoredResponse {
            messages: vec![json!({"role": "user", "content": text})],
            instructions: None,
        }
    }

    #[test]
    fn least_recently_used_goes_first_when_full() {
        let s = ResponseStore::new(DEFAULT_TTL, 200);
        s.put("a".into(), turn(&"x".repeat(60)));
        s.put("b".into(), turn(&"y".repeat(60)));
        assert!(s.get("a").is_some()); // a is now the most recent
        s.put("c".into(), turn(&"z".repeat(60)));
        assert!(s.get("b").is_none());
        assert!(s.get("a").is_some() && s.get("c").is_some());
        s.put("huge".into(), turn(&"h".repeat(500)));
        assert!(s.get("huge").is_none());
        assert!(s.stats()["bytes"].as_u64().unwrap() <= 200);
    }

    #[test]
    fn entries_expire() {
        let s = ResponseStore::new(Duration::from_millis(30), 1 << 20);
        s.put("a".into(), turn("hi"));
        assert!(s.get("a").is_some());
        std::thread::sleep(Duration::from_millis(50));
        assert!(s.get("a").is_none());
        assert_eq!(s.stats()["entries"], 0);
        assert_eq!(s.stats()["bytes"], 0);
    }
}
