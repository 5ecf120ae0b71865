//! Python `re` calls over fancy-regex (backtracking, look-around), with the reference's escaping.

use fancy_regex::{Captures, Regex};

use super::G2pError;

/// Python's `\s`: the regex crate's whitespace plus the information separators.
pub const SPACE: &str = r"[\s\x1c-\x1f]";
/// Python's `\S`.
pub const NOT_SPACE: &str = r"[^\s\x1c-\x1f]";

/// Compiles a pattern written for Python's `re`; an error names the pattern.
pub fn compile(pattern: &str) -> Result<Regex, G2pError> {
    Regex::new(pattern)
        .map_err(|e| G2pError::Pattern { pattern: pattern.chars().take(120).collect(), reason: e.to_string() })
}

/// `re.escape`: every ASCII punctuation character escaped, but `<` and `>` (word boundaries when escaped).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if c.is_ascii_punctuation() && c != '<' && c != '>' && c != '_' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The characters of `text` escaped for use inside a character class.
pub fn escape_class(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if c.is_ascii_punctuation() {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Alternatives longest first, as the reference's `_alt` sorts its word lists (stable).
pub fn alternation<'a>(words: impl IntoIterator<Item = &'a str>) -> String {
    let mut words: Vec<&str> = words.into_iter().collect();
    words.sort_by_key(|w| std::cmp::Reverse(w.chars().count()));
    words.iter().map(|w| escape(w)).collect::<Vec<_>>().join("|")
}

/// `re.sub(pattern, fn, text)`; a match the engine gives up on leaves the text as it was.
pub fn sub(re: &Regex, text: &str, f: impl FnMut(&Captures<'_, str>) -> String) -> String {
    re.try_replacen(text, 0, f).map_or_else(|_| text.to_string(), |s| s.into_owned())
}

/// `re.sub(pattern, literal, text)`.
pub fn sub_literal(re: &Regex, text: &str, literal: &str) -> String {
    sub(re, text, |_| literal.to_string())
}

/// `re.finditer(...)` as byte ranges.
pub fn find_ranges(re: &Regex, text: &str) -> Vec<(usize, usize)> {
    re.find_iter(text).map_while(Result::ok).map(|m| (m.start(), m.end())).collect()
}

/// `re.findall(pattern, text)` for a pattern without groups.
pub fn find_all<'t>(re: &Regex, text: &'t str) -> Vec<&'t str> {
    find_ranges(re, text).into_iter().map(|(s, e)| &text[s..e]).collect()
}

/// `re.split(pattern, text)` for a pattern without groups.
pub fn split<'t>(re: &Regex, text: &'t str) -> Vec<&'t str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (s, e) in find_ranges(re, text) {
        out.push(&text[start..s]);
        start = e;
    }
    out.push(&text[start..]);
    out
}

/// `re.match` / `re.search` as a boolean.
pub fn is_match(re: &Regex, text: &str) -> bool {
    re.is_match(text).unwrap_or(false)
}

/// Group `i` of a match as text; None where the group did not take part.
pub fn group<'t>(caps: &Captures<'t, str>, i: usize) -> Option<&'t str> {
    caps.get(i).map(|m| m.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_escaped_class_matches_its_characters_only() {
        let re = compile(&format!("^[{}]+$", escape_class("…,:;!?()[]{}<>_#*&-~^\\"))).unwrap();
        assert!(is_match(&re, "[]{}-~^&\\#"));
        assert!(!is_match(&re, "a"));
        let lit = compile(&format!("^{}$", escape("a.b+<c>"))).unwrap();
        assert!(is_match(&lit, "a.b+<c>"));
    }

    #[test]
    fn test_split_and_findall_follow_python() {
        let re = compile(r"(?<=[,;])\s+").unwrap();
        assert_eq!(split(&re, "a, b; c d"), vec!["a,", "b;", "c d"]);
        let words = compile(r"[a-z]+").unwrap();
        assert_eq!(find_all(&words, "ab 1 cd"), vec!["ab", "cd"]);
    }
}
