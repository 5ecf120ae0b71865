//! Speech codecs and PCM; the speech family arrives with the speech issue.
