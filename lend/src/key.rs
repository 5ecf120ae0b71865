//! The key a client presents: given inline, or the first line of a file read as the claim is made.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;

use crate::wire::MAX_KEY;

/// Where the key comes from; each names the setting it came from, for refusals.
#[derive(Clone)]
pub enum KeySource {
    Inline { key: String, setting: String },
    File { path: PathBuf, setting: String },
}

impl std::fmt::Debug for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySource::Inline { setting, .. } => write!(f, "KeySource::Inline({setting})"),
            KeySource::File { setting, .. } => write!(f, "KeySource::File({setting})"),
        }
    }
}

/// A key refused before it reached the wire; neither the key nor the file's path or bytes are in the message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{setting}: {fault}")]
pub struct KeyError {
    pub setting: String,
    pub fault: &'static str,
}

impl KeySource {
    /// The key's bytes; a file is opened and read here and nowhere else.
    pub fn read(&self) -> Result<Vec<u8>, KeyError> {
        match self {
            KeySource::Inline { key, setting } => check(key.as_bytes(), setting),
            KeySource::File { path, setting } => {
                let err = |fault| KeyError { setting: setting.clone(), fault };
                let meta = std::fs::metadata(path).map_err(|_| err("the key file cannot be found or read"))?;
                if !meta.is_file() {
                    return Err(err("the key file is not a regular file"));
                }
                let file = std::fs::File::open(path).map_err(|_| err("the key file cannot be opened"))?;
                let mut line = Vec::new();
                // One byte past the limit is enough to know the line is too long.
                let mut reader = BufReader::new(std::io::Read::take(file, MAX_KEY as u64 + 2));
                reader.read_until(b'\n', &mut line).map_err(|_| err("the key file cannot be read"))?;
                if line.last() == Some(&b'\n') {
                    line.pop();
                    if line.last() == Some(&b'\r') {
                        line.pop();
                    }
                } else if line.len() > MAX_KEY {
                    return Err(err("the key file's first line is 256 bytes or longer"));
                }
                check(&line, setting)
            }
        }
    }
}

fn check(key: &[u8], setting: &str) -> Result<Vec<u8>, KeyError> {
    let err = |fault| KeyError { setting: setting.to_string(), fault };
    match key.len() {
        0 => Err(err("the key is empty")),
        n if n > MAX_KEY => Err(err("the key is 256 bytes or longer")),
        _ => Ok(key.to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTING: &str = "TF_CARVEOUT_KEY_FILE";

    fn from_file(bytes: &[u8]) -> (tempfile::TempDir, Result<Vec<u8>, KeyError>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, bytes).unwrap();
        let got = KeySource::File { path, setting: SETTING.into() }.read();
        (dir, got)
    }

    fn fault(bytes: &[u8]) -> String {
        let err = from_file(bytes).1.expect_err("the key file should be refused");
        let text = err.to_string();
        assert!(text.starts_with("TF_CARVEOUT_KEY_FILE: "), "{text}");
        assert!(!text.contains("/tmp") && !text.contains("key\""), "the message shows the path: {text}");
        text
    }

    #[test]
    fn test_a_key_file_gives_its_first_line() {
        assert_eq!(from_file(b"open sesame\nsecond line\n").1.unwrap(), b"open sesame");
        assert_eq!(from_file(b"crlf\r\n").1.unwrap(), b"crlf");
        assert_eq!(from_file(b"no newline").1.unwrap(), b"no newline");
        let longest = vec![b'k'; 255];
        assert_eq!(from_file(&[longest.as_slice(), b"\n"].concat()).1.unwrap(), longest);
    }

    #[test]
    fn test_each_key_file_refusal_names_the_setting_and_shows_no_bytes() {
        assert!(fault(b"\nsecret on line two\n").contains("the key is empty"));
        assert!(!fault(b"\nsecret on line two\n").contains("secret"));
        assert!(fault(b"").contains("the key is empty"));
        let long = [vec![b's'; 256], b"\n".to_vec()].concat();
        assert!(fault(&long).contains("256 bytes or longer"));
        assert!(fault(&vec![b's'; 4000]).contains("256 bytes or longer"));
        let dir = tempfile::tempdir().unwrap();
        let missing = KeySource::File { path: dir.path().join("absent"), setting: SETTING.into() };
        assert!(missing.read().unwrap_err().to_string().contains("cannot be found"));
        let not_regular = KeySource::File { path: dir.path().to_path_buf(), setting: SETTING.into() };
        assert!(not_regular.read().unwrap_err().to_string().contains("not a regular file"));
    }

    #[test]
    fn test_an_inline_key_is_checked_like_a_file_line() {
        let inline = |key: &str| KeySource::Inline { key: key.into(), setting: "TF_CARVEOUT_KEY".into() }.read();
        assert_eq!(inline("k").unwrap(), b"k");
        assert_eq!(inline("").unwrap_err().to_string(), "TF_CARVEOUT_KEY: the key is empty");
        assert!(!format!("{:?}", KeySource::Inline { key: "hunter2".into(), setting: "S".into() }).contains("hunter2"));
    }
}
