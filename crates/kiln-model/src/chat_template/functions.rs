//! The functions and filters Hugging Face adds to its Jinja environment: `raise_exception`,
//! `strftime_now` and a `tojson` that prints like Python's `json.dumps`.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// The message of a template's `raise_exception(...)`, carried as the error's source so that
/// rendering can report it as is.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Raised(pub String);

/// `raise_exception(msg)`: fails the render with `msg`.
pub(crate) fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(Raised(msg)))
}

/// `strftime_now(fmt)`: the current time formatted with C `strftime` codes, in UTC (a server's
/// local zone says nothing about the user's).
pub(crate) fn strftime_now(fmt: String) -> Result<Value, Error> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime(&fmt, secs).map(Value::from)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Formats `secs` since the epoch (UTC) with the common `strftime` codes.
pub(crate) fn strftime(fmt: &str, secs: u64) -> Result<String, Error> {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[(month - 1) as usize];
    let day_name = DAYS[weekday];

    let mut out = String::with_capacity(fmt.len() + 16);
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(code) = chars.next() else {
            out.push('%');
            break;
        };
        let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
        // Writing to a String cannot fail.
        let _ = match code {
            'Y' => write!(out, "{year}"),
            'y' => write!(out, "{:02}", year.rem_euclid(100)),
            'm' => write!(out, "{month:02}"),
            'd' => write!(out, "{day:02}"),
            'e' => write!(out, "{day:2}"),
            '-' => match chars.next() {
                Some('d') => write!(out, "{day}"),
                Some('m') => write!(out, "{month}"),
                Some('H') => write!(out, "{hour}"),
                Some('I') => write!(out, "{hour12}"),
                other => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        format!("strftime: unsupported %-{other:?}"),
                    ));
                }
            },
            'H' => write!(out, "{hour:02}"),
            'I' => write!(out, "{hour12:02}"),
            'M' => write!(out, "{minute:02}"),
            'S' => write!(out, "{second:02}"),
            'p' => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            'b' | 'h' => write!(out, "{}", &month_name[..3]),
            'B' => write!(out, "{month_name}"),
            'a' => write!(out, "{}", &day_name[..3]),
            'A' => write!(out, "{day_name}"),
            'j' => write!(out, "{yday:03}"),
            'F' => write!(out, "{year}-{month:02}-{day:02}"),
            'T' => write!(out, "{hour:02}:{minute:02}:{second:02}"),
            'Z' => write!(out, "UTC"),
            'z' => write!(out, "+0000"),
            '%' => write!(out, "%"),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime: unsupported %{other}"),
                ));
            }
        };
    }
    Ok(out)
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Day count since 1970-01-01 of a civil date (inverse of [`civil_from_days`]).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// How `tojson` lays out its output, as `json.dumps` arguments.
struct JsonStyle {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// `tojson(indent=None, ensure_ascii=False, separators=None, sort_keys=False)`, as Hugging Face
/// defines it: Python's `json.dumps`, with no HTML escaping (minijinja's built-in escapes `<`,
/// `>`, `&` and `'`, which would change prompts).
pub(crate) fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = match indent {
        Some(v) => Some(v),
        None => kwargs.get("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_string(),
            None => {
                let n = v.as_i64().ok_or_else(|| {
                    Error::new(ErrorKind::InvalidOperation, "tojson: indent must be an int")
                })?;
                " ".repeat(n.max(0) as usize)
            }
        }),
    };
    let separators: Option<Value> = kwargs.get("separators")?;
    let (item_sep, key_sep) = match separators {
        Some(s) if !s.is_none() => {
            let item = s.get_item_by_index(0)?;
            let key = s.get_item_by_index(1)?;
            match (item.as_str(), key.as_str()) {
                (Some(i), Some(k)) => (i.to_string(), k.to_string()),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ));
                }
            }
        }
        // Python's defaults: no space before a newline when indenting.
        _ => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
    };
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    write_json(&mut out, value, &style, 0)?;
    Ok(Value::from(out))
}

fn write_json(out: &mut String, v: &Value, style: &JsonStyle, depth: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, v),
        ValueKind::String => write_str(out, v.as_str().unwrap_or_default(), style.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_container(out, '[', ']', items.len(), style, depth, |out, i| {
                write_json(out, &items[i], style, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if style.sort_keys {
                keys.sort_by_key(|a| a.to_string());
            }
            write_container(out, '{', '}', keys.len(), style, depth, |out, i| {
                let key = &keys[i];
                // json.dumps turns non-string keys into strings.
                match key.as_str() {
                    Some(s) => write_str(out, s, style.ensure_ascii),
                    None => write_str(out, &key.to_string(), style.ensure_ascii),
                }
                out.push_str(&style.key_sep);
                write_json(out, &v.get_item(key)?, style, depth + 1)
            })?;
        }
        _ => write_str(out, &v.to_string(), style.ensure_ascii),
    }
    Ok(())
}

fn write_container(
    out: &mut String,
    open: char,
    close: char,
    len: usize,
    style: &JsonStyle,
    depth: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    for i in 0..len {
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        if let Some(ind) = &style.indent {
            out.push('\n');
            out.push_str(&ind.repeat(depth + 1));
        }
        item(out, i)?;
    }
    if let Some(ind) = &style.indent {
        out.push('\n');
        out.push_str(&ind.repeat(depth));
    }
    out.push(close);
    Ok(())
}

/// Integers as is; floats as Python's `repr` writes the usual ones (`1.0`, `0.5`).
fn write_number(out: &mut String, v: &Value) {
    if v.is_integer() {
        out.push_str(&v.to_string());
        return;
    }
    let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else if f.fract() == 0.0 && f.abs() < 1e16 {
        let _ = write!(out, "{f:.1}");
    } else {
        let _ = write!(out, "{f}");
    }
}

/// A JSON string literal: `"`, `\` and control characters escaped, the rest as is unless
/// `ensure_ascii`.
fn write_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
