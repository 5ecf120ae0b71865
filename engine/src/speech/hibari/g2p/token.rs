//! The token record shared by the tokenizer, tagger and lexicon (misaki's MToken, flattened).

use super::pystr::char_is_own_lower;

/// One token on its way to phonemes.
#[derive(Clone, Debug, Default)]
pub struct Tok {
    pub text: String,
    pub tag: String,
    /// Whether whitespace followed the token in the text.
    pub whitespace: bool,
    pub phonemes: Option<String>,
    pub is_head: bool,
    /// Text the lexicon reads instead of `text` ("2" read as "to").
    pub alias: Option<String>,
    pub currency: Option<String>,
    /// Whether a space goes before the token's phonemes when merged with its neighbours.
    pub prespace: bool,
}

impl Tok {
    pub fn new(text: &str, tag: &str, whitespace: bool) -> Tok {
        Tok { text: text.to_string(), tag: tag.to_string(), whitespace, is_head: true, ..Tok::default() }
    }

    pub fn is_set(&self) -> bool {
        self.alias.is_some() || self.phonemes.is_some()
    }
}

/// The case weight of a token's text: capitals count double.
fn case_weight(text: &str) -> usize {
    text.chars().map(|c| if char_is_own_lower(c) { 1 } else { 2 }).sum()
}

/// `merge_tokens`: tokens read as one word; with `unk`, their phonemes joined (None reads as `unk`).
pub fn merge_tokens(tokens: &[Tok], unk: Option<&str>) -> Tok {
    let last = &tokens[tokens.len() - 1];
    let mut text = String::new();
    for tk in &tokens[..tokens.len() - 1] {
        text.push_str(&tk.text);
        if tk.whitespace {
            text.push(' ');
        }
    }
    text.push_str(&last.text);
    let mut tag_source = &tokens[0];
    for tk in &tokens[1..] {
        if case_weight(&tk.text) > case_weight(&tag_source.text) {
            tag_source = tk;
        }
    }
    let phonemes = unk.map(|unk| {
        let mut ps = String::new();
        for tk in tokens {
            let ends_in_space = ps.chars().last().is_some_and(super::pystr::is_space);
            if tk.prespace && !ps.is_empty() && !ends_in_space && tk.phonemes.as_deref().is_some_and(|p| !p.is_empty())
            {
                ps.push(' ');
            }
            ps.push_str(tk.phonemes.as_deref().unwrap_or(unk));
        }
        ps
    });
    Tok {
        text,
        tag: tag_source.tag.clone(),
        whitespace: last.whitespace,
        phonemes,
        is_head: tokens[0].is_head,
        alias: None,
        currency: tokens.iter().filter_map(|tk| tk.currency.clone()).max(),
        prespace: tokens[0].prespace,
    }
}
