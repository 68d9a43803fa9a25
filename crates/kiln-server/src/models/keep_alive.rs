//! `keep_alive` in Ollama's sense: how long a model stays loaded after its last request.

use std::time::Duration;

use serde_json::Value;

/// How long an idle model stays loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    /// Until it is evicted for room or unloaded by request.
    Forever,
    /// This long after its last request finished (zero: as soon as it is idle).
    For(Duration),
}

/// Why a `keep_alive` value was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "keep_alive must be a duration (\"5m\", \"1h30m\", \"30s\"), a number of seconds, or negative to keep the model loaded; got {0}"
)]
pub struct BadKeepAlive(pub String);

/// The longest finite keep-alive (a longer one is kept as [`KeepAlive::Forever`]).
const MAX_SECS: f64 = 100.0 * 365.0 * 86_400.0;

impl KeepAlive {
    /// From seconds (negative: forever).
    pub fn from_secs_f64(secs: f64) -> Result<Self, BadKeepAlive> {
        if secs.is_nan() {
            return Err(BadKeepAlive("NaN".into()));
        }
        if !(0.0..=MAX_SECS).contains(&secs) {
            return Ok(Self::Forever);
        }
        Ok(Self::For(Duration::from_secs_f64(secs)))
    }

    /// A duration as Ollama reads one: Go's `1h30m`, `300ms`, `-1m`, or bare seconds (`"10"`).
    pub fn parse(text: &str) -> Result<Self, BadKeepAlive> {
        let t = text.trim();
        if let Ok(secs) = t.parse::<f64>() {
            return Self::from_secs_f64(secs);
        }
        parse_go_duration(t)
            .and_then(|s| Self::from_secs_f64(s).ok())
            .ok_or_else(|| BadKeepAlive(format!("{text:?}")))
    }

    /// A request's `keep_alive` field: a number of seconds or a duration string; absent or
    /// null leaves the model's own.
    pub fn from_field(field: Option<&Value>) -> Result<Option<Self>, BadKeepAlive> {
        match field {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => n
                .as_f64()
                .ok_or_else(|| BadKeepAlive(n.to_string()))
                .and_then(Self::from_secs_f64)
                .map(Some),
            Some(Value::String(s)) => Self::parse(s).map(Some),
            Some(other) => Err(BadKeepAlive(other.to_string())),
        }
    }

    /// Whether a model idle for `idle` has outlived this.
    pub fn expired(self, idle: Duration) -> bool {
        match self {
            Self::Forever => false,
            Self::For(d) => idle >= d,
        }
    }
}

impl std::fmt::Display for KeepAlive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Forever => f.write_str("forever"),
            Self::For(d) => write!(f, "{}s", d.as_secs_f64()),
        }
    }
}

/// Seconds of a Go duration: an optional sign, then number-unit pairs (`ns`, `us`, `µs`, `ms`,
/// `s`, `m`, `h`).
fn parse_go_duration(t: &str) -> Option<f64> {
    let (sign, mut rest) = match t.strip_prefix('-') {
        Some(r) => (-1.0, r),
        None => (1.0, t.strip_prefix('+').unwrap_or(t)),
    };
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += value * scale;
    }
    Some(sign * total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_ollama_values() {
        let secs = |s: u64| KeepAlive::For(Duration::from_secs(s));
        assert_eq!(KeepAlive::parse("5m"), Ok(secs(300)));
        assert_eq!(KeepAlive::parse("1h30m"), Ok(secs(5400)));
        assert_eq!(KeepAlive::parse("10"), Ok(secs(10)));
        assert_eq!(KeepAlive::parse("0"), Ok(secs(0)));
        assert_eq!(KeepAlive::parse("-1m"), Ok(KeepAlive::Forever));
        assert_eq!(
            KeepAlive::parse("1.5s"),
            Ok(KeepAlive::For(Duration::from_millis(1500)))
        );
        assert_eq!(KeepAlive::from_field(Some(&json!(0))), Ok(Some(secs(0))));
        assert_eq!(
            KeepAlive::from_field(Some(&json!(-1))),
            Ok(Some(KeepAlive::Forever))
        );
        assert_eq!(KeepAlive::from_field(None), Ok(None));
    }

    #[test]
    fn refuses_what_is_not_a_duration() {
        for bad in ["", "5 minutes", "m", "1x", "--1s", "1..5s"] {
            assert!(KeepAlive::parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(KeepAlive::from_field(Some(&json!(true))).is_err());
        assert!(KeepAlive::from_field(Some(&json!([1]))).is_err());
    }
}
