//! SNAC's `config.json`: the constructor arguments of `snac.SNAC`, with its defaults for absent keys.

use std::ops::Range;
use std::path::Path;

use serde::Deserialize;

use super::Codes;
use crate::error::CodecError;

/// Codebooks this decoder takes; the 24 kHz codec has three.
pub const NUM_CODEBOOKS: usize = 3;

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct SnacConfig {
    pub sampling_rate: u32,
    pub encoder_dim: usize,
    pub encoder_rates: Vec<usize>,
    pub latent_dim: Option<usize>,
    pub decoder_dim: usize,
    pub decoder_rates: Vec<usize>,
    pub attn_window_size: Option<usize>,
    pub codebook_size: usize,
    pub codebook_dim: usize,
    pub vq_strides: Vec<usize>,
    pub noise: bool,
    pub depthwise: bool,
}

/// The defaults of `SNAC.__init__`, so a key left out means what it means to the reference.
impl Default for SnacConfig {
    fn default() -> Self {
        Self {
            sampling_rate: 44100,
            encoder_dim: 64,
            encoder_rates: vec![3, 3, 7, 7],
            latent_dim: None,
            decoder_dim: 1536,
            decoder_rates: vec![7, 7, 3, 3],
            attn_window_size: Some(32),
            codebook_size: 4096,
            codebook_dim: 8,
            vq_strides: vec![8, 4, 2, 1],
            noise: true,
            depthwise: true,
        }
    }
}

impl SnacConfig {
    /// Reads and checks `config.json`; faults name the file.
    pub fn from_file(path: &Path) -> Result<Self, CodecError> {
        let text = std::fs::read_to_string(path).map_err(|source| CodecError::Io { path: path.into(), source })?;
        let config: Self = serde_json::from_str(&text)
            .map_err(|err| CodecError::Format { path: path.into(), fault: format!("bad config: {err}") })?;
        config.validate(path)?;
        Ok(config)
    }

    /// Width of the quantized latent: explicit, or the encoder's output width.
    pub fn latent_dim(&self) -> usize {
        self.latent_dim.unwrap_or(self.encoder_dim << self.encoder_rates.len())
    }

    /// Output samples per latent step (one code of the finest codebook).
    pub fn upsampling(&self) -> usize {
        self.decoder_rates.iter().product()
    }

    /// Output samples per frame of the coarsest codebook.
    pub fn hop_length(&self) -> usize {
        self.vq_strides[0] * self.upsampling()
    }

    /// Codes each codebook holds per coarsest frame.
    pub fn codes_per_frame(&self) -> [usize; NUM_CODEBOOKS] {
        std::array::from_fn(|i| self.vq_strides[0] / self.vq_strides[i])
    }

    /// Frames that `codes` hold, once each codebook's length and every code are checked.
    pub fn num_frames(&self, codes: Codes) -> Result<usize, CodecError> {
        let per_frame = self.codes_per_frame();
        let num_frames = codes[0].len() / per_frame[0];
        for (i, (codes, per)) in codes.iter().zip(per_frame).enumerate() {
            if codes.len() != num_frames * per {
                let want = num_frames * per;
                return Err(CodecError::Codes(format!(
                    "codebook {i} has {} codes; {num_frames} frames need {want}",
                    codes.len()
                )));
            }
            let size = self.codebook_size;
            if let Some(at) = codes.iter().position(|c| *c as usize >= size) {
                return Err(CodecError::Codes(format!("codebook {i} code {} at {at} is not below {size}", codes[at])));
            }
        }
        Ok(num_frames)
    }

    /// Frames of a window of codes whose frames `keep` are to be decoded, once both are checked.
    pub fn window_frames(&self, window: Codes, keep: &Range<usize>) -> Result<usize, CodecError> {
        let num_frames = self.num_frames(window)?;
        if keep.start > keep.end || keep.end > num_frames {
            return Err(CodecError::Frames(format!("{keep:?} is not within the {num_frames} frames of the window")));
        }
        Ok(num_frames)
    }

    fn validate(&self, path: &Path) -> Result<(), CodecError> {
        let unsupported = |what: String| Err(CodecError::Unsupported { path: path.into(), what });
        let bad = |fault: &str| Err(CodecError::Format { path: path.into(), fault: format!("bad config: {fault}") });
        if let Some(window) = self.attn_window_size {
            return unsupported(format!("local attention (attn_window_size {window}); the 24 kHz codec has none"));
        }
        if self.vq_strides.len() != NUM_CODEBOOKS {
            return unsupported(format!("{} codebooks (vq_strides); expected {NUM_CODEBOOKS}", self.vq_strides.len()));
        }
        if self.vq_strides.iter().any(|s| *s == 0 || !self.vq_strides[0].is_multiple_of(*s)) {
            return bad("every vq_stride must divide the first");
        }
        if self.decoder_rates.is_empty() || self.decoder_rates.iter().any(|r| *r == 0 || *r > 64) {
            return bad("decoder_rates must be 1 to 64 each, and at least one");
        }
        if self.decoder_rates.len() >= usize::BITS as usize
            || !self.decoder_dim.is_multiple_of(1 << self.decoder_rates.len())
        {
            return bad("decoder_dim must halve evenly once per decoder rate");
        }
        if self.decoder_dim >> self.decoder_rates.len() == 0 {
            return bad("decoder_dim is too small for its rates");
        }
        if self.encoder_rates.len() >= 32 || self.latent_dim() == 0 || self.codebook_dim == 0 {
            return bad("latent_dim and codebook_dim must be positive");
        }
        if self.codebook_size == 0 || self.codebook_size > u32::MAX as usize {
            return bad("codebook_size must be 1 to 2^32 - 1");
        }
        if self.sampling_rate == 0 {
            return bad("sampling_rate must be positive");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PUBLISHED: &str = r#"{"sampling_rate": 24000, "encoder_dim": 48, "encoder_rates": [2, 4, 8, 8],
        "decoder_dim": 1024, "decoder_rates": [8, 8, 4, 2], "attn_window_size": null, "codebook_size": 4096,
        "codebook_dim": 8, "vq_strides": [4, 2, 1], "noise": true, "depthwise": true}"#;

    fn parse(text: &str) -> Result<SnacConfig, CodecError> {
        let config: SnacConfig = serde_json::from_str(text).unwrap();
        config.validate(Path::new("config.json")).map(|_| config)
    }

    #[test]
    fn test_published_24khz_config_derives_its_sizes() {
        let c = parse(PUBLISHED).unwrap();
        assert_eq!((c.latent_dim(), c.upsampling(), c.hop_length()), (768, 512, 2048));
        assert_eq!(c.codes_per_frame(), [1, 2, 4]);
    }

    #[test]
    fn test_absent_attention_key_means_the_reference_default_and_is_refused() {
        let text = PUBLISHED.replace(r#""attn_window_size": null,"#, "");
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.contains("config.json") && err.contains("attn_window_size 32"), "{err}");
    }

    #[test]
    fn test_bad_strides_and_widths_are_refused() {
        for (from, to) in [("[4, 2, 1]", "[4, 3, 1]"), ("[4, 2, 1]", "[8, 4, 2, 1]"), ("1024", "1000")] {
            let err = parse(&PUBLISHED.replace(from, to)).unwrap_err().to_string();
            assert!(err.starts_with("config.json: "), "{err}");
        }
    }
}
