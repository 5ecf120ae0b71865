//! The averaged-perceptron part-of-speech tagger of tagger.json.gz: tag dictionary first, then the weights.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::Deserialize;

use super::files;
use super::pystr::{self, is_alpha, is_digit, str_is_alpha, str_is_digit, str_is_lower, str_is_upper};
use super::G2pError;

const START: [&str; 2] = ["-START2-", "-START-"];
const END: [&str; 2] = ["-END-", "-END2-"];

#[derive(Deserialize)]
struct Model {
    tags: Vec<String>,
    tagdict: HashMap<String, String>,
    vocab: Option<Vec<String>>,
    weights: HashMap<String, HashMap<String, f64>>,
}

/// The tagger: tags, the tag dictionary, the context vocabulary and per-feature weights by tag index.
pub struct Tagger {
    tags: Vec<String>,
    tagdict: HashMap<String, String>,
    vocab: Option<HashSet<String>>,
    weights: HashMap<String, Vec<(usize, f64)>>,
}

/// `norm`: hyphenated words, years and digit strings fold to one feature each.
fn norm(w: &str) -> String {
    if w.contains('-') && !w.starts_with('-') {
        "!HYPHEN".into()
    } else if str_is_digit(w) && pystr::len(w) == 4 {
        "!YEAR".into()
    } else if w.chars().next().is_some_and(is_digit) {
        "!DIGITS".into()
    } else {
        pystr::lower(w)
    }
}

/// `shape`: a word's letter-case and digit pattern.
fn shape(w: &str) -> String {
    if str_is_alpha(w) {
        if str_is_lower(w) {
            return "x".into();
        }
        if str_is_upper(w) {
            return if pystr::len(w) > 1 { "XX".into() } else { "X1".into() };
        }
        let first_upper = w.chars().next().is_some_and(|c| str_is_upper(&c.to_string()));
        if first_upper && str_is_lower(pystr::tail(w, 1)) {
            return "Xx".into();
        }
        return "xX".into();
    }
    if str_is_digit(w) {
        return "d".into();
    }
    pystr::head(w, 4)
        .chars()
        .map(|c| {
            if is_digit(c) {
                'd'
            } else if is_alpha(c) {
                'x'
            } else {
                c
            }
        })
        .collect()
}

impl Tagger {
    pub fn load(dir: &Path) -> Result<Tagger, G2pError> {
        let model: Model = files::json(dir, "tagger.json.gz")?;
        let index: HashMap<&str, usize> = model.tags.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
        let mut weights = HashMap::with_capacity(model.weights.len());
        for (feature, by_tag) in &model.weights {
            let mut row = Vec::with_capacity(by_tag.len());
            for (tag, w) in by_tag {
                let Some(&i) = index.get(tag.as_str()) else {
                    return Err(G2pError::Format {
                        path: dir.join("tagger.json.gz"),
                        reason: format!("feature {feature:?} weighs unknown tag {tag:?}"),
                    });
                };
                row.push((i, *w));
            }
            weights.insert(feature.clone(), row);
        }
        Ok(Tagger {
            tags: model.tags,
            tagdict: model.tagdict,
            vocab: model.vocab.map(|v| v.into_iter().collect()),
            weights,
        })
    }

    /// The normalized words of the feature window, words outside the vocabulary replaced by their shape.
    fn context(&self, words: &[String]) -> Vec<String> {
        let mut out: Vec<String> = START.iter().map(|s| s.to_string()).collect();
        for w in words {
            let n = norm(w);
            let known = self.vocab.as_ref().is_none_or(|v| v.contains(&n));
            out.push(if known { n } else { format!("<{}>", shape(w)) });
        }
        out.extend(END.iter().map(|s| s.to_string()));
        out
    }

    fn features(i: usize, word: &str, ctx: &[String], prev: &str, prev2: &str) -> [String; 15] {
        let j = i + 2;
        let first: String = word.chars().take(1).collect();
        [
            "b".to_string(),
            format!("s3={}", pystr::last(word, 3)),
            format!("p1={first}"),
            format!("w={}", ctx[j]),
            format!("sh={}", shape(word)),
            if i == 0 { "i0".to_string() } else { "i+".to_string() },
            format!("t-1={prev}"),
            format!("t-2={prev2}"),
            format!("t-12={prev},{prev2}"),
            format!("w-1={}", ctx[j - 1]),
            format!("s3-1={}", pystr::last(&ctx[j - 1], 3)),
            format!("w-2={}", ctx[j - 2]),
            format!("w+1={}", ctx[j + 1]),
            format!("s3+1={}", pystr::last(&ctx[j + 1], 3)),
            format!("w+2={}", ctx[j + 2]),
        ]
    }

    /// The best-scoring tag; per tag the weights add in feature order, and a tie goes to the larger tag name.
    fn predict(&self, features: &[String]) -> String {
        let mut scores = vec![0f64; self.tags.len()];
        let mut any = false;
        for f in features {
            if let Some(row) = self.weights.get(f).filter(|r| !r.is_empty()) {
                any = true;
                for &(t, w) in row {
                    scores[t] += w;
                }
            }
        }
        if !any {
            return "NN".into();
        }
        let mut best = 0;
        for t in 1..self.tags.len() {
            let better = scores[t] > scores[best] || (scores[t] == scores[best] && self.tags[t] > self.tags[best]);
            if better {
                best = t;
            }
        }
        self.tags[best].clone()
    }

    /// One tag per word.
    pub fn tag(&self, words: &[String]) -> Vec<String> {
        let ctx = self.context(words);
        let (mut prev, mut prev2) = (START[1].to_string(), START[0].to_string());
        let mut tags = Vec::with_capacity(words.len());
        for (i, w) in words.iter().enumerate() {
            let tag = match self.tagdict.get(w) {
                Some(t) => t.clone(),
                None => self.predict(&Tagger::features(i, w, &ctx, &prev, &prev2)),
            };
            prev2 = std::mem::replace(&mut prev, tag.clone());
            tags.push(tag);
        }
        tags
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_shape_and_norm() {
        assert_eq!(shape("hello"), "x");
        assert_eq!(shape("NASA"), "XX");
        assert_eq!(shape("A"), "X1");
        assert_eq!(shape("Hello"), "Xx");
        assert_eq!(shape("iPhone"), "xX");
        assert_eq!(shape("1984"), "d");
        assert_eq!(shape("3.14159"), "d.dd");
        assert_eq!(shape("can't"), "xxx'");
        assert_eq!(norm("well-known"), "!HYPHEN");
        assert_eq!(norm("1984"), "!YEAR");
        assert_eq!(norm("3rd"), "!DIGITS");
        assert_eq!(norm("Hello"), "hello");
    }

    #[test]
    fn test_predict_breaks_ties_by_tag_name() {
        let tagger = Tagger {
            tags: vec!["NN".into(), "VB".into(), "JJ".into()],
            tagdict: HashMap::new(),
            vocab: None,
            weights: [("b".to_string(), vec![(0, 1.5), (1, 1.5), (2, -1.0)])].into_iter().collect(),
        };
        assert_eq!(tagger.predict(&["b".to_string()]), "VB");
        assert_eq!(tagger.predict(&["x".to_string()]), "NN");
        let heavier = [("b".to_string(), vec![(0, 0.1), (1, 0.2)]), ("c".to_string(), vec![(0, 0.2)])];
        let tagger = Tagger { weights: heavier.into_iter().collect(), ..tagger };
        assert_eq!(tagger.predict(&["b".to_string(), "c".to_string()]), "NN");
    }
}
