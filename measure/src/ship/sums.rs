//! `SHA256SUMS` merged by name: a ship adds or updates the lines of the
//! files it placed and keeps every other line there was (files shipped
//! before to the same directory, lines a person added), so one ship never
//! drops another's checksums.

/// The file name a `sha256sum` line checks (`HASH  NAME`, or `HASH *NAME`
/// in binary mode); `None` for a line of another shape, kept as it is.
fn name_of(line: &str) -> Option<&str> {
    let (hash, rest) = line.split_once(' ')?;
    let valid = hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit());
    let name = rest.strip_prefix(' ').or_else(|| rest.strip_prefix('*'))?;
    (valid && !name.is_empty()).then_some(name)
}

/// The merged file: `existing`'s lines for names not in `ours`, then
/// `ours` (`(sha256, name)`), sorted by line as `sha256sum` users expect
/// a stable order; every line ends with a newline.
pub fn merge(existing: &str, ours: &[(String, String)]) -> String {
    let mine = |name: &str| ours.iter().any(|(_, n)| n == name);
    let mut lines: Vec<String> = existing
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| name_of(l).is_none_or(|n| !mine(n)))
        .map(|l| format!("{l}\n"))
        .chain(ours.iter().map(|(hash, name)| format!("{hash}  {name}\n")))
        .collect();
    lines.sort_by(|a, b| {
        let key = |l: &String| name_of(l.trim_end_matches('\n')).map(str::to_string);
        key(a).cmp(&key(b)).then_with(|| a.cmp(b))
    });
    lines.concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(c: char) -> String {
        c.to_string().repeat(64)
    }

    #[test]
    fn other_lines_are_kept_and_ours_replace_theirs_by_name() {
        let existing = format!(
            "{}  old.gguf\n{} *b.gguf\nnot a checksum line\n\n{}  a.gguf\n",
            h('1'),
            h('2'),
            h('3')
        );
        let ours = [
            (h('a'), "a.gguf".to_string()),
            (h('c'), "c.gguf".to_string()),
        ];
        let merged = merge(&existing, &ours);
        assert_eq!(
            merged,
            format!(
                "not a checksum line\n{}  a.gguf\n{} *b.gguf\n{}  c.gguf\n{}  old.gguf\n",
                h('a'),
                h('2'),
                h('c'),
                h('1')
            )
        );
        assert_eq!(
            merge("", &ours),
            format!("{}  a.gguf\n{}  c.gguf\n", h('a'), h('c'))
        );
    }
}
