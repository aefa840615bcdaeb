//! Chat templates (`tokenizer.chat_template`, Jinja as HF transformers renders it) via
//! minijinja: trim_blocks and lstrip_blocks on, Python string methods (pycompat),
//! `raise_exception`, `strftime_now`, and a `tojson` that writes what Python's json.dumps
//! writes (", " and ": " separators, non-ASCII kept, no HTML escaping).

use anyhow::Context;
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

pub fn render(template: &str, messages: &[ChatMessage], add_generation_prompt: bool, bos: &str, eos: &str) -> anyhow::Result<String> {
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<String, Error> { Err(Error::new(ErrorKind::InvalidOperation, msg)) });
    env.add_function("strftime_now", |fmt: String| today(&fmt));
    env.add_filter("tojson", tojson);
    env.add_template("chat", template).context("parsing the chat template")?;
    let tpl = env.get_template("chat").context("parsing the chat template")?;
    tpl.render(minijinja::context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos,
        eos_token => eos,
    })
    .map_err(|e| anyhow::anyhow!("rendering the chat template: {e:#}"))
}

/// `tojson(indent=None)` with json.dumps's output format.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<String, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    // HF passes these through to json.dumps; only the defaults are supported here.
    let _: Option<Value> = kwargs.get("ensure_ascii")?;
    let _: Option<Value> = kwargs.get("separators")?;
    let _: Option<Value> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(usize::try_from(v)?),
    };
    let mut out = String::new();
    write_json(value, indent, 0, &mut out)?;
    Ok(out)
}

fn write_json(v: &Value, indent: Option<usize>, depth: usize, out: &mut String) -> Result<(), Error> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    // With an indent, json.dumps separates items with "," (the newline follows).
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&v.to_string()),
        ValueKind::String | ValueKind::Bytes | ValueKind::Plain | ValueKind::Invalid => {
            out.push_str(&serde_json::to_string(&v.to_string()).expect("strings serialize"))
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json(item, indent, depth + 1, out)?;
            }
            if !items.is_empty() {
                newline(out, depth);
            }
            out.push(']');
        }
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter()?.collect();
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                out.push_str(&serde_json::to_string(&key.to_string()).expect("strings serialize"));
                out.push_str(": ");
                write_json(&v.get_item(key)?, indent, depth + 1, out)?;
            }
            if !keys.is_empty() {
                newline(out, depth);
            }
            out.push('}');
        }
        _ => out.push_str(&serde_json::to_string(&v.to_string()).expect("strings serialize")),
    }
    Ok(())
}

/// Today's date (UTC) formatted with the strftime subset chat templates use:
/// %d %m %Y %y %B %b %A %a %H %M %S %j %%, and %-d / %-m without padding.
pub fn today(fmt: &str) -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    format_time(fmt, secs)
}

const MONTHS: [&str; 12] =
    ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// Formats a Unix time (UTC).
pub fn format_time(fmt: &str, unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let secs_of_day = unix_secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    let weekday = ((days + 3).rem_euclid(7)) as usize; // 1970-01-01 was a Thursday
    let day_of_year = days - days_from_civil(y, 1, 1) + 1;
    let mut out = String::new();
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.peek() == Some(&'-');
        if unpadded {
            chars.next();
        }
        let num = |n: i64, w: usize| if unpadded { n.to_string() } else { format!("{n:0w$}") };
        match chars.next() {
            Some('d') => out.push_str(&num(d as i64, 2)),
            Some('m') => out.push_str(&num(m as i64, 2)),
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&num(y.rem_euclid(100), 2)),
            Some('B') => out.push_str(MONTHS[m as usize - 1]),
            Some('b') => out.push_str(&MONTHS[m as usize - 1][..3]),
            Some('A') => out.push_str(WEEKDAYS[weekday]),
            Some('a') => out.push_str(&WEEKDAYS[weekday][..3]),
            Some('H') => out.push_str(&num((secs_of_day / 3600) as i64, 2)),
            Some('M') => out.push_str(&num((secs_of_day / 60 % 60) as i64, 2)),
            Some('S') => out.push_str(&num((secs_of_day % 60) as i64, 2)),
            Some('j') => out.push_str(&num(day_of_year, 3)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
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

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_format_like_strftime() {
        // 2024-02-29 13:05:09 UTC, a Thursday, day 60 of a leap year.
        let t = 1_709_211_909;
        assert_eq!(format_time("%d %b %Y", t), "29 Feb 2024");
        assert_eq!(format_time("%A, %B %-d %H:%M:%S %j %y %m %%", t), "Thursday, February 29 13:05:09 060 24 02 %");
        assert_eq!(format_time("%Y-%m-%d %a", 0), "1970-01-01 Thu");
        assert_eq!(format_time("%Y-%m-%d", 951_782_400), "2000-02-29");
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let tpl = "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ 'a<b>é\"' | tojson }}|{{ none | tojson }}";
        let out = minijinja_render(tpl);
        // json.dumps({"name": "f", "args": [1, 2.5, True, None], "empty": {}}) and with indent=2.
        let expected_compact = r#"{"name": "f", "args": [1, 2.5, true, null], "empty": {}}"#;
        let expected_indent = "{\n  \"name\": \"f\",\n  \"args\": [\n    1,\n    2.5,\n    true,\n    null\n  ],\n  \"empty\": {}\n}";
        assert_eq!(out, format!("{expected_compact}|{expected_indent}|\"a<b>é\\\"\"|null"));
    }

    fn minijinja_render(tpl: &str) -> String {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        let x = minijinja::context! { x => minijinja::context! { name => "f", args => vec![Value::from(1), Value::from(2.5), Value::from(true), Value::from(())], empty => minijinja::context! {} } };
        env.render_str(tpl, x).unwrap()
    }
}
