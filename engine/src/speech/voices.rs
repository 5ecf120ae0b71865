//! The voice set every speech family shares: the names a checkpoint speaks with, its default, OpenAI's names for
//! them, and the checked voice.

/// OpenAI's speech voices, in the order its documentation lists them; each is an alias of one loaded voice.
pub const OPENAI_VOICES: [&str; 11] =
    ["alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse"];

/// A voice of a set; only `Voices::check` and `Voices::resolve` make one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Voice(String);

impl Voice {
    pub fn name(&self) -> &str {
        &self.0
    }
}

/// A voice name no speaker knows, with the names that are valid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown voice {voice:?}; valid voices: {}, or one of OpenAI's: {}", valid.join(", "), OPENAI_VOICES.join(", "))]
pub struct UnknownVoice {
    pub voice: String,
    pub valid: Vec<String>,
}

/// The checked set of voices a model speaks with, its default, and the voice each of OpenAI's names stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Voices {
    names: Vec<String>,
    default: usize,
    /// The index in `names` of each of `OPENAI_VOICES`.
    aliases: [usize; OPENAI_VOICES.len()],
}

impl Voices {
    /// A set of voice names with the default at `default`; `None` if the set is empty or `default` is past its end.
    /// OpenAI's names go round the voices in order, from the default: `alloy` is the default voice.
    pub fn new(names: Vec<String>, default: usize) -> Option<Self> {
        let aliases = std::array::from_fn(|i| (default + i) % names.len().max(1));
        (default < names.len()).then_some(Voices { names, default, aliases })
    }

    /// The same voices with OpenAI's names given by `table` (alias, voice); `None` if a name is missing or unknown.
    pub fn with_aliases(mut self, table: &[(&str, &str)]) -> Option<Self> {
        for (slot, alias) in self.aliases.iter_mut().zip(OPENAI_VOICES) {
            let (_, voice) = table.iter().find(|(a, _)| *a == alias)?;
            *slot = self.names.iter().position(|n| n == voice)?;
        }
        Some(self)
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn default_voice(&self) -> Voice {
        Voice(self.names[self.default].clone())
    }

    /// OpenAI's names that stand for `voice`, in OpenAI's order.
    pub fn aliases_of(&self, voice: &str) -> Vec<&'static str> {
        OPENAI_VOICES.iter().zip(self.aliases).filter(|(_, i)| self.names[*i] == voice).map(|(a, _)| *a).collect()
    }

    /// The named voice, or the default for `None`; an unknown name is an error listing the valid ones.
    pub fn check(&self, name: Option<&str>) -> Result<Voice, UnknownVoice> {
        match name {
            None => Ok(self.default_voice()),
            Some(name) if self.names.iter().any(|v| v == name) => Ok(Voice(name.to_string())),
            Some(name) => Err(UnknownVoice { voice: name.to_string(), valid: self.names.clone() }),
        }
    }

    /// As `check`, and one of OpenAI's names gives the voice it stands for; a voice's own name comes first.
    pub fn resolve(&self, name: Option<&str>) -> Result<Voice, UnknownVoice> {
        self.check(name).or_else(|unknown| {
            let alias = OPENAI_VOICES.iter().position(|a| Some(*a) == name).ok_or(unknown)?;
            Ok(Voice(self.names[self.aliases[alias]].clone()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn voices(names: &[&str], default: usize) -> Voices {
        Voices::new(names.iter().map(|n| n.to_string()).collect(), default).expect("a voice set")
    }

    #[test]
    fn test_openai_names_go_round_the_voices_from_the_default() {
        let one = voices(&["heart"], 0);
        assert!(OPENAI_VOICES.iter().all(|a| one.resolve(Some(a)).unwrap().name() == "heart"));
        assert_eq!(one.aliases_of("heart"), OPENAI_VOICES);
        let three = voices(&["a", "b", "c"], 1);
        let got: Vec<String> = OPENAI_VOICES.iter().map(|a| three.resolve(Some(a)).unwrap().name().into()).collect();
        assert_eq!(got, ["b", "c", "a", "b", "c", "a", "b", "c", "a", "b", "c"]);
        assert_eq!(three.aliases_of("a"), ["ballad", "fable", "sage"]);
    }

    #[test]
    fn test_a_voices_own_name_wins_over_an_alias_and_unknown_names_fail() {
        let set = voices(&["echo", "b"], 1);
        assert_eq!(set.resolve(Some("echo")).unwrap().name(), "echo");
        assert_eq!(set.resolve(Some("alloy")).unwrap().name(), "b");
        assert_eq!(set.resolve(None).unwrap().name(), "b");
        let error = set.resolve(Some("nobody")).unwrap_err();
        assert_eq!(error.valid, ["echo", "b"]);
        assert!(error.to_string().contains("alloy, ash"), "{error}");
        assert!(set.check(Some("alloy")).is_err(), "check takes a voice's own names only");
    }

    #[test]
    fn test_an_alias_table_must_name_every_alias_and_known_voices() {
        let table: Vec<(&str, &str)> = OPENAI_VOICES.iter().map(|a| (*a, "b")).collect();
        let set = voices(&["a", "b"], 0).with_aliases(&table).expect("a full table");
        assert_eq!(set.resolve(Some("alloy")).unwrap().name(), "b");
        assert!(voices(&["a", "b"], 0).with_aliases(&table[1..]).is_none(), "alloy is missing");
        let mut wrong = table.clone();
        wrong[3].1 = "z";
        assert!(voices(&["a", "b"], 0).with_aliases(&wrong).is_none(), "voice z is not in the set");
    }
}
