//! Normalization before tokenizing (times, dates, units, abbreviations, currencies, symbols) from normalize.json.

use std::collections::HashMap;
use std::path::Path;

use fancy_regex::{Captures, Regex};
use serde::Deserialize;

use super::files::{self, Ordered};
use super::numbers as num;
use super::pyre::{self, alternation, compile, group, sub, sub_literal, NOT_SPACE, SPACE};
use super::pystr::{BOUNDARY as B, WORD, WORD_CHARS as W};
use super::G2pError;

const NUM: &str = r"\d+(?:,\d{3})*(?:\.\d+)?";
const ROMAN_NUMERAL: &str = r"((?=[IVXLC])M{0,3}(?:CM|CD|D?C{0,3})(?:XC|XL|L?X{0,3})(?:IX|IV|V?I{0,3}))";
const FRACTIONS: [&str; 11] =
    ["", "", "half", "third", "quarter", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth"];

#[derive(Deserialize)]
struct Tables {
    months: Ordered<String>,
    titles: HashMap<String, String>,
    abbreviations: HashMap<String, String>,
    units: HashMap<String, [String; 2]>,
    symbols: Ordered<String>,
    currency: HashMap<String, [String; 2]>,
    roman_cardinal: Vec<String>,
    roman_ordinal: Vec<String>,
}

/// A symbol's pattern and the text that replaces it.
struct SymbolRule {
    symbol: String,
    re: Regex,
    replacement: String,
}

/// The normalizer: normalize.json's tables and the patterns built from them.
pub struct Normalizer {
    tables: Tables,
    month_names: Vec<String>,
    ws: Regex,
    time: Regex,
    date_us: Regex,
    date_iso: Regex,
    month_day: Regex,
    day_month: Regex,
    unit: Regex,
    deg: Regex,
    cents: Regex,
    currency: Regex,
    big_money: Regex,
    title: Regex,
    abbrev: Regex,
    no: Regex,
    hash: Regex,
    roman_cardinal: Regex,
    roman_ordinal: Regex,
    phone: Regex,
    range: Regex,
    fraction: Regex,
    plus: Regex,
    space_punct: Regex,
    symbols: Vec<SymbolRule>,
}

/// Whether `_plural` takes the singular for this number.
fn is_one(n_text: &str) -> bool {
    matches!(n_text.replace(',', "").as_str(), "1" | "1.0" | "-1")
}

/// `_plural`: the singular for one, else the plural.
fn plural<'a>(n_text: &str, words: &'a [String; 2]) -> &'a str {
    if is_one(n_text) {
        &words[0]
    } else {
        &words[1]
    }
}

fn roman_value(s: &str) -> i128 {
    let value = |c: char| match c {
        'I' => 1,
        'V' => 5,
        'X' => 10,
        'L' => 50,
        'C' => 100,
        'D' => 500,
        'M' => 1000,
        _ => 0,
    };
    let chars: Vec<char> = s.chars().collect();
    let mut total = 0;
    for (i, &c) in chars.iter().enumerate() {
        let v = value(c);
        total += if i + 1 < chars.len() && value(chars[i + 1]) > v { -v } else { v };
    }
    total
}

fn int(s: &str) -> i128 {
    num::parse_int(s).unwrap_or(0)
}

/// "k", "m", "b" as the scale words they abbreviate; other words stay.
fn scale_word(big: &str) -> &str {
    match big.to_lowercase().as_str() {
        "k" => "thousand",
        "m" => "million",
        "b" => "billion",
        _ => big,
    }
}

impl Normalizer {
    pub fn load(dir: &Path) -> Result<Normalizer, G2pError> {
        let tables: Tables = files::json(dir, "normalize.json")?;
        let month_names: Vec<String> = tables.months.0.iter().map(|(_, v)| v.clone()).collect();
        let mut month_words: Vec<String> = month_names.clone();
        month_words.extend(tables.months.keys().map(super::pystr::capitalize));
        month_words.push("Sept".into());
        let months = alternation(month_words.iter().map(String::as_str));
        let units = alternation(tables.units.keys().map(String::as_str));
        let titles = alternation(tables.titles.keys().map(String::as_str));
        let abbrev = alternation(tables.abbreviations.keys().map(String::as_str));
        let roman_c = alternation(tables.roman_cardinal.iter().map(String::as_str));
        let roman_o = alternation(tables.roman_ordinal.iter().map(String::as_str));
        let mut symbols = Vec::new();
        for (symbol, word) in &tables.symbols.0 {
            let esc = pyre::escape(symbol);
            let pattern = if "=<>~".contains(symbol.as_str()) {
                format!(r"(?<={NOT_SPACE}) ?{esc} ?(?={NOT_SPACE})")
            } else {
                esc
            };
            let replacement = if word.is_empty() { " ".to_string() } else { format!(" {word} ") };
            symbols.push(SymbolRule { symbol: symbol.clone(), re: compile(&pattern)?, replacement });
        }
        Ok(Normalizer {
            month_names,
            ws: compile(&format!("{SPACE}+"))?,
            time: compile(&format!(
                r"{B}(\d{{1,2}}):(\d{{2}})(?::(\d{{2}}))?(?:{SPACE}?([AaPp])\.?[Mm]\.?(?![A-Za-z]))?(?!\d)"
            ))?,
            date_us: compile(&format!(r"{B}(\d{{1,2}})/(\d{{1,2}})/(\d{{4}}|\d{{2}}){B}"))?,
            date_iso: compile(&format!(r"{B}(\d{{4}})-(\d{{2}})-(\d{{2}}){B}"))?,
            month_day: compile(&format!(r"{B}({months})\.? (\d{{1,2}})(?:st|nd|rd|th)?{B}(?![\d:%])(,? \d{{4}}{B})?"))?,
            day_month: compile(&format!(r"{B}(the )?(\d{{1,2}}) (?:of )?({months}){B}\.?"))?,
            unit: compile(&format!(r"(?<![{W}.])(-?{NUM}){SPACE}?({units})(?!{WORD})"))?,
            deg: compile(&format!(r"(?<![{W}.])(-?{NUM}){SPACE}?°{SPACE}?([CF])?(?!{WORD})"))?,
            cents: compile(&format!(r"(?<![{W}.])({NUM}){SPACE}?¢"))?,
            currency: compile(&format!(
                r"(?<!{WORD})([¥₹₩]|Rs\.?|USD|EUR|GBP){SPACE}?({NUM})(?:{SPACE}?(hundred|thousand|million|billion|trillion|[kKmMbB]{B}))?"
            ))?,
            big_money: compile(&format!(
                r"([$£€])({NUM}){SPACE}?(hundred|thousand|million|billion|trillion|[kKmMbB]{B})"
            ))?,
            title: compile(&format!(r"{B}({titles})\.? (?=[A-Z])"))?,
            abbrev: compile(&format!(r"(?<![{W}.])({abbrev})(?!{WORD})"))?,
            no: compile(&format!(r"{B}(No|Nos)\. ?(?=\d)"))?,
            hash: compile(&format!(r"(?<![{W}\&])#(?=\d)"))?,
            roman_cardinal: compile(&format!(r"{B}({roman_c}) {ROMAN_NUMERAL}{B}(?![.'’]{WORD})"))?,
            roman_ordinal: compile(&format!(r"{B}({roman_o}) {ROMAN_NUMERAL}{B}(?![.'’]{WORD})"))?,
            phone: compile(&format!(r"(?<![{W}.\-])(?:\d{{3}}-)?\d{{3}}-\d{{4}}(?![{W}.\-])"))?,
            range: compile(&format!(r"(?<![{W}.\-])(\d{{1,4}}){SPACE}?[-–]{SPACE}?(\d{{1,4}})(?![{W}.\-%])"))?,
            fraction: compile(&format!(r"(?<![{W}./])(\d{{1,2}})/(\d{{1,2}})(?![{W}./])"))?,
            plus: compile(&format!(r"(?<![{W}+])\+(?=\d)"))?,
            space_punct: compile(r" +([,.;:!?])")?,
            symbols,
            tables,
        })
    }

    /// Whether a word before a period is a title ("Dr", "St"), which does not end a sentence.
    pub fn is_title(&self, word: &str) -> bool {
        self.tables.titles.contains_key(word)
    }

    /// `_date`: "March fourteenth, 2015"; None for an impossible month or day.
    fn date(&self, year: Option<&str>, month: i128, day: i128) -> Option<String> {
        if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
            return None;
        }
        let name = self.month_names.get((month - 1) as usize)?;
        let year = year.map(|y| format!(", {y}")).unwrap_or_default();
        Some(format!("{name} {}{year}", num::ordinal(day)))
    }

    fn month_name(&self, month: &str) -> String {
        let key: String = month.to_lowercase().chars().take(3).collect();
        self.tables.months.get(&key).cloned().unwrap_or_default()
    }

    fn time(&self, caps: &Captures<'_, str>, text: &str) -> String {
        let whole = group(caps, 0).unwrap_or_default();
        let (h, mi) = (int(group(caps, 1).unwrap_or("0")), int(group(caps, 2).unwrap_or("0")));
        let sec = group(caps, 3);
        let ap = group(caps, 4);
        if h > 24 || mi > 59 || sec.is_some_and(|s| int(s) > 59) {
            return whole.to_string();
        }
        let mut words = num::cardinal(h);
        if mi == 0 {
            if ap.is_none() && sec.is_none() {
                words.push_str(" o'clock");
            }
        } else if mi < 10 {
            words.push_str(&format!(" oh {}", num::cardinal(mi)));
        } else {
            words.push_str(&format!(" {}", num::cardinal(mi)));
        }
        if let Some(sec) = sec {
            let s = int(sec);
            words.push_str(&format!(" and {}{}", num::cardinal(s), if s == 1 { " second" } else { " seconds" }));
        }
        if let Some(ap) = ap {
            // Dotted so the lexicon spells the letters.
            let end = caps.get(0).map_or(0, |m| m.end());
            let dot = if text[end..].starts_with('.') { "" } else { "." };
            words.push_str(&format!(" {}.M{dot}", ap.to_uppercase()));
        }
        words
    }

    fn date_us(&self, caps: &Captures<'_, str>) -> String {
        let (a, b) = (int(group(caps, 1).unwrap_or("0")), int(group(caps, 2).unwrap_or("0")));
        let mut year = group(caps, 3).unwrap_or_default().to_string();
        if year.len() == 2 {
            year = format!("{}{year}", if int(&year) > 30 { "19" } else { "20" });
        }
        let (month, day) = if a <= 12 { (a, b) } else { (b, a) };
        self.date(Some(&year), month, day).unwrap_or_else(|| group(caps, 0).unwrap_or_default().to_string())
    }

    fn date_iso(&self, caps: &Captures<'_, str>) -> String {
        let (month, day) = (int(group(caps, 2).unwrap_or("0")), int(group(caps, 3).unwrap_or("0")));
        self.date(group(caps, 1), month, day).unwrap_or_else(|| group(caps, 0).unwrap_or_default().to_string())
    }

    fn month_day(&self, caps: &Captures<'_, str>) -> String {
        let day = int(group(caps, 2).unwrap_or("0"));
        if !(1..=31).contains(&day) {
            return group(caps, 0).unwrap_or_default().to_string();
        }
        let month = self.month_name(group(caps, 1).unwrap_or_default());
        format!("{month} {}{}", num::ordinal(day), group(caps, 3).unwrap_or_default())
    }

    fn day_month(&self, caps: &Captures<'_, str>) -> String {
        let day = int(group(caps, 2).unwrap_or("0"));
        if !(1..=31).contains(&day) {
            return group(caps, 0).unwrap_or_default().to_string();
        }
        format!("the {} of {}", num::ordinal(day), self.month_name(group(caps, 3).unwrap_or_default()))
    }

    fn currency_words(&self, symbol: &str) -> [String; 2] {
        self.tables.currency.get(symbol).cloned().unwrap_or_default()
    }

    fn currency(&self, caps: &Captures<'_, str>) -> String {
        let symbol = group(caps, 1).unwrap_or_default().trim_end_matches('.');
        let n = group(caps, 2).unwrap_or_default();
        let words = self.currency_words(symbol);
        match group(caps, 3) {
            Some(big) => format!("{n} {} {}", scale_word(big), words[1]),
            None => format!("{n} {}", plural(n, &words)),
        }
    }

    fn big_money(&self, caps: &Captures<'_, str>) -> String {
        let words = self.currency_words(group(caps, 1).unwrap_or_default());
        let (n, big) = (group(caps, 2).unwrap_or_default(), group(caps, 3).unwrap_or_default());
        format!("{n} {} {}", scale_word(big), words[1])
    }

    fn fraction(&self, caps: &Captures<'_, str>) -> String {
        let (a, b) = (int(group(caps, 1).unwrap_or("0")), int(group(caps, 2).unwrap_or("0")));
        if 0 < a && a < b && b <= 10 {
            let unit = FRACTIONS[b as usize];
            if unit == "half" {
                return if a == 1 { "one half".into() } else { format!("{a} halves") };
            }
            return format!("{a} {unit}{}", if a == 1 { "" } else { "s" });
        }
        if (1..=12).contains(&a) && (1..=31).contains(&b) {
            return self.date(None, a, b).unwrap_or_default();
        }
        format!("{a} slash {b}")
    }

    /// The reference's `normalize(text)`.
    pub fn normalize(&self, text: &str) -> String {
        let text = sub_literal(&self.ws, text, " ");
        let text = super::pystr::strip(&text);
        if text.is_empty() {
            return String::new();
        }
        let t = text
            .replace('\u{a0}', " ")
            .replace('\u{2019}', "'")
            .replace('\u{2012}', "-")
            .replace('\u{2015}', "\u{2014}");
        let t = sub(&self.time, &t, |c| self.time(c, &t));
        let t = sub(&self.date_iso, &t, |c| self.date_iso(c));
        let t = sub(&self.date_us, &t, |c| self.date_us(c));
        let t = sub(&self.big_money, &t, |c| self.big_money(c));
        let cents = self.currency_words("¢");
        let t = sub(&self.cents, &t, |c| {
            let n = group(c, 1).unwrap_or_default();
            format!("{n} {}", plural(n, &cents))
        });
        let t = sub(&self.currency, &t, |c| self.currency(c));
        let t = sub(&self.deg, &t, |c| {
            let n = group(c, 1).unwrap_or_default();
            let scale = match group(c, 2) {
                Some("C") => " Celsius",
                Some("F") => " Fahrenheit",
                _ => "",
            };
            format!("{n} {}{scale}", if is_one(n) { "degree" } else { "degrees" })
        });
        let t = sub(&self.unit, &t, |c| {
            let n = group(c, 1).unwrap_or_default();
            let words = self.tables.units.get(group(c, 2).unwrap_or_default()).cloned().unwrap_or_default();
            format!("{n} {}", plural(n, &words))
        });
        let t = sub(&self.month_day, &t, |c| self.month_day(c));
        let t = sub(&self.day_month, &t, |c| self.day_month(c));
        let t = sub(&self.title, &t, |c| {
            format!("{} ", self.tables.titles.get(group(c, 1).unwrap_or_default()).cloned().unwrap_or_default())
        });
        let t = sub(&self.abbrev, &t, |c| {
            let key = group(c, 1).unwrap_or_default();
            let at_end = c.get(0).is_some_and(|m| m.end() == t.len());
            let dot = if at_end && key.ends_with('.') { "." } else { "" };
            format!("{}{dot}", self.tables.abbreviations.get(key).cloned().unwrap_or_default())
        });
        let t = sub(&self.no, &t, |c| if group(c, 1) == Some("No") { "Number ".into() } else { "Numbers ".into() });
        let t = sub_literal(&self.hash, &t, "number ");
        let t = sub(&self.roman_cardinal, &t, |c| {
            format!("{} {}", group(c, 1).unwrap_or_default(), roman_value(group(c, 2).unwrap_or_default()))
        });
        let t = sub(&self.roman_ordinal, &t, |c| {
            let n = roman_value(group(c, 2).unwrap_or_default());
            format!("{} the {}", group(c, 1).unwrap_or_default(), num::ordinal(n))
        });
        let t = sub(&self.phone, &t, |c| {
            let spaced = group(c, 0).unwrap_or_default().replace('-', ", ");
            spaced.chars().map(String::from).collect::<Vec<_>>().join(" ")
        });
        let t = sub(&self.fraction, &t, |c| self.fraction(c));
        let t = sub(&self.range, &t, |c| {
            format!("{} to {}", group(c, 1).unwrap_or_default(), group(c, 2).unwrap_or_default())
        });
        let mut t = sub_literal(&self.plus, &t, "plus ");
        for rule in &self.symbols {
            if t.contains(rule.symbol.as_str()) {
                t = sub_literal(&rule.re, &t, &rule.replacement);
            }
        }
        let t = sub_literal(&self.ws, &t, " ");
        let t = sub(&self.space_punct, &t, |c| group(c, 1).unwrap_or_default().to_string());
        super::pystr::strip(&t).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_roman_values() {
        assert_eq!(roman_value("VIII"), 8);
        assert_eq!(roman_value("XIV"), 14);
        assert_eq!(roman_value("MCMXC"), 1990);
    }
}
