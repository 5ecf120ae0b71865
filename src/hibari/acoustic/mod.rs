//! The voice's network: phoneme ids to durations, prosody and spectral frames.
