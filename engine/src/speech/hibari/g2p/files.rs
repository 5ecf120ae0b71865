//! Reading the voice's data files: plain or gzipped JSON, with errors that name the file.

use std::fmt;
use std::io::Read;
use std::marker::PhantomData;
use std::path::Path;

use serde::de::{DeserializeOwned, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::G2pError;

/// The bytes of `name` in `dir`, gunzipped when the name ends in `.gz`.
pub fn read(dir: &Path, name: &str) -> Result<Vec<u8>, G2pError> {
    let path = dir.join(name);
    let raw = std::fs::read(&path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => G2pError::Missing { path: path.clone() },
        _ => G2pError::Io { path: path.clone(), source },
    })?;
    if !name.ends_with(".gz") {
        return Ok(raw);
    }
    let mut out = Vec::with_capacity(raw.len() * 4);
    flate2::read::GzDecoder::new(raw.as_slice())
        .read_to_end(&mut out)
        .map_err(|source| G2pError::Io { path, source })?;
    Ok(out)
}

/// `name` in `dir` parsed as JSON into `T`.
pub fn json<T: DeserializeOwned>(dir: &Path, name: &str) -> Result<T, G2pError> {
    let bytes = read(dir, name)?;
    serde_json::from_slice(&bytes).map_err(|source| G2pError::Json { path: dir.join(name), source })
}

/// A JSON object kept in the file's order, which the normalizer's tables depend on.
#[derive(Debug, Clone)]
pub struct Ordered<V>(pub Vec<(String, V)>);

impl<V> Ordered<V> {
    pub fn get(&self, key: &str) -> Option<&V> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| k.as_str())
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Ordered<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct OrderedVisitor<V>(PhantomData<V>);

        impl<'de, V: Deserialize<'de>> Visitor<'de> for OrderedVisitor<V> {
            type Value = Ordered<V>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some((k, v)) = map.next_entry()? {
                    out.push((k, v));
                }
                Ok(Ordered(out))
            }
        }

        deserializer.deserialize_map(OrderedVisitor(PhantomData))
    }
}
