//! The one place YAML is parsed.
//!
//! serde_yaml is deprecated upstream but still refuses alias bombs (its
//! repetition limit) and deep nesting (its recursion limit). Every YAML
//! document in the project goes through [`from_str`], so swapping it for a
//! maintained fork is a change to this file only.

use serde::de::DeserializeOwned;

/// The largest YAML document accepted (definitions and configs alike).
pub const MAX_YAML_BYTES: usize = 1024 * 1024;

/// A YAML error with the 1-based line it was found on, when known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct YamlError {
    pub line: Option<usize>,
    pub message: String,
}

/// Parses one YAML document into `T`, refusing documents over
/// [`MAX_YAML_BYTES`], alias bombs and excessive nesting.
pub fn from_str<T: DeserializeOwned>(src: &str) -> Result<T, YamlError> {
    // A byte-order mark (editors on some systems save one) is not content.
    let src = src.strip_prefix('\u{feff}').unwrap_or(src);
    if src.len() > MAX_YAML_BYTES {
        let mut cut = MAX_YAML_BYTES;
        while !src.is_char_boundary(cut) {
            cut -= 1;
        }
        return Err(YamlError {
            // The line where the limit is crossed.
            line: Some(src[..cut].matches('\n').count() + 1),
            message: format!(
                "document is {} bytes, larger than the {} byte limit (split it or move data to a file)",
                src.len(),
                MAX_YAML_BYTES
            ),
        });
    }
    if src.trim().is_empty() {
        return Err(YamlError { line: Some(1), message: "document is empty".into() });
    }
    serde_yaml::from_str(src).map_err(|e| {
        let mut line = e.location().map(|l| l.line());
        let column = e.location().map(|l| l.column());
        // serde_yaml appends " at line N column M"; the caller prints the line itself.
        let mut message = e.to_string();
        if let Some(i) = message.find(" at line ") {
            message.truncate(i);
        }
        if message.contains("repetition limit") {
            message.push_str(" (YAML aliases expand too far; write the values out)");
            line = line.or_else(|| first_line(src, |l| l.contains('*') && l.contains(['&', '*'])));
        }
        if message.contains("recursion limit") {
            message.push_str(" (nesting is too deep)");
            line = line.or_else(|| first_line(src, |l| l.contains(['[', '{'])));
        }
        if message.contains("more than one document") {
            message = "the file holds more than one YAML document (a second one starts here); keep one per file".into();
            // The separator after the first content.
            let mut seen_content = false;
            for (i, l) in src.lines().enumerate() {
                let t = l.trim_end();
                if (t == "---" || t.starts_with("--- ") || t == "...") && seen_content {
                    line = Some(i + 1);
                    break;
                }
                if !t.is_empty() && !t.starts_with('#') && !t.starts_with("---") && !t.starts_with('%') {
                    seen_content = true;
                }
            }
        }
        if let Some(hint) = line.and_then(|n| src.lines().nth(n.saturating_sub(1))).and_then(reserved_start) {
            message.push_str(&hint);
        }
        // The parser's words for a key out of line say nothing of indents.
        let misplaced = ["mapping values are not allowed", "did not find expected key", "did not find expected '-'"];
        if misplaced.iter().any(|m| message.contains(m)) {
            message.push_str(
                ": likely a key indented more or less than the keys beside it, or a value holding \": \" that \
                 needs quotes",
            );
            if let Some((n, text)) = line.and_then(|n| src.lines().nth(n.saturating_sub(1)).map(|t| (n, t))) {
                message.push_str(&pointed(n, text, column.unwrap_or(1)));
            }
        }
        // A tab where YAML wants spaces: said in those words, on its line.
        let indented_by_tab = |l: &str| l[..l.len() - l.trim_start().len()].contains('\t');
        if let Some(n) = first_line(src, indented_by_tab).filter(|n| line.is_none_or(|at| *n <= at)) {
            line = Some(n);
            message = "a tab here: YAML indents with spaces only (replace the tab with spaces)".into();
        }
        YamlError { line: line.or(Some(1)), message: humane(&message) }
    })
}

/// Line `n` of a document (`text`) under its number, and a caret under
/// `column` (1-based), as compilers show a place.
fn pointed(n: usize, text: &str, column: usize) -> String {
    let number = n.to_string();
    let pad = " ".repeat(number.len());
    let before: String =
        text.chars().take(column.saturating_sub(1)).map(|c| if c == '\t' { '\t' } else { ' ' }).collect();
    format!("\n  {number} | {text}\n  {pad} | {before}^")
}

/// serde's wording, in a colleague's: `invalid type: string "four",
/// expected u32` → `expected a whole number, found "four"`; an unknown
/// field with the closest known one.
pub fn humane(message: &str) -> String {
    let kind = |expected: &str| -> String {
        let e = expected.trim();
        match e {
            "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => "a whole number of 0 or more".into(),
            "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "a whole number".into(),
            "f32" | "f64" => "a number".into(),
            "a boolean" => "true or false".into(),
            "a string" => "text".into(),
            "a sequence" => "a list".into(),
            "a map" => "a mapping".into(),
            other => other.trim_start_matches("struct ").to_string(),
        }
    };
    let found = |what: &str| -> String {
        let w = what.trim();
        for (prefix, shown) in [("string ", ""), ("integer `", ""), ("floating point `", "")] {
            if let Some(rest) = w.strip_prefix(prefix) {
                return format!("{shown}{}", rest.trim_end_matches('`'));
            }
        }
        match w {
            "sequence" => "a list".into(),
            "map" => "a mapping".into(),
            "unit value" => "nothing (an empty value)".into(),
            other => other.trim_start_matches("boolean `").trim_end_matches('`').to_string(),
        }
    };
    // The field it is about may come first: `scheduler.concurrency: invalid type: …`.
    let (field, rest) = match message.find("invalid type: ").or_else(|| message.find("invalid value: ")) {
        Some(i) => (&message[..i], &message[i..]),
        None => ("", message),
    };
    for tag in ["invalid type: ", "invalid value: "] {
        if let Some(body) = rest.strip_prefix(tag) {
            if let Some((what, expected)) = body.split_once(", expected ") {
                return format!("{field}expected {}, found {}", kind(expected), found(what));
            }
        }
    }
    if message.contains("invalid socket address syntax") {
        return format!("{message} (expected an IP address and a port, for example 127.0.0.1:9464)");
    }
    if let Some(i) = message.find("unknown field `") {
        let after = &message[i + "unknown field `".len()..];
        if let (Some(end), Some(j)) = (after.find('`'), message.find("expected one of ")) {
            let name = &after[..end];
            let known: Vec<&str> =
                message[j + "expected one of ".len()..].split(", ").map(|k| k.trim_matches('`')).collect();
            if let Some(k) = crate::text::closest(name, &known) {
                return format!("{message} (did you mean `{k}`?)");
            }
        }
    }
    message.to_string()
}

/// A hint for a `key: value` line whose plain value starts with a character
/// YAML reserves (`delimiter: ,`, `pattern: @daily`): quote the value.
fn reserved_start(line: &str) -> Option<String> {
    let t = line.trim_start().trim_start_matches("- ");
    let (key, value) = t.split_once(':')?;
    let value = value.trim();
    let first = value.chars().next()?;
    if key.is_empty() || key.contains(['"', '\'', ' ']) || !",]}@`%".contains(first) {
        return None;
    }
    Some(format!(
        " (the value of {key:?} starts with {first:?}, which YAML reserves; quote it: {key}: \"{}\")",
        value.replace('"', "\\\"")
    ))
}

/// The 1-based number of the first line that satisfies `pred`.
fn first_line(src: &str, pred: impl Fn(&str) -> bool) -> Option<usize> {
    src.lines().position(pred).map(|i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn serde_wording_is_said_as_a_colleague_would() {
        assert_eq!(
            humane("invalid type: string \"four\", expected u32"),
            "expected a whole number of 0 or more, found \"four\""
        );
        assert_eq!(
            humane("x.retry: invalid type: string \"a\", expected i64"),
            "x.retry: expected a whole number, found \"a\""
        );
        assert_eq!(humane("invalid type: sequence, expected a string"), "expected text, found a list");
        assert_eq!(
            humane("invalid value: integer `-1`, expected u32"),
            "expected a whole number of 0 or more, found -1"
        );
        let u = humane("scheduler: unknown field `concurency`, expected one of `concurrency`, `lease`");
        assert!(u.ends_with("(did you mean `concurrency`?)"), "{u}");
    }

    #[test]
    fn a_key_out_of_line_is_shown_with_a_caret_and_the_likely_mistake() {
        let src = "task: t\nsteps:\n  - plugin: shell\n    params:\n      command: echo a\n     retry: 2\n";
        let e = from_str::<Value>(src).unwrap_err();
        assert_eq!(e.line, Some(6), "{e:?}");
        assert!(e.message.contains("likely a key indented more or less than the keys beside it"), "{}", e.message);
        assert!(e.message.contains("\n  6 |      retry: 2\n    |      ^"), "{}", e.message);
    }

    #[test]
    fn a_tab_is_called_a_tab() {
        let e = from_str::<Value>("task: t\nsteps:\n\t- plugin: shell\n").unwrap_err();
        assert_eq!(
            (e.line, e.message.as_str()),
            (Some(3), "a tab here: YAML indents with spaces only (replace the tab with spaces)")
        );
    }

    /// Nine levels of nine aliases each: 9^10 nodes once expanded.
    fn alias_bomb() -> String {
        let mut src = String::from("a: &a [x, x, x, x, x, x, x, x, x]\n");
        let mut prev = 'a';
        for name in "bcdefghij".chars() {
            src.push_str(&format!(
                "{name}: &{name} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
            ));
            prev = name;
        }
        src
    }

    #[test]
    fn an_unquoted_reserved_value_is_named_with_the_fix() {
        let e = from_str::<Value>("steps:\n  - plugin: data_parser\n    params:\n      delimiter: ,\n").unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.message.contains(r#"quote it: delimiter: ",""#), "{e}");
        assert_eq!(from_str::<Value>("delimiter: \",\"\n").unwrap()["delimiter"], ",");
    }

    #[test]
    fn alias_bomb_is_refused() {
        let e = from_str::<Value>(&alias_bomb()).unwrap_err();
        assert!(e.message.contains("repetition limit"), "{e}");
    }

    #[test]
    fn deep_nesting_is_refused() {
        let src = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
        let e = from_str::<Value>(&src).unwrap_err();
        assert!(e.message.contains("nesting"), "{e}");
    }

    #[test]
    fn huge_document_is_refused() {
        let src = format!("a: \"{}\"", "x".repeat(MAX_YAML_BYTES));
        assert!(from_str::<Value>(&src).unwrap_err().message.contains("byte limit"));
    }

    #[test]
    fn a_byte_order_mark_is_not_content() {
        let v: Value = from_str("\u{feff}task: x\n").unwrap();
        assert_eq!(v["task"], "x");
    }

    #[test]
    fn every_refusal_names_a_line() {
        let e = from_str::<Value>("a: 1\n---\nb: 2\n").unwrap_err();
        assert_eq!(e.line, Some(2), "{e:?}");
        assert!(e.message.contains("more than one YAML document"), "{e}");
        let src = format!("a: 1\nb: \"{}\"\n", "x".repeat(MAX_YAML_BYTES));
        assert_eq!(from_str::<Value>(&src).unwrap_err().line, Some(2));
        assert!(from_str::<Value>(&alias_bomb()).unwrap_err().line.is_some());
    }

    #[test]
    fn errors_carry_the_line() {
        let e = from_str::<Value>("a: 1\nb: [1, 2\nc: 3\n").unwrap_err();
        assert!(e.line.is_some(), "{e:?}");
    }
}
