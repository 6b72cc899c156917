//! A definition's `secrets:`: each name and where its value comes from (an
//! environment variable of the agent, or a file it reads). Templates use them
//! as `{{ secrets.NAME }}`; their values are read when a step starts and
//! never stored (see [`Masker`]).

use super::{kind, show};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Where a secret's value comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SecretSource {
    /// The agent's environment variable.
    Env(String),
    /// A file the agent reads (its trailing newline dropped).
    File(String),
}

impl SecretSource {
    /// `environment variable X` or `file F`, for messages.
    pub fn describe(&self) -> String {
        match self {
            SecretSource::Env(v) => format!("environment variable {v}"),
            SecretSource::File(f) => format!("file {f}"),
        }
    }
}

/// `secrets:` as written, checked; problems go to `at(field, message)`.
pub(super) fn parse(v: Option<&Value>, at: &mut impl FnMut(&str, String)) -> BTreeMap<String, SecretSource> {
    let mut out = BTreeMap::new();
    let m = match v {
        None | Some(Value::Null) => return out,
        Some(Value::Object(m)) => m,
        Some(v) => {
            at("secrets", format!("expected a mapping of names to {{env: VAR}} or {{file: PATH}}, found {}", kind(v)));
            return out;
        }
    };
    for (name, spec) in m {
        let field = format!("secrets.{name}");
        if !super::valid_name(name) || name.contains('-') || name.contains('.') {
            at(&field, format!("{name:?} is not a valid secret name (letters, digits and '_')"));
            continue;
        }
        let one = |o: &Map<String, Value>| -> Result<SecretSource, String> {
            match (o.get("env"), o.get("file"), o.len()) {
                (Some(Value::String(e)), None, 1) if !e.is_empty() => Ok(SecretSource::Env(e.clone())),
                (None, Some(Value::String(f)), 1) if !f.is_empty() => Ok(SecretSource::File(f.clone())),
                (Some(v), None, 1) | (None, Some(v), 1) => {
                    Err(format!("expected a non-empty string, found {}", show(v)))
                }
                _ => Err("expected exactly one of env: VAR or file: PATH".into()),
            }
        };
        match spec {
            Value::Object(o) => match one(o) {
                Ok(s) => {
                    out.insert(name.clone(), s);
                }
                Err(e) => at(&field, e),
            },
            other => at(&field, format!("expected {{env: VAR}} or {{file: PATH}}, found {}", kind(other))),
        }
    }
    out
}

/// The text every secret's value is replaced with wherever it would show.
pub const MASK: &str = "***";

/// The shortest text masked: a shorter one would mask unrelated text.
const SHORTEST: usize = 3;

/// Replaces secrets' values with [`MASK`] in text and in JSON. A value is
/// masked whole and in the forms it takes on its way out: each line of a
/// multi-line value (a log is written line by line), the value
/// percent-encoded as URL and form encoders write it (`%20` or `+` for a
/// space, hex digits in upper or lower case) and its base64 (whole, and
/// the part of a longer text's base64 that only the value makes up, as in
/// a basic auth header). Forms are masked longest first (so a value that
/// contains another goes whole); values and lines shorter than 3
/// characters are not masked (they would mask everything).
#[derive(Debug, Clone, Default)]
pub struct Masker {
    /// Every form masked, longest first.
    values: Vec<String>,
}

impl Masker {
    pub fn new(values: impl IntoIterator<Item = String>) -> Masker {
        let mut forms = Vec::new();
        for v in values.into_iter().filter(|v| v.len() >= SHORTEST) {
            if v.contains('\n') {
                forms.extend(v.lines().map(str::trim).filter(|l| l.len() >= SHORTEST).map(str::to_string));
            }
            forms.extend(percent_forms(&v));
            forms.extend(base64_forms(v.as_bytes()));
            forms.push(v);
        }
        forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        forms.dedup();
        Masker { values: forms }
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The length in bytes of the longest text masked (0 for none): how
    /// much of a value can straddle a cut.
    pub fn longest(&self) -> usize {
        self.values.first().map_or(0, String::len)
    }

    pub fn text(&self, s: &str) -> String {
        let mut out = s.to_string();
        for v in &self.values {
            if out.contains(v.as_str()) {
                out = out.replace(v.as_str(), MASK);
            }
        }
        out
    }

    pub fn value(&self, v: &Value) -> Value {
        if self.is_empty() {
            return v.clone();
        }
        match v {
            Value::String(s) => Value::String(self.text(s)),
            Value::Array(items) => Value::Array(items.iter().map(|x| self.value(x)).collect()),
            Value::Object(m) => Value::Object(m.iter().map(|(k, x)| (k.clone(), self.value(x))).collect()),
            other => other.clone(),
        }
    }

    /// How much may be left of a value where text was cut: a value's part
    /// (one byte short of the longest form) and what a character cut in
    /// two becomes (up to three U+FFFD); nothing without values.
    fn edge(&self) -> usize {
        match self.is_empty() {
            true => 0,
            false => self.longest() + 5,
        }
    }

    /// The start of `text`, masked first and then cut to at most `max`
    /// bytes, never inside a mask. When `text` is itself the start of
    /// something longer (`cut`), its end may hold the start of a value
    /// whose rest was cut off, which nothing matches: as much is dropped as
    /// could hold one.
    pub fn head(&self, text: &str, max: usize, cut: bool) -> String {
        let masked = self.text(text);
        let floor = if cut { self.edge() } else { 0 };
        crate::text::until(&masked, max.min(masked.len().saturating_sub(floor))).to_string()
    }

    /// The end of `text`, masked first and then cut to at most `max` bytes,
    /// never inside a mask. When `text` is itself the end of something
    /// longer (`cut`), its start may hold the end of a value whose start
    /// was cut off: as much is dropped as could hold one.
    pub fn tail(&self, text: &str, max: usize, cut: bool) -> String {
        let masked = self.text(text);
        let floor = if cut { self.edge() } else { 0 };
        crate::text::since(&masked, masked.len().saturating_sub(max).max(floor)).to_string()
    }

    /// Where to split `line`, too long to write whole, so that a value
    /// across the split is masked whole: the byte offset of the end carried
    /// on to the next piece (what follows the last mask, as much as could
    /// begin a value, at most `max` bytes). The whole line without values.
    pub fn split_at(&self, line: &str, max: usize) -> usize {
        if self.is_empty() {
            return line.len();
        }
        let masked = self.text(line);
        let same = line.bytes().rev().zip(masked.bytes().rev()).take_while(|(a, b)| a == b).count();
        let mut at = line.len() - same.min(self.longest().saturating_sub(1)).min(max);
        while !line.is_char_boundary(at) {
            at += 1;
        }
        at
    }
}

/// Bytes a percent-encoder leaves as they are: ASCII letters and digits
/// and these (`Only`), or every printable ASCII character but these
/// (`AllBut`); every other byte is written `%XX`.
enum Keep {
    Only(&'static [u8]),
    AllBut(&'static [u8]),
}

impl Keep {
    fn keeps(&self, b: u8) -> bool {
        match self {
            Keep::Only(set) => b.is_ascii_alphanumeric() || set.contains(&b),
            Keep::AllBut(set) => b.is_ascii_graphic() && !set.contains(&b),
        }
    }
}

/// The common percent-encoders: RFC 3986's unreserved characters (Go,
/// Python's `quote`, with `/` its default), forms
/// (`application/x-www-form-urlencoded`), JavaScript's
/// `encodeURIComponent` and `encodeURI`, and the WHATWG URL parser's query,
/// path and userinfo sets (what an HTTP client does to a URL it is given).
const ENCODERS: &[Keep] = &[
    Keep::Only(b"-._~"),
    Keep::Only(b"-._~/"),
    Keep::Only(b"*-._"),
    Keep::Only(b"-_.!~*'()"),
    Keep::Only(b"-_.!~*'();,/?:@&=+$#"),
    Keep::AllBut(b"\"#<>'"),
    Keep::AllBut(b"\"#<>?`{}"),
    Keep::AllBut(b"\"#<>?`{}/:;=@[\\]^|"),
];

/// `v` percent-encoded: each byte `keep` refuses as `%XX` in these hex
/// digits, a space as `+` when `plus`.
fn percent(v: &str, keep: &Keep, plus: bool, hex: &[u8; 16]) -> String {
    let mut out = String::with_capacity(v.len() * 3);
    for b in v.bytes() {
        match b {
            b' ' if plus => out.push('+'),
            b if keep.keeps(b) => out.push(char::from(b)),
            b => {
                out.push('%');
                out.push(char::from(hex[usize::from(b >> 4)]));
                out.push(char::from(hex[usize::from(b & 15)]));
            }
        }
    }
    out
}

/// A value as each encoder writes it (the same texts repeat; the caller
/// drops them).
fn percent_forms(v: &str) -> Vec<String> {
    let spaces: &[bool] = if v.contains(' ') { &[false, true] } else { &[false] };
    let mut out = Vec::new();
    for keep in ENCODERS {
        for &plus in spaces {
            for hex in [b"0123456789ABCDEF", b"0123456789abcdef"] {
                out.push(percent(v, keep, plus, hex));
            }
        }
    }
    out
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 (RFC 4648), padded.
pub fn base64(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4usize {
            match i <= chunk.len() {
                true => out.push(char::from(BASE64[(n >> (18 - 6 * i)) as usize & 63])),
                false => out.push('='),
            }
        }
    }
    out
}

/// A value's base64 forms: the whole value's (padded and not), and for
/// each of the three places it can start at inside a longer text, the
/// part of that text's base64 only the value makes up (its whole groups of
/// three bytes; at least two groups, or it would mask what is no secret).
fn base64_forms(v: &[u8]) -> Vec<String> {
    let whole = base64(v);
    let mut out = vec![whole.trim_end_matches('=').to_string(), whole];
    for shift in 0..3usize {
        let Some(rest) = v.get(shift..) else { break };
        let groups = rest.len() / 3 * 3;
        if groups >= 6 {
            out.push(base64(&rest[..groups]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_are_masked_longest_first_in_text_and_json() {
        let m = Masker::new(["hunter2".to_string(), "hunter2-extra".to_string(), "x".to_string()]);
        assert_eq!(m.text("a hunter2-extra b hunter2 x"), "a *** b *** x");
        assert_eq!(m.value(&json!({"a": ["pw=hunter2"], "n": 1})), json!({"a": ["pw=***"], "n": 1}));
    }

    #[test]
    fn each_line_of_a_multi_line_value_is_masked_and_the_whole_value_too() {
        let m = Masker::new(["first-line-aaa\r\nsecond-line-bbb\nxy\n".to_string()]);
        assert_eq!(m.text("got first-line-aaa\r\nsecond-line-bbb\nxy\n!"), "got ***!");
        // A log is written line by line: each line goes on its own.
        assert_eq!(m.text("first-line-aaa"), "***");
        assert_eq!(m.text("> second-line-bbb <"), "> *** <");
        // A line too short to mean anything is left.
        assert_eq!(m.text("xy"), "xy");
    }

    #[test]
    fn percent_form_and_base64_forms_are_masked() {
        let m = Masker::new(["tok en<é/x".to_string()]);
        for form in ["tok%20en%3C%C3%A9/x", "tok+en%3C%C3%A9%2Fx", "tok%20en%3c%c3%a9%2fx", "dG9rIGVuPMOpL3g="] {
            assert_eq!(m.text(&format!("url?token={form}&a=1")), "url?token=***&a=1", "{form}");
        }
        // A password inside a longer base64 text (basic auth), at every
        // alignment: what only it makes up is masked, at most two of its
        // bytes are left at each edge.
        let pw = "hunter2-very-secret";
        let m = Masker::new([pw.to_string()]);
        assert_eq!(m.text(&base64(format!("admin:{pw}").as_bytes())), "YWRtaW46***");
        assert_eq!(m.text(&base64(format!("x:{pw}").as_bytes())), "eDpo***");
        assert!(m.text(&base64(format!("ab:{pw}").as_bytes())).contains(MASK));
        // A plain value has no other form.
        assert_eq!(Masker::new(["plainvalue".to_string()]).text("%20plainvalue"), "%20***");
    }

    #[test]
    fn text_is_masked_before_it_is_cut_and_never_cut_inside_a_mask() {
        let secret = "LONGSECRET-0123456789";
        let m = Masker::new([secret.to_string()]);
        assert_eq!(m.tail(&format!("xxxx{secret}yyyy"), 8, false), "x***yyyy");
        assert_eq!(m.tail(&format!("xxxx{secret}yyyy"), 6, false), "yyyy");
        assert_eq!(m.head(&format!("abc {secret} def"), 6, false), "abc ");
        assert_eq!(m.head(&format!("abc {secret} def"), 7, false), "abc ***");
        // The start of a tail may be the end of a value cut off: it goes.
        assert!(!m.tail(&format!("{}{}", &secret[5..], "z".repeat(100)), 100, true).contains("0123"));
        assert!(!m.head(&format!("{}{}", "z".repeat(100), &secret[..15]), 100, true).contains("LONGSEC"));
        // A long line split to be written keeps what may begin a value for
        // its next piece; a line that ends in a mask is written whole.
        let line = format!("{}LONGSEC", "a".repeat(40));
        let at = m.split_at(&line, 100);
        assert!(at > 0 && line[at..].ends_with("LONGSEC"), "{at}");
        let line = format!("{}{secret}", "a".repeat(40));
        assert_eq!(m.split_at(&line, 100), line.len());
        assert_eq!(Masker::default().split_at("abc", 10), 3);
        assert_eq!(Masker::default().tail("abcdef", 3, true), "def");
    }

    #[test]
    fn a_bad_secret_is_named() {
        let mut errs = Vec::new();
        let v = json!({"ok": {"env": "DB_PW"}, "both": {"env": "A", "file": "/f"}, "bad-name": {"env": "X"}, "n": 3});
        let got = parse(Some(&v), &mut |f: &str, m: String| errs.push(format!("{f}: {m}")));
        assert_eq!(got.get("ok"), Some(&SecretSource::Env("DB_PW".into())));
        assert!(errs.iter().any(|e| e.starts_with("secrets.both: expected exactly one")), "{errs:?}");
        assert!(errs.iter().any(|e| e.starts_with("secrets.bad-name: ")), "{errs:?}");
        assert!(errs.iter().any(|e| e.starts_with("secrets.n: expected {env: VAR}")), "{errs:?}");
    }
}
