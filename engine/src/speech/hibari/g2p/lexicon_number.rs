//! The lexicon's number reading (misaki `get_number`): ordinals, years, digit runs, decimals and currency amounts.

use super::lexicon::{is_ascii_number, Lexicon, CURRENCIES};
use super::numbers as num;
use super::pystr::{self, decimal_value};

const ORDINALS: [&str; 4] = ["st", "nd", "rd", "th"];

fn currency_units(symbol: Option<&str>) -> Option<(&'static str, &'static str)> {
    let symbol = symbol?;
    CURRENCIES.iter().find(|(s, _, _)| *s == symbol).map(|&(_, unit, hundredth)| (unit, hundredth))
}

/// `is_currency`: an amount with at most two decimals.
fn is_currency(word: &str) -> bool {
    match word.split_once('.') {
        None => true,
        Some((_, cents)) => !cents.contains('.') && cents.chars().count() < 3,
    }
}

/// A number's words, split on runs of anything but letters (`re.split(r"[^a-z]+", ...)`).
fn letter_runs(text: &str) -> Vec<&str> {
    let pieces: Vec<&str> = text.split(|c: char| !c.is_ascii_lowercase()).collect();
    let last = pieces.len() - 1;
    let inner = pieces.iter().enumerate().filter(|&(i, p)| i == 0 || i == last || !p.is_empty());
    inner.map(|(_, p)| *p).collect()
}

/// The readings of number words, pushed in order.
struct Reading<'a> {
    lexicon: &'a Lexicon,
    parts: Vec<Option<String>>,
}

impl Reading<'_> {
    fn word(&mut self, w: &str, stress: Option<f64>) {
        self.parts.push(self.lexicon.lookup(w, None, stress, None));
    }

    /// `extend_num` on words already spelled out.
    fn words(&mut self, text: &str) {
        for w in letter_runs(text) {
            if w != "and" {
                self.word(w, if w == "point" { Some(-2.0) } else { None });
            }
        }
    }

    /// `extend_num` on digits, read as a cardinal (digit by digit where too long for an integer).
    fn cardinal(&mut self, digits: &str) {
        match num::parse_int(digits) {
            Some(n) => self.words(&num::cardinal(n)),
            None => digits.chars().for_each(|d| self.words(&num::cardinal(decimal_value(d).unwrap_or(0) as i128))),
        }
    }
}

impl Lexicon {
    /// `is_number`: digits with separators, an optional leading minus and a reading suffix.
    pub fn is_number(word: &str, is_head: bool) -> bool {
        if !word.chars().any(|c| c.is_ascii_digit()) {
            return false;
        }
        let mut body = word;
        for s in ["ing", "'d", "ed", "'s", "st", "nd", "rd", "th", "s"] {
            if let Some(b) = word.strip_suffix(s) {
                body = b;
                break;
            }
        }
        body.chars()
            .enumerate()
            .all(|(i, c)| c.is_ascii_digit() || c == ',' || c == '.' || (is_head && i == 0 && c == '-'))
    }

    /// `append_currency`: the currency's plural after a reading.
    pub(super) fn append_currency(&self, ps: String, currency: Option<&str>) -> String {
        let Some((unit, _)) = currency_units(currency) else { return ps };
        match self.stem_s(&format!("{unit}s"), None, None, None) {
            Some(c) if !c.is_empty() => format!("{ps} {c}"),
            _ => ps,
        }
    }

    /// `get_number`: the reading of a numeric token.
    pub fn get_number(&self, word: &str, currency: Option<&str>, is_head: bool) -> Option<String> {
        let suffix_len = word.chars().rev().take_while(|&c| c.is_ascii_lowercase() || c == '\'').count();
        let split = word.char_indices().rev().nth(suffix_len.saturating_sub(1)).map_or(word.len(), |(i, _)| i);
        let (mut word, suffix) = if suffix_len > 0 { (&word[..split], Some(&word[split..])) } else { (word, None) };
        let is_ordinal = suffix.is_some_and(|s| ORDINALS.contains(&s));
        let mut r = Reading { lexicon: self, parts: Vec::new() };
        if let Some(rest) = word.strip_prefix('-') {
            r.word("minus", None);
            word = rest;
        }
        let units = currency_units(currency);
        if is_ascii_number(word) && is_ordinal {
            r.words(&num::ordinal(num::parse_int(word).unwrap_or(0)));
        } else if r.parts.is_empty() && word.len() == 4 && units.is_none() && is_ascii_number(word) {
            r.words(&num::year(num::parse_int(word).unwrap_or(0)));
        } else if !is_head && !word.contains('.') {
            let digits = word.replace(',', "");
            let d: Vec<char> = digits.chars().collect();
            if d.first() == Some(&'0') || d.len() > 3 {
                d.iter().for_each(|c| r.cardinal(&c.to_string()));
            } else if d.len() == 3 && !digits.ends_with("00") {
                r.cardinal(&d[0].to_string());
                if d[1] == '0' {
                    r.word("O", Some(-2.0));
                    r.cardinal(&d[2].to_string());
                } else {
                    r.cardinal(pystr::tail(&digits, 1));
                }
            } else if !d.is_empty() {
                r.cardinal(&digits);
            }
        } else if word.matches('.').count() > 1 || !is_head {
            for part in word.replace(',', "").split('.') {
                let d: Vec<char> = part.chars().collect();
                if d.is_empty() {
                    continue;
                }
                if d[0] == '0' || (d.len() != 2 && d[1..].iter().any(|&c| c != '0')) {
                    d.iter().for_each(|c| r.cardinal(&c.to_string()));
                } else {
                    r.cardinal(part);
                }
            }
        } else if let Some((unit, hundredth)) = units.filter(|_| is_currency(word)) {
            let plain = word.replace(',', "");
            let mut pairs: Vec<(i128, &str)> = plain
                .split('.')
                .zip([unit, hundredth])
                .map(|(n, u)| (if n.is_empty() { 0 } else { num::parse_int(n).unwrap_or(0) }, u))
                .collect();
            if pairs.len() > 1 {
                if pairs[1].0 == 0 {
                    pairs.truncate(1);
                } else if pairs[0].0 == 0 {
                    pairs.remove(0);
                }
            }
            for (i, (n, u)) in pairs.into_iter().enumerate() {
                if i > 0 {
                    r.word("and", None);
                }
                r.words(&num::cardinal(n));
                let reading = if n.abs() != 1 && u != "pence" {
                    self.stem_s(&format!("{u}s"), None, None, None)
                } else {
                    self.lookup(u, None, None, None)
                };
                r.parts.push(reading);
            }
        } else {
            let text = if is_ascii_number(word) {
                num::cardinal(num::parse_int(word).unwrap_or(0))
            } else if !word.contains('.') {
                let n = num::parse_int(&word.replace(',', "")).unwrap_or(0);
                if is_ordinal {
                    num::ordinal(n)
                } else {
                    num::cardinal(n)
                }
            } else {
                let plain = word.replace(',', "");
                match plain.strip_prefix('.') {
                    Some(frac) => {
                        let digits: Vec<String> =
                            frac.chars().map(|c| num::cardinal(decimal_value(c).unwrap_or(0) as i128)).collect();
                        format!("point {}", digits.join(" "))
                    }
                    None => num::decimal(&plain),
                }
            };
            r.words(&text);
        }
        if r.parts.is_empty() {
            return None;
        }
        let result = r.parts.into_iter().map(Option::unwrap_or_default).collect::<Vec<_>>().join(" ");
        match suffix {
            Some("s" | "'s") => Lexicon::suffix_s(Some(result)),
            Some("ed" | "'d") => Lexicon::suffix_ed(Some(result)),
            Some("ing") => Lexicon::suffix_ing(Some(result)),
            _ => Some(result),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_number_shapes() {
        assert!(Lexicon::is_number("1,250", true));
        assert!(Lexicon::is_number("-5", true) && !Lexicon::is_number("-5", false));
        assert!(Lexicon::is_number("1990s", true) && Lexicon::is_number("21st", false));
        assert!(!Lexicon::is_number("abc", true) && !Lexicon::is_number("4ever", true));
        assert!(is_currency("9.99") && !is_currency("1.999") && !is_currency("1.2.3"));
        assert_eq!(
            letter_runs("one thousand, two hundred and five"),
            ["one", "thousand", "two", "hundred", "and", "five"]
        );
    }
}
