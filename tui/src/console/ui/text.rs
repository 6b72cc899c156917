//! Text fitted to a pane: wrapped at its width, scrolled to its height.

use super::theme::Theme;
use ratatui::text::Line;

/// `text` in lines of at most `width` characters, broken at spaces where
/// it can be and mid-word where it cannot; continuation lines keep the
/// first line's indentation. Nothing on screen is cut: what does not fit
/// on a line goes on the next.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(8);
    let indent = text.chars().take_while(|c| *c == ' ').count().min(width / 2);
    let mut out = Vec::new();
    let mut line = String::new();
    let mut len = 0;
    let room = |first: bool| if first { width } else { width - indent };
    for word in text.split_inclusive(' ') {
        let mut word = word;
        loop {
            let wl = word.chars().count();
            let fits = room(out.is_empty());
            if len + wl <= fits || (len + word.trim_end().chars().count() <= fits) {
                line.push_str(word);
                len += wl;
                break;
            }
            if len > 0 && wl <= room(false) {
                out.push(std::mem::take(&mut line).trim_end().to_string());
                len = 0;
                continue;
            }
            // A word longer than a line: cut it.
            let take = fits.saturating_sub(len).max(1);
            let cut = word.char_indices().nth(take).map_or(word.len(), |(i, _)| i);
            line.push_str(&word[..cut]);
            out.push(std::mem::take(&mut line));
            len = 0;
            word = &word[cut..];
            if word.is_empty() {
                break;
            }
        }
    }
    if !line.is_empty() || out.is_empty() {
        out.push(line.trim_end().to_string());
    }
    let pad = " ".repeat(indent);
    out.into_iter().enumerate().map(|(i, l)| if i == 0 { l } else { format!("{pad}{}", l.trim_start()) }).collect()
}

/// Rows of text (a JSON tree's lines, a log's) wrapped to `width` and
/// scrolled to fit `height`: to the last line when `tail`, else so that row
/// `sel` shows in full, highlighted.
pub fn scrolled(
    rows: &[String],
    width: usize,
    height: usize,
    sel: usize,
    tail: bool,
    theme: &Theme,
) -> Vec<Line<'static>> {
    let wrapped: Vec<Vec<String>> = rows.iter().map(|r| wrap(r, width)).collect();
    let total: usize = wrapped.iter().map(Vec::len).sum();
    let sel = sel.min(rows.len().saturating_sub(1));
    let through_sel: usize = wrapped.iter().take(sel + 1).map(Vec::len).sum();
    let first = if tail { total.saturating_sub(height) } else { through_sel.saturating_sub(height) };
    let mut lines = Vec::new();
    let mut n = 0;
    for (i, parts) in wrapped.into_iter().enumerate() {
        for part in parts {
            if n >= first && lines.len() < height {
                let selected = i == sel && !tail;
                lines.push(if selected { Line::styled(part, theme.selected()) } else { Line::from(part) });
            }
            n += 1;
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::wrap;

    #[test]
    fn long_text_wraps_at_spaces_and_nothing_is_lost() {
        assert_eq!(wrap("one two three four", 9), ["one two", "three", "four"]);
        assert_eq!(wrap("    key: a long value here", 16), ["    key: a long", "    value here"]);
        assert_eq!(wrap("abcdefghijklmnopqrstuvwxyz", 10), ["abcdefghij", "klmnopqrst", "uvwxyz"]);
        assert_eq!(wrap("", 10), [""]);
        let text = "step \"write\" (#0) failed: command ended with exit code 1; stderr: FATAL: disk quota exceeded";
        let lines = wrap(text, 30);
        assert!(lines.iter().all(|l| l.chars().count() <= 30), "{lines:?}");
        assert_eq!(lines.join(" ").split_whitespace().collect::<Vec<_>>(), text.split_whitespace().collect::<Vec<_>>());
    }
}
