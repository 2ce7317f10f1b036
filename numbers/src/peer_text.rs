//! Text that came from a peer (a worker's name, the reason of a `Failed`),
//! made safe to log or show: control characters escaped, so a newline cannot
//! forge a log line, and the length bounded, so a long string cannot flood
//! the log; a list a peer chose the length of is shown as its first few
//! items and a count ([`summarise`]).

/// Longest peer text kept in a log line or a summary, in characters.
pub const MAX_PEER_TEXT_CHARS: usize = 200;

/// `s` with every control character (newline, carriage return, escape, ...)
/// and every backslash escaped as Rust would write it, cut to `max_chars`
/// characters with the number of characters left off appended.
pub fn escape_peer_text(s: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max_chars * 2));
    let mut kept = 0usize;
    let mut chars = s.chars();
    for c in chars.by_ref() {
        if c.is_control() || c == '\\' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
        kept += 1;
        if kept == max_chars {
            break;
        }
    }
    let left = chars.count();
    if left > 0 {
        out.push_str(&format!("...({left} more characters)"));
    }
    out
}

/// [`escape_peer_text`] with [`MAX_PEER_TEXT_CHARS`].
pub fn peer_text(s: &str) -> String {
    escape_peer_text(s, MAX_PEER_TEXT_CHARS)
}

/// Text read from a run's files (a domain or split name) as one Markdown
/// table cell: [`peer_text`] with `|` escaped, so no name can end a row,
/// start a line or forge a "run complete".
pub fn table_cell(text: &str) -> String {
    peer_text(text).replace('|', "\\|")
}

/// Items of a peer-chosen list shown before the rest is counted.
pub const MAX_LISTED: usize = 8;

/// The first [`MAX_LISTED`] items of `items`, comma-separated, then how many
/// were left off: a partial listing 200,000 chunk ranges makes a line of a
/// few dozen characters, not of megabytes. Items are shown with `Display`
/// (escape peer strings first).
pub fn summarise<T: std::fmt::Display>(items: &[T]) -> String {
    let shown: Vec<String> = items.iter().take(MAX_LISTED).map(T::to_string).collect();
    let mut out = shown.join(", ");
    if items.len() > MAX_LISTED {
        out.push_str(&format!(", ... ({} more)", items.len() - MAX_LISTED));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newlines_and_escapes_cannot_reach_a_log_line() {
        let forged = "w0\n2026-11-30T16:00:00Z  INFO run complete\r\x1b[2K";
        let safe = peer_text(forged);
        assert!(!safe.chars().any(char::is_control), "{safe:?}");
        assert_eq!(
            safe,
            "w0\\n2026-11-30T16:00:00Z  INFO run complete\\r\\u{1b}[2K"
        );
        assert_eq!(
            peer_text("a\\nb"),
            "a\\\\nb",
            "a literal backslash stays distinguishable"
        );
    }

    #[test]
    fn long_lists_are_summarised() {
        assert_eq!(summarise(&[1, 2, 3]), "1, 2, 3");
        let many: Vec<u32> = (0..200_000).collect();
        assert_eq!(
            summarise(&many),
            "0, 1, 2, 3, 4, 5, 6, 7, ... (199992 more)"
        );
        assert_eq!(summarise::<u32>(&[]), "");
    }

    #[test]
    fn long_text_is_cut_with_a_count() {
        let long = "é".repeat(1000);
        let safe = escape_peer_text(&long, 10);
        assert_eq!(safe, format!("{}...(990 more characters)", "é".repeat(10)));
        assert_eq!(escape_peer_text("short", 10), "short");
        assert_eq!(escape_peer_text("exactly10!", 10), "exactly10!");
    }
}
