//! misaki's English lexicon: gold then silver entries, part-of-speech and context rules, -s/-ed/-ing stems, stress.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use unicode_normalization::UnicodeNormalization;

use super::files;
use super::pystr::{self, capitalize, is_alpha, lower, str_is_alpha, upper};
use super::token::Tok;
use super::G2pError;

pub const PRIMARY_STRESS: char = 'ˈ';
pub const SECONDARY_STRESS: char = 'ˌ';
pub const VOWELS: &str = "AIOQWYaiuæɑɒɔəɛɜɪʊʌᵻ";
pub const CONSONANTS: &str = "bdfhjklmnpstvwzðŋɡɹɾʃʒʤʧθ";
const US_TAUS: &str = "AIOWYiuæɑəɛɪɹʊʌ";
const DIPHTHONGS: &str = "AIOQWYʤʧ";
/// Currency symbols read by the lexicon: the unit and the hundredth.
pub const CURRENCIES: [(&str, &str, &str); 3] =
    [("$", "dollar", "cent"), ("£", "pound", "pence"), ("€", "euro", "cent")];

/// What the words after a token tell the lexicon about it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Context {
    /// Whether the next word starts with a vowel sound; None before punctuation or at the end.
    pub future_vowel: Option<bool>,
    pub future_to: bool,
}

/// A dictionary value: one reading, or readings by part of speech (a reading may be null).
pub enum Entry {
    Word(String),
    Tagged(Vec<(String, Option<String>)>),
}

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntryVisitor;

        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = Entry;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a phoneme string or an object of them by tag")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Entry, E> {
                Ok(Entry::Word(v.to_string()))
            }

            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Entry, E> {
                Ok(Entry::Word(v))
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entry, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Option<String>>()? {
                    out.push((k, v));
                }
                Ok(Entry::Tagged(out))
            }
        }

        deserializer.deserialize_any(EntryVisitor)
    }
}

fn tagged<'a>(map: &'a [(String, Option<String>)], key: &str) -> Option<&'a Option<String>> {
    map.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// A misaki dictionary whose lowercase and Capitalized keys answer for each other (grow_dictionary).
pub struct Dict(HashMap<String, Entry>);

impl Dict {
    pub fn get(&self, w: &str) -> Option<&Entry> {
        if let Some(v) = self.0.get(w) {
            return Some(v);
        }
        if pystr::len(w) < 2 {
            return None;
        }
        let lw = lower(w);
        if w == lw {
            let c = capitalize(w);
            return if c != w { self.0.get(&c) } else { None };
        }
        if w == capitalize(&lw) {
            return self.0.get(&lw);
        }
        None
    }

    pub fn contains(&self, w: &str) -> bool {
        self.get(w).is_some()
    }
}

pub fn stress_weight(ps: &str) -> usize {
    ps.chars().map(|c| if DIPHTHONGS.contains(c) { 2 } else { 1 }).sum()
}

fn has_vowel(ps: &str) -> bool {
    ps.chars().any(|c| VOWELS.contains(c))
}

/// The stress mark put before the first vowel (`restress` of a string with no other marks).
fn stress_first_vowel(ps: &str, mark: char) -> String {
    let i = ps.char_indices().find(|(_, c)| VOWELS.contains(*c)).map_or(ps.len(), |(i, _)| i);
    format!("{}{mark}{}", &ps[..i], &ps[i..])
}

/// `apply_stress`: lowers, removes or adds stress marks by the stress level.
pub fn apply_stress(ps: &str, stress: Option<f64>) -> String {
    let Some(s) = stress else { return ps.to_string() };
    let (has_primary, has_secondary) = (ps.contains(PRIMARY_STRESS), ps.contains(SECONDARY_STRESS));
    let unstressed = !has_primary && !has_secondary;
    if s < -1.0 {
        ps.replace([PRIMARY_STRESS, SECONDARY_STRESS], "")
    } else if s == -1.0 || ((s == 0.0 || s == -0.5) && has_primary) {
        ps.replace(SECONDARY_STRESS, "").replace(PRIMARY_STRESS, &SECONDARY_STRESS.to_string())
    } else if (s == 0.0 || s == 0.5 || s == 1.0) && unstressed {
        if has_vowel(ps) {
            stress_first_vowel(ps, SECONDARY_STRESS)
        } else {
            ps.to_string()
        }
    } else if s >= 1.0 && !has_primary && has_secondary {
        ps.replace(SECONDARY_STRESS, &PRIMARY_STRESS.to_string())
    } else if s > 1.0 && unstressed {
        if has_vowel(ps) {
            stress_first_vowel(ps, PRIMARY_STRESS)
        } else {
            ps.to_string()
        }
    } else {
        ps.to_string()
    }
}

/// Only ASCII digits, as the reference's `is_digit` regex.
pub fn is_ascii_number(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

fn parent_tag(tag: Option<&str>) -> Option<&str> {
    let t = tag?;
    Some(if t.starts_with("VB") {
        "VERB"
    } else if t.starts_with("NN") {
        "NOUN"
    } else if t.starts_with("ADV") || t.starts_with("RB") {
        "ADV"
    } else if t.starts_with("ADJ") || t.starts_with("JJ") {
        "ADJ"
    } else {
        t
    })
}

fn is_lexicon_char(c: char) -> bool {
    c == '\'' || c == '-' || c.is_ascii_alphabetic()
}

/// The lexicon: gold and silver dictionaries (US English).
pub struct Lexicon {
    pub(super) golds: Dict,
    pub(super) silvers: Dict,
}

impl Lexicon {
    pub fn load(dir: &Path) -> Result<Lexicon, G2pError> {
        let golds = files::json(dir, "lexicon_us_gold.json.gz")?;
        let silvers = files::json(dir, "lexicon_us_silver.json.gz")?;
        Ok(Lexicon { golds: Dict(golds), silvers: Dict(silvers) })
    }

    /// A gold entry that is a plain string.
    pub(super) fn gold_word(&self, w: &str) -> Option<String> {
        match self.golds.get(w) {
            Some(Entry::Word(s)) => Some(s.clone()),
            _ => None,
        }
    }

    fn gold_tagged(&self, w: &str, tag: &str) -> Option<String> {
        match self.golds.get(w) {
            Some(Entry::Tagged(map)) => tagged(map, tag).cloned().flatten(),
            _ => None,
        }
    }

    /// `get_NNP`: a word spelled out letter by letter, stressed on the last letter.
    fn get_nnp(&self, word: &str) -> Option<String> {
        let mut ps = String::new();
        for c in word.chars().filter(|&c| is_alpha(c)) {
            ps.push_str(&self.gold_word(&upper(&c.to_string()))?);
        }
        let ps = apply_stress(&ps, Some(0.0));
        Some(match ps.rfind(SECONDARY_STRESS) {
            Some(i) => format!("{}{PRIMARY_STRESS}{}", &ps[..i], &ps[i + SECONDARY_STRESS.len_utf8()..]),
            None => ps,
        })
    }

    fn get_special_case(&self, word: &str, tag: &str, stress: Option<f64>, ctx: &Context) -> Option<String> {
        let stripped = word.trim_matches('.');
        let longest_part = word.split('.').map(pystr::len).max().unwrap_or(0);
        if tag == "ADD" && (word == "." || word == "/") {
            let name = if word == "." { "dot" } else { "slash" };
            return self.lookup(name, None, Some(-0.5), Some(ctx));
        }
        let symbol = match word {
            "%" => Some("percent"),
            "&" => Some("and"),
            "+" => Some("plus"),
            "@" => Some("at"),
            _ => None,
        };
        if let Some(name) = symbol {
            return self.lookup(name, None, None, Some(ctx));
        }
        if stripped.contains('.') && str_is_alpha(&word.replace('.', "")) && longest_part < 3 {
            return self.get_nnp(word);
        }
        match word {
            "a" | "A" => return Some(if tag == "DT" { "ɐ" } else { "ˈA" }.to_string()),
            "am" | "Am" | "AM" => {
                if tag.starts_with("NN") {
                    return self.get_nnp(word);
                }
                if ctx.future_vowel.is_none() || word != "am" || stress.is_some_and(|s| s > 0.0) {
                    return self.gold_word("am");
                }
                return Some("ɐm".to_string());
            }
            "an" | "An" | "AN" => {
                if word == "AN" && tag.starts_with("NN") {
                    return self.get_nnp(word);
                }
                return Some("ɐn".to_string());
            }
            "I" if tag == "PRP" => return Some(format!("{SECONDARY_STRESS}I")),
            "by" | "By" | "BY" if parent_tag(Some(tag)) == Some("ADV") => return Some("bˈI".to_string()),
            _ => {}
        }
        if word == "to" || word == "To" || (word == "TO" && (tag == "TO" || tag == "IN")) {
            return match ctx.future_vowel {
                None => self.gold_word("to"),
                Some(false) => Some("tə".to_string()),
                Some(true) => Some("tʊ".to_string()),
            };
        }
        if word == "in" || word == "In" || (word == "IN" && tag != "NNP") {
            let mark = if ctx.future_vowel.is_none() || tag != "IN" { "ˈ" } else { "" };
            return Some(format!("{mark}ɪn"));
        }
        if word == "the" || word == "The" || (word == "THE" && tag == "DT") {
            return Some(if ctx.future_vowel == Some(true) { "ði" } else { "ðə" }.to_string());
        }
        if tag == "IN" && matches!(lower(word).as_str(), "vs" | "vs.") {
            return self.lookup("versus", None, None, Some(ctx));
        }
        if matches!(word, "used" | "Used" | "USED") {
            let key = if (tag == "VBD" || tag == "JJ") && ctx.future_to { "VBD" } else { "DEFAULT" };
            return self.gold_tagged("used", key);
        }
        None
    }

    pub(super) fn is_known(&self, word: &str) -> bool {
        if self.golds.contains(word) || matches!(word, "%" | "&" | "+" | "@") || self.silvers.contains(word) {
            return true;
        }
        if !str_is_alpha(word) || !word.chars().all(is_lexicon_char) {
            return false;
        }
        if pystr::len(word) == 1 {
            return true;
        }
        if word == upper(word) && self.golds.contains(&lower(word)) {
            return true;
        }
        let rest = pystr::tail(word, 1);
        rest == upper(rest)
    }

    /// `lookup`: the dictionaries' reading of `word`, by tag and context, with the stress applied.
    pub(super) fn lookup(
        &self,
        word: &str,
        tag: Option<&str>,
        stress: Option<f64>,
        ctx: Option<&Context>,
    ) -> Option<String> {
        let mut word = word.to_string();
        let mut is_nnp = false;
        if word == upper(&word) && !self.golds.contains(&word) {
            word = lower(&word);
            is_nnp = tag == Some("NNP");
        }
        let mut entry = self.golds.get(&word);
        if entry.is_none() && !is_nnp {
            entry = self.silvers.get(&word);
        }
        let ps = match entry {
            None => None,
            Some(Entry::Word(s)) => Some(s.clone()),
            Some(Entry::Tagged(map)) => {
                let key = if ctx.is_some_and(|c| c.future_vowel.is_none()) && tagged(map, "None").is_some() {
                    Some("None")
                } else if tag.is_none_or(|t| tagged(map, t).is_none()) {
                    parent_tag(tag)
                } else {
                    tag
                };
                match key.and_then(|k| tagged(map, k)) {
                    Some(v) => v.clone(),
                    None => tagged(map, "DEFAULT").cloned().flatten(),
                }
            }
        };
        if ps.as_deref().is_none_or(|p| is_nnp && !p.contains(PRIMARY_STRESS)) {
            if let Some(nnp) = self.get_nnp(&word) {
                return Some(nnp);
            }
        }
        ps.map(|p| apply_stress(&p, stress))
    }

    /// `_s`: the plural or third-person ending after a stem's last sound.
    pub(super) fn suffix_s(stem: Option<String>) -> Option<String> {
        let stem = stem.filter(|s| !s.is_empty())?;
        let last = stem.chars().last()?;
        Some(if "ptkfθ".contains(last) {
            format!("{stem}s")
        } else if "szʃʒʧʤ".contains(last) {
            format!("{stem}ᵻz")
        } else {
            format!("{stem}z")
        })
    }

    pub(super) fn stem_s(
        &self,
        word: &str,
        tag: Option<&str>,
        stress: Option<f64>,
        ctx: Option<&Context>,
    ) -> Option<String> {
        let n = pystr::len(word);
        if n < 3 || !word.ends_with('s') {
            return None;
        }
        let stem = if !word.ends_with("ss") && self.is_known(pystr::drop_last(word, 1)) {
            pystr::drop_last(word, 1).to_string()
        } else if (word.ends_with("'s") || (n > 4 && word.ends_with("es") && !word.ends_with("ies")))
            && self.is_known(pystr::drop_last(word, 2))
        {
            pystr::drop_last(word, 2).to_string()
        } else if n > 4 && word.ends_with("ies") && self.is_known(&format!("{}y", pystr::drop_last(word, 3))) {
            format!("{}y", pystr::drop_last(word, 3))
        } else {
            return None;
        };
        Lexicon::suffix_s(self.lookup(&stem, tag, stress, ctx))
    }

    /// `_ed`: the past ending after a stem's last sound (flapped after a US vowel and t).
    pub(super) fn suffix_ed(stem: Option<String>) -> Option<String> {
        let stem = stem.filter(|s| !s.is_empty())?;
        let last = stem.chars().last()?;
        Some(if "pkfθʃsʧ".contains(last) {
            format!("{stem}t")
        } else if last == 'd' {
            format!("{stem}ᵻd")
        } else if last != 't' {
            format!("{stem}d")
        } else if pystr::len(&stem) < 2 {
            format!("{stem}ɪd")
        } else if pystr::nth_from_end(&stem, 2).is_some_and(|c| US_TAUS.contains(c)) {
            format!("{}ɾᵻd", pystr::drop_last(&stem, 1))
        } else {
            format!("{stem}ᵻd")
        })
    }

    fn stem_ed(&self, word: &str, tag: Option<&str>, stress: Option<f64>, ctx: Option<&Context>) -> Option<String> {
        let n = pystr::len(word);
        if n < 4 || !word.ends_with('d') {
            return None;
        }
        let stem = if !word.ends_with("dd") && self.is_known(pystr::drop_last(word, 1)) {
            pystr::drop_last(word, 1)
        } else if n > 4 && word.ends_with("ed") && !word.ends_with("eed") && self.is_known(pystr::drop_last(word, 2)) {
            pystr::drop_last(word, 2)
        } else {
            return None;
        };
        Lexicon::suffix_ed(self.lookup(stem, tag, stress, ctx))
    }

    /// `_ing`: the -ing ending, flapping a US t after a vowel.
    pub(super) fn suffix_ing(stem: Option<String>) -> Option<String> {
        let stem = stem.filter(|s| !s.is_empty())?;
        let flapped = pystr::len(&stem) > 1
            && stem.ends_with('t')
            && pystr::nth_from_end(&stem, 2).is_some_and(|c| US_TAUS.contains(c));
        Some(if flapped { format!("{}ɾɪŋ", pystr::drop_last(&stem, 1)) } else { format!("{stem}ɪŋ") })
    }

    fn stem_ing(&self, word: &str, tag: Option<&str>, stress: Option<f64>, ctx: Option<&Context>) -> Option<String> {
        let n = pystr::len(word);
        if n < 5 || !word.ends_with("ing") {
            return None;
        }
        let base = pystr::drop_last(word, 3);
        let doubled = {
            let c: Vec<char> = word.chars().collect();
            (n >= 5 && c[n - 5] == c[n - 4] && "bcdgklmnprstvxz".contains(c[n - 4])) || word.ends_with("cking")
        };
        let stem = if n > 5 && self.is_known(base) {
            base.to_string()
        } else if self.is_known(&format!("{base}e")) {
            format!("{base}e")
        } else if n > 5 && doubled && self.is_known(pystr::drop_last(word, 4)) {
            pystr::drop_last(word, 4).to_string()
        } else {
            return None;
        };
        Lexicon::suffix_ing(self.lookup(&stem, tag, stress, ctx))
    }

    fn get_word(&self, word: &str, tag: &str, stress: Option<f64>, ctx: &Context) -> Option<String> {
        if let Some(ps) = self.get_special_case(word, tag, stress, ctx) {
            return Some(ps);
        }
        let wl = lower(word);
        let n = pystr::len(word);
        let rest = pystr::tail(word, 1);
        let mut word = word.to_string();
        if n > 1
            && str_is_alpha(&word.replace('\'', ""))
            && word != wl
            && (tag != "NNP" || n > 7)
            && !self.golds.contains(&word)
            && !self.silvers.contains(&word)
            && (word == upper(&word) || rest == lower(rest))
            && (self.golds.contains(&wl)
                || self.silvers.contains(&wl)
                || self.stem_s(&wl, Some(tag), stress, Some(ctx)).is_some_and(|p| !p.is_empty())
                || self.stem_ed(&wl, Some(tag), stress, Some(ctx)).is_some_and(|p| !p.is_empty())
                || self.stem_ing(&wl, Some(tag), stress, Some(ctx)).is_some_and(|p| !p.is_empty()))
        {
            word = wl;
        }
        let (tag, ctx) = (Some(tag), Some(ctx));
        if self.is_known(&word) {
            return self.lookup(&word, tag, stress, ctx);
        }
        if let Some(stem) = word.strip_suffix("s'") {
            let possessive = format!("{stem}'s");
            if self.is_known(&possessive) {
                return self.lookup(&possessive, tag, stress, ctx);
            }
        }
        if let Some(stem) = word.strip_suffix('\'') {
            if self.is_known(stem) {
                return self.lookup(stem, tag, stress, ctx);
            }
        }
        self.stem_s(&word, tag, stress, ctx)
            .or_else(|| self.stem_ed(&word, tag, stress, ctx))
            .or_else(|| self.stem_ing(&word, tag, Some(stress.unwrap_or(0.5)), ctx))
    }

    /// The lexicon's reading of a token in its context, or None for the OOV fallback.
    pub fn read(&self, tk: &Tok, ctx: &Context) -> Option<String> {
        let raw = tk.alias.as_deref().unwrap_or(&tk.text).replace(['\u{2018}', '\u{2019}'], "'");
        let word: String = raw.nfkc().map(numeric_if_needed).collect();
        let stress = if word == lower(&word) {
            None
        } else if word == upper(&word) {
            Some(2.0)
        } else {
            Some(0.5)
        };
        if let Some(ps) = self.get_word(&word, &tk.tag, stress, ctx) {
            return Some(self.append_currency(ps, tk.currency.as_deref()));
        }
        if Lexicon::is_number(&word, tk.is_head) {
            return self.get_number(&word, tk.currency.as_deref(), tk.is_head);
        }
        None
    }
}

/// `numeric_if_needed`: a non-ASCII decimal digit as its ASCII digit.
fn numeric_if_needed(c: char) -> char {
    if c.is_ascii_digit() {
        return c;
    }
    match pystr::decimal_value(c) {
        Some(d) => char::from_digit(d, 10).unwrap_or(c),
        None => c,
    }
}
