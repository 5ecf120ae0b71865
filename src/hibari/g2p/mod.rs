//! English text to the voice's phonemes: normalization, tokenization, tagging, lexicon and the OOV network.
