//! Speech as clients ask for it: each response format's streaming encoder over the voice's mono samples.

mod aac;
mod flac;
mod mp3;
mod opus;

use crate::pcm::{streaming_wav_header, to_i16};

/// The formats `/v1/audio/speech` answers in, as OpenAI names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AudioFormat {
    /// MPEG-1/2 Layer III, constant bit rate, no Xing tag (a stream cannot go back to fill it in).
    Mp3,
    /// Opus in Ogg (RFC 7845).
    Opus,
    /// AAC-LC in ADTS frames.
    Aac,
    /// FLAC, 16-bit, its header saying the length is unknown.
    Flac,
    /// A WAV header for a stream of unknown length, then 16-bit samples.
    Wav,
    /// Raw 16-bit little-endian samples.
    Pcm,
}

impl AudioFormat {
    /// Every format, in the order OpenAI lists them.
    pub const ALL: [AudioFormat; 6] =
        [AudioFormat::Mp3, AudioFormat::Opus, AudioFormat::Aac, AudioFormat::Flac, AudioFormat::Wav, AudioFormat::Pcm];

    pub fn name(self) -> &'static str {
        match self {
            AudioFormat::Mp3 => "mp3",
            AudioFormat::Opus => "opus",
            AudioFormat::Aac => "aac",
            AudioFormat::Flac => "flac",
            AudioFormat::Wav => "wav",
            AudioFormat::Pcm => "pcm",
        }
    }

    pub fn parse(name: &str) -> Option<AudioFormat> {
        AudioFormat::ALL.into_iter().find(|f| f.name() == name)
    }

    pub fn content_type(self) -> &'static str {
        match self {
            AudioFormat::Mp3 => "audio/mpeg",
            AudioFormat::Opus => "audio/ogg",
            AudioFormat::Aac => "audio/aac",
            AudioFormat::Flac => "audio/flac",
            AudioFormat::Wav => "audio/wav",
            AudioFormat::Pcm => "audio/pcm",
        }
    }
}

/// An encoder that failed; the stream cannot go on.
#[derive(Debug, thiserror::Error)]
#[error("{format} encoder: {fault}")]
pub struct EncodeError {
    pub format: &'static str,
    pub fault: String,
}

impl EncodeError {
    fn new(format: AudioFormat, fault: impl std::fmt::Display) -> EncodeError {
        EncodeError { format: format.name(), fault: fault.to_string() }
    }
}

/// One format's codec: 16-bit samples in, the bytes ready to send out.
trait Codec: Send {
    fn encode(&mut self, samples: &[i16], out: &mut Vec<u8>) -> Result<(), EncodeError>;
    /// Encodes what is held back and ends the stream.
    fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), EncodeError>;
}

/// PCM and WAV samples need no codec.
struct Raw;

impl Codec for Raw {
    fn encode(&mut self, samples: &[i16], out: &mut Vec<u8>) -> Result<(), EncodeError> {
        out.extend(samples.iter().flat_map(|s| s.to_le_bytes()));
        Ok(())
    }

    fn finish(&mut self, _out: &mut Vec<u8>) -> Result<(), EncodeError> {
        Ok(())
    }
}

/// A speech stream's encoder: samples in as the voice makes them, bytes out as soon as the format allows.
pub struct Encoder {
    codec: Box<dyn Codec>,
    /// The stream's header, sent with the first audio so the first bytes out carry sound.
    header: Option<Vec<u8>>,
}

impl Encoder {
    /// An encoder of `format` for mono samples at `sample_rate`.
    pub fn new(format: AudioFormat, sample_rate: u32) -> Result<Encoder, EncodeError> {
        let (codec, header): (Box<dyn Codec>, Vec<u8>) = match format {
            AudioFormat::Pcm => (Box::new(Raw), Vec::new()),
            AudioFormat::Wav => (Box::new(Raw), streaming_wav_header(sample_rate).to_vec()),
            AudioFormat::Mp3 => (Box::new(mp3::Mp3::new(sample_rate)?), Vec::new()),
            AudioFormat::Aac => (Box::new(aac::Adts::new(sample_rate)?), Vec::new()),
            AudioFormat::Flac => flac::Flac::new(sample_rate).map(|(c, h)| (Box::new(c) as Box<dyn Codec>, h))?,
            AudioFormat::Opus => opus::OggOpus::new(sample_rate).map(|(c, h)| (Box::new(c) as Box<dyn Codec>, h))?,
        };
        Ok(Encoder { codec, header: Some(header) })
    }

    /// The bytes of the next samples that are ready to send; empty while the codec waits for a whole frame.
    pub fn push(&mut self, pcm: &[f32]) -> Result<Vec<u8>, EncodeError> {
        let samples: Vec<i16> = pcm.iter().map(|&s| to_i16(s)).collect();
        let mut out = Vec::new();
        self.codec.encode(&samples, &mut out)?;
        if !out.is_empty() {
            if let Some(header) = self.header.take() {
                out.splice(0..0, header);
            }
        }
        Ok(out)
    }

    /// The stream's last bytes: what the codec held back, and the header if no audio came before; push no more.
    pub fn finish(&mut self) -> Result<Vec<u8>, EncodeError> {
        let mut out = self.header.take().unwrap_or_default();
        self.codec.finish(&mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
