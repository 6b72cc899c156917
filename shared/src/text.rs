//! Text an operator reads in one line: an error in a table, a history row,
//! an alert's summary. Every place that shortens text does it here, so a cut
//! always looks the same (`…` where text was left out), and never inside
//! a secret's mask (`***`): text is masked before it is cut.

/// `text` on one line: runs of whitespace (newlines included) become one
/// space, and at most `max` characters are kept, the last of them `…` when
/// anything was cut.
pub fn one_line(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max.saturating_mul(4)));
    let mut n = 0;
    for word in text.split_whitespace() {
        let sep = usize::from(n > 0);
        let len = word.chars().count();
        if n + sep + len > max {
            if max == 0 {
                return out;
            }
            if n == max {
                // Full to the edge: its last character gives way to the `…`.
                out.pop();
            }
            if n + sep < max {
                if sep == 1 {
                    out.push(' ');
                }
                let end = word.char_indices().nth(max - n - sep - 1).map_or(word.len(), |(i, _)| i);
                out.push_str(until(word, end));
            }
            out.push('…');
            return out;
        }
        if sep == 1 {
            out.push(' ');
        }
        out.push_str(word);
        n += sep + len;
    }
    out
}

/// `s` up to byte `end` (moved back to a character's start), never ending
/// inside a run of `*`: a secret's mask (`***`) cut in two is left out.
pub fn until(s: &str, end: usize) -> &str {
    let mut at = end.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    let (head, rest) = s.split_at(at);
    if rest.starts_with('*') {
        head.trim_end_matches('*')
    } else {
        head
    }
}

/// `s` from byte `start` on (moved on to a character's start), never
/// beginning inside a run of `*`: a mask cut in two is left out.
pub fn since(s: &str, start: usize) -> &str {
    let mut at = start.min(s.len());
    while !s.is_char_boundary(at) {
        at += 1;
    }
    let (head, rest) = s.split_at(at);
    if head.ends_with('*') {
        rest.trim_start_matches('*')
    } else {
        rest
    }
}

/// The known name closest to `name`, when one is close enough to be what
/// was meant (a typo: at most a third of its letters differ): for "did you
/// mean …?". Swapped letters count as one change.
pub fn closest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(1);
    known
        .iter()
        .map(|k| (strsim::osa_distance(name, k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// The last `n` non-blank lines of `text`, in the order they were written,
/// each on one line of at most `width` characters.
pub fn last_lines(text: &str, n: usize, width: usize) -> Vec<String> {
    let mut lines: Vec<String> =
        text.lines().rev().filter(|l| !l.trim().is_empty()).take(n).map(|l| one_line(l, width)).collect();
    lines.reverse();
    lines
}

/// The text of an HTML (or XML) document without its markup, scripts and
/// styles: what a person would read of an error page.
pub fn strip_markup(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut rest = html;
    while let Some(open) = rest.find('<') {
        out.push_str(&rest[..open]);
        out.push(' ');
        let tag = &rest[open..];
        let lower: String = tag.chars().take(8).collect::<String>().to_ascii_lowercase();
        // A script's or a style's body is not text.
        let skip_to = ["script", "style"].iter().find(|t| lower[1..].starts_with(*t)).map(|t| format!("</{t}"));
        rest = match skip_to {
            Some(end) => match tag.to_ascii_lowercase().find(&end) {
                Some(i) => tag[i..].find('>').map_or("", |j| &tag[i + j + 1..]),
                None => "",
            },
            None => tag.find('>').map_or("", |i| &tag[i + 1..]),
        };
    }
    out.push_str(rest);
    for (entity, ch) in
        [("&nbsp;", " "), ("&lt;", "<"), ("&gt;", ">"), ("&quot;", "\""), ("&#39;", "'"), ("&amp;", "&")]
    {
        out = out.replace(entity, ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_joins_lines_and_cuts_with_an_ellipsis() {
        assert_eq!(one_line("a\n  b\tc\n", 80), "a b c");
        assert_eq!(one_line("abcdef ghij", 8), "abcdef …");
        assert_eq!(one_line("abcdefghij", 5), "abcd…");
        assert_eq!(one_line("abc def", 7), "abc def");
        assert_eq!(one_line("ab cd", 3), "ab…");
        assert_eq!(one_line("", 5), "");
        assert_eq!(one_line("abc def", 3), "ab…", "full to the edge, then cut");
        assert!(one_line(&"x ".repeat(500), 100).chars().count() <= 100);
        // A mask is never cut in two.
        assert_eq!(one_line("abc***def", 5), "abc…");
        assert_eq!(one_line("ab***", 5), "ab***");
    }

    #[test]
    fn a_cut_keeps_masks_whole_and_characters_whole() {
        assert_eq!(until("key=***;", 5), "key=");
        assert_eq!(until("key=***;", 7), "key=***");
        assert_eq!(until("héllo", 2), "h");
        assert_eq!(since("***tail", 1), "tail");
        assert_eq!(since("***tail", 0), "***tail");
        assert_eq!(since("a***b", 1), "***b");
        assert_eq!(since("héllo", 2), "llo");
        assert_eq!(since("abc", 9), "");
    }

    #[test]
    fn the_closest_name_is_offered_only_when_close() {
        assert_eq!(closest("parms", &["params", "steps", "name"]), Some("params"));
        assert_eq!(closest("stpes", &["params", "steps"]), Some("steps"));
        assert_eq!(closest("zzz", &["params", "steps"]), None);
    }

    #[test]
    fn last_lines_keep_their_order() {
        assert_eq!(last_lines("line1\nline2\n\n", 5, 80), ["line1", "line2"]);
        assert_eq!(last_lines("a\nb\nc\nd\n", 2, 80), ["c", "d"]);
        assert_eq!(last_lines(&"y".repeat(300), 1, 10), ["yyyyyyyyy…"]);
    }

    #[test]
    fn markup_is_stripped_to_what_a_person_reads() {
        let page = "<html><head><title>501 Not Implemented</title><style>h1 {color: red}</style>\
                    <script>var x = '<b>';</script></head><body><h1>Not&nbsp;Implemented</h1>\
                    <p>POST to /deploy is not supported &amp; never was.</p></body></html>";
        assert_eq!(
            one_line(&strip_markup(page), 200),
            "501 Not Implemented Not Implemented POST to /deploy is not supported & never was."
        );
    }
}
