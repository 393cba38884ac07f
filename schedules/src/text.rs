//! Outside text inside error messages.
//!
//! Errors render as one line (a command line prints them after `tensortune:`), but a spec or
//! a trace can carry any character. [`single_line`] escapes the ones that would break the line
//! or reach the terminal as control sequences, and leaves all other text as typed.
//!
//! ```
//! use tensortune_schedules::text::single_line;
//! assert_eq!(single_line("matmul:M=1\nN=2"), "matmul:M=1\\nN=2");
//! assert_eq!(single_line("café"), "café");
//! ```

use std::borrow::Cow;

/// `text` with control characters (C0, DEL, C1: newlines, carriage returns, NUL, escape) and
/// the Unicode line and paragraph separators written as Rust escapes (`\n`, `\u{1b}`).
pub fn single_line(text: &str) -> Cow<'_, str> {
    let breaks = |c: char| c.is_control() || c == '\u{2028}' || c == '\u{2029}';
    if !text.contains(breaks) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if breaks(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::single_line;

    #[test]
    fn escapes_what_breaks_a_line_and_keeps_the_rest() {
        assert_eq!(
            single_line("a\r\nb\0c\u{1b}[2J"),
            "a\\r\\nb\\u{0}c\\u{1b}[2J"
        );
        assert_eq!(single_line("x\u{2028}y\u{85}"), "x\\u{2028}y\\u{85}");
        assert_eq!(
            single_line("M=64, dtype=f32 \u{e9}\u{1d54f}"),
            "M=64, dtype=f32 \u{e9}\u{1d54f}"
        );
        assert!(matches!(
            single_line("plain"),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
