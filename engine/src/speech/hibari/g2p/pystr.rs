//! Python's `str` semantics where the reference's rules depend on them: letters, digits, case, spaces.

use std::sync::LazyLock;

use fancy_regex::Regex;

/// Python's `\w` in a str pattern: letters, numbers and the underscore.
pub const WORD: &str = r"[\p{L}\p{N}_]";
/// The members of `WORD`, to put in a larger class.
pub const WORD_CHARS: &str = r"\p{L}\p{N}_";
/// Python's `[^\W\d_]`: word characters that are neither decimal digits nor the underscore.
pub const LETTER: &str = r"[\p{L}\p{Nl}\p{No}]";
/// Python's `[^\W_]`.
pub const ALNUM: &str = r"[\p{L}\p{N}]";
/// Python's `\b`, whose word characters differ from the regex crate's (marks, other numbers).
pub const BOUNDARY: &str = r"(?:(?<=[\p{L}\p{N}_])(?![\p{L}\p{N}_])|(?<![\p{L}\p{N}_])(?=[\p{L}\p{N}_]))";

static LETTER_CHAR: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^\p{L}$").expect("letter class"));
static DECIMAL_CHAR: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^\p{Nd}$").expect("digit class"));

fn matches(re: &Regex, c: char) -> bool {
    let mut buf = [0u8; 4];
    re.is_match(c.encode_utf8(&mut buf)).unwrap_or(false)
}

/// `c.isalpha()`: a letter of any general category L*.
pub fn is_alpha(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphabetic();
    }
    matches(&LETTER_CHAR, c)
}

/// `c.isdecimal()`, which is also what Python's `\d` matches.
pub fn is_decimal(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_digit();
    }
    matches(&DECIMAL_CHAR, c)
}

/// `c.isdigit()`: decimal digits and the digit-like numbers (superscripts, circled digits).
pub fn is_digit(c: char) -> bool {
    is_decimal(c)
        || matches!(c, '²' | '³' | '¹' | '⁰' | '⁴'..='⁹' | '₀'..='₉' | '①'..='⑨' | '⑴'..='⑼' | '⒈'..='⒐')
        || matches!(c, '⓵'..='⓽' | '❶'..='❾' | '➀'..='➈' | '➊'..='➒' | '🄀'..='🄊')
}

/// The value of a decimal digit; Unicode keeps each script's digits in aligned runs of ten.
pub fn decimal_value(c: char) -> Option<u32> {
    if c.is_ascii_digit() {
        return c.to_digit(10);
    }
    if !is_decimal(c) {
        return None;
    }
    let mut count = 0;
    let mut cp = c as u32;
    while cp > 0 && char::from_u32(cp - 1).is_some_and(is_decimal) {
        count += 1;
        cp -= 1;
    }
    Some(count % 10)
}

/// `c.isspace()`.
pub fn is_space(c: char) -> bool {
    matches!(c, '\t'..='\r' | '\x1c'..='\x1f' | ' ' | '\u{85}' | '\u{a0}' | '\u{1680}' | '\u{2000}'..='\u{200a}')
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202f}' | '\u{205f}' | '\u{3000}')
}

/// `s.strip()`.
pub fn strip(s: &str) -> &str {
    s.trim_matches(is_space)
}

/// `s.isalpha()`.
pub fn str_is_alpha(s: &str) -> bool {
    !s.is_empty() && s.chars().all(is_alpha)
}

/// `s.isdigit()`.
pub fn str_is_digit(s: &str) -> bool {
    !s.is_empty() && s.chars().all(is_digit)
}

/// Whether `c` is a titlecase letter (general category Lt: the digraphs ǅ ǈ ǋ ǲ and Greek with prosgegrammeni).
pub fn is_title_char(c: char) -> bool {
    matches!(c, '\u{1c5}' | '\u{1c8}' | '\u{1cb}' | '\u{1f2}' | '\u{1fbc}' | '\u{1fcc}' | '\u{1ffc}')
        || matches!(c, '\u{1f88}'..='\u{1f8f}' | '\u{1f98}'..='\u{1f9f}' | '\u{1fa8}'..='\u{1faf}')
}

/// `s.islower()`: some cased character and none uppercase or titlecase.
pub fn str_is_lower(s: &str) -> bool {
    let mut cased = false;
    for c in s.chars() {
        if c.is_uppercase() || is_title_char(c) {
            return false;
        }
        cased |= c.is_lowercase();
    }
    cased
}

/// `s.isupper()`: some cased character and none lowercase or titlecase.
pub fn str_is_upper(s: &str) -> bool {
    let mut cased = false;
    for c in s.chars() {
        if c.is_lowercase() || is_title_char(c) {
            return false;
        }
        cased |= c.is_uppercase();
    }
    cased
}

/// `s.lower()`.
pub fn lower(s: &str) -> String {
    s.to_lowercase()
}

/// `s.upper()`.
pub fn upper(s: &str) -> String {
    s.to_uppercase()
}

/// `s.capitalize()`: the first character titlecased, the rest lower.
pub fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    let Some(first) = chars.next() else { return String::new() };
    let title = match first {
        'Ǆ'..='ǆ' => Some('ǅ'),
        'Ǉ'..='ǉ' => Some('ǈ'),
        'Ǌ'..='ǌ' => Some('ǋ'),
        'Ǳ'..='ǳ' => Some('ǲ'),
        _ => None,
    };
    let mut out: String = match title {
        Some(t) => t.to_string(),
        None => first.to_uppercase().collect(),
    };
    out.push_str(&chars.as_str().to_lowercase());
    out
}

/// Whether `c == c.lower()` for one character.
pub fn char_is_own_lower(c: char) -> bool {
    let mut lowered = c.to_lowercase();
    lowered.next() == Some(c) && lowered.next().is_none()
}

/// `len(s)` in code points.
pub fn len(s: &str) -> usize {
    s.chars().count()
}

/// Byte offset of the code point `n` from the start (or the end of `s`).
fn offset(s: &str, n: usize) -> usize {
    s.char_indices().nth(n).map_or(s.len(), |(i, _)| i)
}

/// Byte offset where the last `n` code points begin.
fn offset_from_end(s: &str, n: usize) -> usize {
    if n == 0 {
        return s.len();
    }
    s.char_indices().rev().nth(n - 1).map_or(0, |(i, _)| i)
}

/// `s[:n]`.
pub fn head(s: &str, n: usize) -> &str {
    &s[..offset(s, n)]
}

/// `s[n:]`.
pub fn tail(s: &str, n: usize) -> &str {
    &s[offset(s, n)..]
}

/// `s[-n:]`.
pub fn last(s: &str, n: usize) -> &str {
    &s[offset_from_end(s, n)..]
}

/// `s[:-n]`.
pub fn drop_last(s: &str, n: usize) -> &str {
    &s[..offset_from_end(s, n)]
}

/// `s[i]` for a code point index from the end (`s[-i]`, 1-based).
pub fn nth_from_end(s: &str, i: usize) -> Option<char> {
    s.chars().rev().nth(i.checked_sub(1)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_case_predicates_follow_python() {
        assert!(str_is_lower("abc'd") && !str_is_lower("'") && !str_is_lower("aB"));
        assert!(str_is_upper("AT&T") && !str_is_upper("123") && !str_is_upper("Ab"));
        assert_eq!(capitalize("hELLO"), "Hello");
        assert_eq!(capitalize("ǆx"), "ǅx");
        assert!(!str_is_lower("dǅ") && !str_is_upper("Dǅ"));
        assert!(str_is_alpha("café") && !str_is_alpha("can't") && !str_is_alpha(""));
        assert!(str_is_digit("12²") && !str_is_digit("1.5"));
    }

    #[test]
    fn test_slices_count_code_points() {
        assert_eq!(last("naïve", 3), "ïve");
        assert_eq!(drop_last("naïve", 2), "naï");
        assert_eq!(head("ɹˈid", 2), "ɹˈ");
        assert_eq!(tail("ɹˈid", 2), "id");
        assert_eq!(nth_from_end("ɹˈid", 2), Some('i'));
        assert_eq!(decimal_value('٣'), Some(3));
    }
}
