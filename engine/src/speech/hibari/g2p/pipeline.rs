//! One sentence to phonemes (misaki's `G2P.__call__`): normalize, tokenize, tag, read right to left, resolve stress.

use fancy_regex::Regex;

use super::lexicon::{apply_stress, stress_weight, Context, Lexicon, CONSONANTS, CURRENCIES, PRIMARY_STRESS, VOWELS};
use super::normalize::Normalizer;
use super::oov::Oov;
use super::pyre::{compile, find_all, find_ranges};
use super::pystr::{is_alpha, is_digit, is_space, str_is_alpha, LETTER, WORD_CHARS};
use super::tagger::Tagger;
use super::token::{merge_tokens, Tok};
use super::tokenize::Tokenizer;
use super::G2pError;

const SUBTOKEN_JUNKS: &str = "',-._‘’/";
const PUNCTS: &str = ";:,.!?—…\"“”";
const NON_QUOTE_PUNCTS: &str = ";:,.!?—…";
const PUNCT_TAGS: [&str; 11] = [".", ",", "-LRB-", "-RRB-", "``", "\"\"", "''", ":", "$", "#", "NFP"];
const SYMBOL_PHONEMES: [(char, &str); 14] = [
    ('/', "slˈæʃ"),
    ('=', "ˈikwᵊlz"),
    ('+', "plˈʌs"),
    ('&', "ænd"),
    ('@', "æt"),
    ('%', "pəɹsˈɛnt"),
    ('#', "hˈæʃ"),
    ('*', "ˈæstəɹˌɪsk"),
    ('~', "tˈɪldə"),
    ('^', "kˈɛɹət"),
    ('<', "lˈɛs ðən"),
    ('>', "ɡɹˈATəɹ ðən"),
    ('|', ""),
    ('—', "—"),
];

fn is_junk(text: &str) -> bool {
    text.chars().all(|c| SUBTOKEN_JUNKS.contains(c))
}

fn punct_tag_phonemes(tag: &str, text: &str) -> String {
    match tag {
        "-LRB-" => "(".into(),
        "-RRB-" => ")".into(),
        "``" => "\u{201c}".into(),
        "\"\"" | "''" => "\u{201d}".into(),
        _ => text.chars().filter(|&c| PUNCTS.contains(c)).collect(),
    }
}

/// Whether every character lowercases to an ASCII letter (`97 <= ord(c.lower()) <= 122`).
fn all_lower_ascii_letters(text: &str) -> bool {
    text.chars().all(|c| {
        let mut lowered = c.to_lowercase();
        matches!((lowered.next(), lowered.next()), (Some(l), None) if l.is_ascii_lowercase())
    })
}

/// What a word's phonemes tell the lexicon about the word before it.
fn token_context(ctx: Context, ps: Option<&str>, token: &Tok) -> Context {
    let mut vowel = ctx.future_vowel;
    for c in ps.unwrap_or_default().chars() {
        if NON_QUOTE_PUNCTS.contains(c) {
            vowel = None;
            break;
        }
        if VOWELS.contains(c) || CONSONANTS.contains(c) {
            vowel = Some(VOWELS.contains(c));
            break;
        }
    }
    let t = token.text.as_str();
    let future_to = t == "to" || t == "To" || (t == "TO" && (token.tag == "TO" || token.tag == "IN"));
    Context { future_vowel: vowel, future_to }
}

/// Spacing and stress of a word read as several subtokens (`resolve_tokens`).
fn resolve_tokens(tokens: &mut [Tok]) {
    let text = merge_tokens(tokens, None).text;
    let kinds: std::collections::BTreeSet<u8> = text
        .chars()
        .filter(|&c| !SUBTOKEN_JUNKS.contains(c))
        .map(|c| {
            if is_alpha(c) {
                0
            } else if c.is_ascii_digit() {
                1
            } else {
                2
            }
        })
        .collect();
    let prespace = text.contains(' ') || text.contains('/') || kinds.len() > 1;
    let last = tokens.len() - 1;
    for (i, tk) in tokens.iter_mut().enumerate() {
        if tk.phonemes.is_none() {
            if i == last && tk.text.chars().count() == 1 && NON_QUOTE_PUNCTS.contains(tk.text.as_str()) {
                tk.phonemes = Some(tk.text.clone());
            } else if is_junk(&tk.text) {
                tk.phonemes = Some(String::new());
            }
        } else if i > 0 {
            tk.prespace = prespace;
        }
    }
    if prespace {
        return;
    }
    let mut indices: Vec<(bool, usize, usize)> = tokens
        .iter()
        .enumerate()
        .filter_map(|(i, tk)| tk.phonemes.as_deref().filter(|p| !p.is_empty()).map(|p| (i, p)))
        .map(|(i, p)| (p.contains(PRIMARY_STRESS), stress_weight(p), i))
        .collect();
    let lower = |tk: &mut Tok| tk.phonemes = tk.phonemes.as_deref().map(|p| apply_stress(p, Some(-0.5)));
    if indices.len() == 2 && tokens[indices[0].2].text.chars().count() == 1 {
        lower(&mut tokens[indices[1].2]);
        return;
    }
    let num_primary = indices.iter().filter(|x| x.0).count();
    if indices.len() < 2 || num_primary <= indices.len().div_ceil(2) {
        return;
    }
    indices.sort();
    for &(_, _, i) in &indices[..indices.len() / 2] {
        lower(&mut tokens[i]);
    }
}

/// The sentence pipeline: normalizer, tokenizer, tagger, lexicon, OOV network and the subtoken patterns.
pub struct Pipeline {
    pub(super) normalizer: Normalizer,
    pub(super) tokenizer: Tokenizer,
    pub(super) tagger: Tagger,
    pub(super) lexicon: Lexicon,
    pub(super) oov: Oov,
    subtoken: Regex,
    link: Regex,
    fallback_piece: Regex,
}

impl Pipeline {
    pub fn new(
        normalizer: Normalizer,
        tokenizer: Tokenizer,
        tagger: Tagger,
        lexicon: Lexicon,
        oov: Oov,
    ) -> Result<Pipeline, G2pError> {
        let (l, w) = (LETTER, WORD_CHARS);
        let (up, lo) = ("A-ZÀ-ÖØ-Þ", "a-zß-öø-ÿ");
        let subtoken = [
            "^['‘’]+".to_string(),
            format!("[{up}](?=[{up}][{lo}])"),
            r"(?:^-)?(?:\d?[,.]?\d)+".to_string(),
            "[-_]+".to_string(),
            "['‘’]{2,}".to_string(),
            format!("{l}*?(?:['‘’]{l})*?[{lo}](?=[{up}])"),
            format!("{l}+(?:['‘’]{l})*"),
            format!(r"[^{w}\-'‘’]"),
            "['‘’]+$".to_string(),
        ]
        .join("|");
        Ok(Pipeline {
            normalizer,
            tokenizer,
            tagger,
            lexicon,
            oov,
            subtoken: compile(&subtoken)?,
            link: compile(r"\[([^\]]+)\]\(([^\)]*)\)")?,
            fallback_piece: compile(&format!(r"{l}+(?:['’]{l}+)*|\d+(?:[,.]\d+)*|[^{w}\s\x1c-\x1f]+"))?,
        })
    }

    fn tagged_tokens(&self, text: &str) -> Vec<Tok> {
        let pairs = self.tokenizer.tokenize(text);
        if pairs.is_empty() {
            return Vec::new();
        }
        let words: Vec<String> = pairs.iter().map(|(t, _)| t.clone()).collect();
        let tags = self.tagger.tag(&words);
        pairs.iter().zip(&tags).map(|((t, ws), tag)| Tok::new(t, tag, *ws)).collect()
    }

    /// Tokens with tags; `[text](/phonemes/)` sets a token's phonemes directly.
    fn tokenize(&self, text: &str) -> Vec<Tok> {
        let mut toks = Vec::new();
        let mut pos = 0;
        for caps in self.link.captures_iter(text).map_while(Result::ok) {
            let (Some(m), Some(label), Some(target)) = (caps.get(0), caps.get(1), caps.get(2)) else { continue };
            toks.extend(self.tagged_tokens(&text[pos..m.start()]));
            let f = target.as_str();
            let ps =
                (f.chars().count() > 1 && f.starts_with('/') && f.ends_with('/')).then(|| f[1..].trim_end_matches('/'));
            let ws = text[m.end()..].chars().next().is_some_and(is_space);
            let mut tk = Tok::new(label.as_str(), "NN", ws);
            tk.phonemes = ps.map(str::to_string);
            toks.push(tk);
            pos = m.end();
        }
        toks.extend(self.tagged_tokens(&text[pos..]));
        toks
    }

    /// Subtokens grouped into words: a word of several subtokens is read as a whole where it can be.
    fn retokenize(&self, tokens: &[Tok]) -> Vec<Vec<Tok>> {
        let mut words: Vec<(Vec<Tok>, bool)> = Vec::new();
        let mut currency: Option<String> = None;
        for (i, token) in tokens.iter().enumerate() {
            let mut tks: Vec<Tok> = if token.is_set() {
                vec![token.clone()]
            } else {
                let pieces = find_all(&self.subtoken, &token.text);
                pieces
                    .into_iter()
                    .map(|t| Tok {
                        text: t.to_string(),
                        whitespace: false,
                        is_head: true,
                        prespace: false,
                        ..token.clone()
                    })
                    .collect()
            };
            let Some(last) = tks.last_mut() else { continue };
            last.whitespace = token.whitespace;
            let m = tks.len();
            for j in 0..m {
                let around = (j > 0 && j + 1 < m).then(|| {
                    format!(
                        "{}{}",
                        tks[j - 1].text.chars().last().unwrap_or(' '),
                        tks[j + 1].text.chars().next().unwrap_or(' ')
                    )
                });
                let tk = &mut tks[j];
                if tk.is_set() {
                } else if tk.tag == "$" && CURRENCIES.iter().any(|(s, _, _)| *s == tk.text) {
                    currency = Some(tk.text.clone());
                    tk.phonemes = Some(String::new());
                } else if tk.tag == ":" && (tk.text == "-" || tk.text == "–") {
                    tk.phonemes = Some("—".into());
                } else if PUNCT_TAGS.contains(&tk.tag.as_str()) && !all_lower_ascii_letters(&tk.text) {
                    tk.phonemes = Some(punct_tag_phonemes(&tk.tag, &tk.text));
                } else if currency.is_some() {
                    if tk.tag != "CD" {
                        currency = None;
                    } else if j + 1 == m && (i + 1 == tokens.len() || tokens[i + 1].tag != "CD") {
                        tk.currency = currency.clone();
                    }
                } else if tk.text == "2" && around.is_some_and(|a| str_is_alpha(&a)) {
                    tk.alias = Some("to".into());
                }
                let mut tk = tk.clone();
                if tk.is_set() {
                    words.push((vec![tk], false));
                } else if let Some((group, _)) =
                    words.last_mut().filter(|(g, is_list)| *is_list && !g[g.len() - 1].whitespace)
                {
                    tk.is_head = false;
                    group.push(tk);
                } else {
                    let is_list = !tk.whitespace;
                    words.push((vec![tk], is_list));
                }
            }
        }
        words.into_iter().map(|(group, _)| group).collect()
    }

    /// Unknown word: letters go to the OOV network, digit runs to the number reader, symbols to a table.
    fn fallback(&self, tk: &Tok) -> String {
        let mut out = Vec::new();
        for (s, e) in find_ranges(&self.fallback_piece, &tk.text) {
            let piece = &tk.text[s..e];
            let first = piece.chars().next().unwrap_or(' ');
            let ps = if is_digit(first) {
                self.lexicon.get_number(piece, None, false)
            } else if is_alpha(first) {
                self.oov.read(piece)
            } else {
                let table = |c: char| SYMBOL_PHONEMES.iter().find(|(s, _)| *s == c).map_or("", |(_, p)| p);
                Some(piece.chars().map(table).collect())
            };
            if let Some(ps) = ps.filter(|p| !p.is_empty()) {
                out.push(ps);
            }
        }
        out.join(" ")
    }

    /// A word of several subtokens: the longest known spans from the right, else the fallback.
    fn read_group(&self, w: &mut [Tok], mut ctx: Context) -> Context {
        let (mut left, mut right) = (0, w.len());
        let mut should_fallback = false;
        while left < right {
            let found = if w[left..right].iter().any(Tok::is_set) {
                None
            } else {
                let tk = merge_tokens(&w[left..right], None);
                self.lexicon.read(&tk, &ctx).map(|ps| (ps, tk))
            };
            if let Some((ps, tk)) = found {
                w[left].phonemes = Some(ps.clone());
                w[left + 1..right].iter_mut().for_each(|x| x.phonemes = Some(String::new()));
                ctx = token_context(ctx, Some(&ps), &tk);
                right = left;
                left = 0;
            } else if left + 1 < right {
                left += 1;
            } else {
                right -= 1;
                let tk = &mut w[right];
                if tk.phonemes.is_none() {
                    if !is_junk(&tk.text) {
                        should_fallback = true;
                        break;
                    }
                    tk.phonemes = Some(String::new());
                }
                left = 0;
            }
        }
        if should_fallback {
            let ps = self.fallback(&merge_tokens(w, None));
            w[0].phonemes = Some(ps);
            w[1..].iter_mut().for_each(|x| x.phonemes = Some(String::new()));
        } else {
            resolve_tokens(w);
        }
        ctx
    }

    /// Fills in the tokens' phonemes, right to left so each word sees the one after it.
    fn phonemize_tokens(&self, tokens: &[Tok]) -> Vec<Tok> {
        let mut words = self.retokenize(tokens);
        let mut ctx = Context::default();
        for w in words.iter_mut().rev() {
            if w.len() > 1 {
                ctx = self.read_group(w, ctx);
                continue;
            }
            let tk = &mut w[0];
            if tk.phonemes.is_none() {
                tk.phonemes = self.lexicon.read(tk, &ctx);
            }
            if tk.phonemes.is_none() {
                tk.phonemes = Some(self.fallback(tk));
            }
            ctx = token_context(ctx, tk.phonemes.as_deref(), tk);
        }
        let mut out: Vec<Tok> =
            words.iter().map(|w| if w.len() == 1 { w[0].clone() } else { merge_tokens(w, Some("")) }).collect();
        for tk in &mut out {
            if let Some(p) = tk.phonemes.as_mut() {
                *p = p.replace('ɾ', "T").replace('ʔ', "t");
            }
        }
        out
    }

    /// The phonemes of one sentence, a space where the text had one.
    pub fn phonemize(&self, text: &str) -> String {
        let text = self.normalizer.normalize(text);
        let mut out = String::new();
        for tk in self.phonemize_tokens(&self.tokenize(&text)) {
            out.push_str(tk.phonemes.as_deref().unwrap_or_default());
            if tk.whitespace {
                out.push(' ');
            }
        }
        super::pystr::strip(&out).to_string()
    }
}
