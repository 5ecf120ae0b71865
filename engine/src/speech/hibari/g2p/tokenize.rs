//! spaCy's English tokenizer rules: exceptions, prefixes and suffixes per chunk, infixes, then exceptions rejoined.

use std::collections::HashMap;
use std::path::Path;

use fancy_regex::Regex;

use super::files;
use super::pyre::{compile, escape, escape_class, find_ranges, is_match, NOT_SPACE};
use super::pystr::{ALNUM, LETTER, WORD_CHARS};
use super::G2pError;

const LO: &str = "a-zß-öø-ÿ";
const UP: &str = "A-ZÀ-ÖØ-Þ";
const QUOTES: &str = "'\"”“`‘´’‚,„»«「」『』（）〔〕【】《》〈〉";
const PUNCT: &str = "…,:;!?¿¡()[]{}<>_#*&。？！，、；：～·";
const ICONS: &str = "™®©°§¶†‡•";
const CURRENCY: &str = r"\$|£|€|¥|฿|US\$|C\$|A\$|₽|₹|₩|₪|₺|₴|₦|₫|₱|₲|₵|₸|₼|₾|₿";
const UNITS: &str = "km|km²|km³|m|m²|m³|dm|dm²|dm³|cm|cm²|cm³|mm|mm²|mm³|ha|µm|nm|yd|in|ft|kg|g|mg|µg|t|lb|oz|m/s|km/h\
|kmh|mph|hPa|Pa|mbar|mb|MB|kb|KB|gb|GB|tb|TB|T|G|M|K|%";
const URL_TLDS: &str = "com|org|net|edu|gov|io|co|uk|de|fr|info|biz|us|ca|au|tv|me|ly|ai";

/// The tokenizer: exceptions and the compiled prefix, suffix, infix and URL patterns.
pub struct Tokenizer {
    special: HashMap<String, Vec<String>>,
    prefix: Regex,
    suffix: Regex,
    infix: Regex,
    url: Regex,
    chunk: Regex,
}

fn each_escaped(chars: &str) -> Vec<String> {
    chars.chars().map(|c| escape(&c.to_string())).collect()
}

impl Tokenizer {
    pub fn load(dir: &Path) -> Result<Tokenizer, G2pError> {
        let special: HashMap<String, Vec<String>> = files::json(dir, "tokenizer_exceptions.json")?;
        Tokenizer::new(special)
    }

    pub fn new(special: HashMap<String, Vec<String>>) -> Result<Tokenizer, G2pError> {
        let punct = each_escaped(PUNCT);
        let quotes = each_escaped(QUOTES);
        let icons = format!("[{}]", escape_class(ICONS));
        let (punct_class, quote_class) = (escape_class(PUNCT), escape_class(QUOTES));
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<String>>();

        let mut prefixes = owned(&["§", "%", "=", "—", "–", r"\+(?![0-9])", "…", "……"]);
        prefixes.extend(punct.iter().cloned());
        prefixes.extend(owned(&[r"\.\.+", "…"]));
        prefixes.extend(quotes.iter().cloned());
        prefixes.push(CURRENCY.to_string());
        prefixes.push(icons.clone());

        let mut suffixes = owned(&["…", "……"]);
        suffixes.extend(punct.iter().cloned());
        suffixes.extend(owned(&[r"\.\.+", "…"]));
        suffixes.extend(quotes.iter().cloned());
        suffixes.push(icons.clone());
        suffixes.extend(owned(&["'s", "'S", "’s", "’S", "—", "–"]));
        suffixes.extend([
            r"(?<=[0-9])\+".to_string(),
            r"(?<=°[FfCcKk])\.".to_string(),
            format!("(?<=[0-9])(?:{CURRENCY})"),
            format!("(?<=[0-9])(?:{UNITS})"),
            format!(r"(?<=[0-9{LO}%²\-\+{punct_class}{quote_class}])\."),
            format!(r"(?<=[{UP}][{UP}])\."),
        ]);

        let infixes = [
            r"\.\.+".to_string(),
            "…".to_string(),
            icons,
            r"(?<=[0-9])[+\-\*^](?=[0-9-])".to_string(),
            format!(r"(?<=[{LO}{quote_class}])\.(?=[{UP}{quote_class}])"),
            format!("(?<={LETTER}),(?={LETTER})"),
            format!("(?<={ALNUM})(?:-|–|—|--|---|——|~)(?={LETTER})"),
            format!("(?<={ALNUM})[:<>=/](?={LETTER})"),
        ];

        let join = |items: &[String], f: &dyn Fn(&String) -> String| items.iter().map(f).collect::<Vec<_>>().join("|");
        let w = WORD_CHARS;
        Ok(Tokenizer {
            special,
            prefix: compile(&join(&prefixes, &|p| format!("^(?:{p})")))?,
            suffix: compile(&join(&suffixes, &|s| format!("(?:{s})$")))?,
            infix: compile(&join(&infixes, &|i| format!("(?:{i})")))?,
            url: compile(&format!(
                r"(?i)^(?:(?:https?|ftp)://|www\.){NOT_SPACE}+$|^[{w}.+\-]+@[{w}\-]+(?:\.[{w}\-]+)+$|^(?:[{w}\-]+\.)+(?:{URL_TLDS})(?:/{NOT_SPACE}*)?$"
            ))?,
            chunk: compile(&format!("{NOT_SPACE}+"))?,
        })
    }

    /// (token text, followed by whitespace) for each token of `text`.
    pub fn tokenize(&self, text: &str) -> Vec<(String, bool)> {
        let mut out = Vec::new();
        for (start, end) in find_ranges(&self.chunk, text) {
            let toks = self.split(&text[start..end]);
            let n = toks.len();
            for (i, t) in toks.into_iter().enumerate() {
                out.push((t, i + 1 == n && end < text.len()));
            }
        }
        out
    }

    fn is_special(&self, s: &str) -> bool {
        self.special.contains_key(s)
    }

    /// One whitespace-separated chunk into tokens (spaCy's `_split_affixes` and `_attach_tokens`).
    fn split(&self, chunk: &str) -> Vec<String> {
        if let Some(v) = self.special.get(chunk) {
            return v.clone();
        }
        let mut pre: Vec<&str> = Vec::new();
        let mut suf: Vec<&str> = Vec::new();
        let mut s = chunk;
        let mut last = usize::MAX;
        while !s.is_empty() && s.len() != last && !self.is_special(s) {
            last = s.len();
            let pre_len = self.prefix.find(s).ok().flatten().map_or(0, |m| m.end());
            let (prefix, minus_pre) = s.split_at(pre_len);
            if pre_len > 0 && !minus_pre.is_empty() && self.is_special(minus_pre) {
                s = minus_pre;
                pre.push(prefix);
                break;
            }
            let suf_len = self.suffix.find(&s[pre_len..]).ok().flatten().map_or(0, |m| m.end() - m.start());
            let (minus_suf, suffix) = s.split_at(s.len() - suf_len);
            if suf_len > 0 && !minus_suf.is_empty() && self.is_special(minus_suf) {
                s = minus_suf;
                suf.push(suffix);
                break;
            }
            if pre_len > 0 && suf_len > 0 && pre_len + suf_len <= s.len() {
                s = &s[pre_len..s.len() - suf_len];
                pre.push(prefix);
                suf.push(suffix);
            } else if pre_len > 0 {
                s = minus_pre;
                pre.push(prefix);
            } else if suf_len > 0 {
                s = minus_suf;
                suf.push(suffix);
            }
        }
        let mut toks: Vec<String> = pre.iter().map(|p| p.to_string()).collect();
        if !s.is_empty() {
            if let Some(v) = self.special.get(s) {
                toks.extend(v.iter().cloned());
            } else if is_match(&self.url, s) {
                toks.push(s.to_string());
            } else {
                let mut start = 0;
                for (ms, me) in find_ranges(&self.infix, s) {
                    if ms == 0 || ms == me {
                        continue;
                    }
                    if ms > start {
                        toks.push(s[start..ms].to_string());
                    }
                    toks.push(s[ms..me].to_string());
                    start = me;
                }
                if start < s.len() {
                    toks.push(s[start..].to_string());
                }
            }
        }
        toks.extend(suf.iter().rev().map(|x| x.to_string()));
        if toks.len() > 1 {
            self.rejoin(toks)
        } else {
            toks
        }
    }

    /// spaCy's special-case pass over the split pieces: "Sept" "." becomes "Sept.".
    fn rejoin(&self, toks: Vec<String>) -> Vec<String> {
        let mut out = Vec::with_capacity(toks.len());
        let mut i = 0;
        'outer: while i < toks.len() {
            for k in [3, 2] {
                if i + k <= toks.len() {
                    if let Some(v) = self.special.get(&toks[i..i + k].concat()) {
                        out.extend(v.iter().cloned());
                        i += k;
                        continue 'outer;
                    }
                }
            }
            out.push(toks[i].clone());
            i += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        let special = [("can't", vec!["ca", "n't"]), ("Sept.", vec!["Sept."]), ("Mr.", vec!["Mr."])];
        let special =
            special.into_iter().map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect())).collect();
        Tokenizer::new(special).unwrap()
    }

    fn texts(t: &Tokenizer, s: &str) -> Vec<String> {
        t.tokenize(s).into_iter().map(|(t, _)| t).collect()
    }

    #[test]
    fn test_affixes_infixes_and_specials() {
        let t = tokenizer();
        assert_eq!(texts(&t, "\"Hello,\" she said."), ["\"", "Hello", ",", "\"", "she", "said", "."]);
        assert_eq!(texts(&t, "I can't (really)."), ["I", "ca", "n't", "(", "really", ")", "."]);
        assert_eq!(texts(&t, "well-known 5km $10 Sept."), ["well", "-", "known", "5", "km", "$", "10", "Sept."]);
        assert_eq!(texts(&t, "U.S.A. www.example.com"), ["U.S.A.", "www.example.com"]);
        let ws: Vec<bool> = t.tokenize("a b.").into_iter().map(|(_, w)| w).collect();
        assert_eq!(ws, [true, false, false]);
    }
}
