//! The voice set every speech family shares: the names a checkpoint speaks with, its default, and the checked voice.

/// A voice of a set; only `Voices::check` makes one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Voice(String);

impl Voice {
    pub fn name(&self) -> &str {
        &self.0
    }
}

/// A voice name no speaker knows, with the names that are valid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown voice {voice:?}; valid voices: {}", valid.join(", "))]
pub struct UnknownVoice {
    pub voice: String,
    pub valid: Vec<String>,
}

/// The checked set of voices a model speaks with, and its default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Voices {
    names: Vec<String>,
    default: usize,
}

impl Voices {
    /// A set of voice names with the default at `default`; `None` if the set is empty or `default` is past its end.
    pub fn new(names: Vec<String>, default: usize) -> Option<Self> {
        (default < names.len()).then_some(Voices { names, default })
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn default_voice(&self) -> Voice {
        Voice(self.names[self.default].clone())
    }

    /// The named voice, or the default for `None`; an unknown name is an error listing the valid ones.
    pub fn check(&self, name: Option<&str>) -> Result<Voice, UnknownVoice> {
        match name {
            None => Ok(self.default_voice()),
            Some(name) if self.names.iter().any(|v| v == name) => Ok(Voice(name.to_string())),
            Some(name) => Err(UnknownVoice { voice: name.to_string(), valid: self.names.clone() }),
        }
    }
}
