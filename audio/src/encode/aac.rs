//! AAC-LC in ADTS through the Fraunhofer FDK encoder: each chunk sends the 1024-sample frames it completes.

use fdk_aac::enc::{AudioObjectType, BitRate, ChannelMode, EncoderParams, Transport};

use super::{AudioFormat, Codec, EncodeError};

const BITRATE: u32 = 96_000;
/// Samples an AAC-LC frame.
const FRAME: usize = 1024;

pub(super) struct Adts {
    encoder: fdk_aac::enc::Encoder,
    /// Samples the encoder holds before a frame comes out.
    delay: u64,
    /// Room for the largest frame the encoder may write.
    frame: Vec<u8>,
    num_samples: u64,
    num_frames: u64,
}

fn fault(what: &str, e: impl std::fmt::Display) -> EncodeError {
    EncodeError::new(AudioFormat::Aac, format!("{what}: {e}"))
}

impl Adts {
    pub(super) fn new(sample_rate: u32) -> Result<Adts, EncodeError> {
        let params = EncoderParams {
            bit_rate: BitRate::Cbr(BITRATE),
            sample_rate,
            transport: Transport::Adts,
            channels: ChannelMode::Mono,
            audio_object_type: AudioObjectType::Mpeg4LowComplexity,
        };
        let encoder = fdk_aac::enc::Encoder::new(params).map_err(|e| fault("open", e))?;
        let info = encoder.info().map_err(|e| fault("info", e))?;
        let frame = vec![0; info.maxOutBufBytes as usize];
        Ok(Adts { encoder, delay: u64::from(info.nDelay), frame, num_samples: 0, num_frames: 0 })
    }

    /// Feeds `samples` and appends every frame they complete.
    fn feed(&mut self, mut samples: &[i16], out: &mut Vec<u8>) -> Result<(), EncodeError> {
        loop {
            let done = self.encoder.encode(samples, &mut self.frame).map_err(|e| fault("encode", e))?;
            out.extend_from_slice(&self.frame[..done.output_size]);
            self.num_frames += u64::from(done.output_size > 0);
            samples = &samples[done.input_consumed..];
            if done.input_consumed == 0 && done.output_size == 0 {
                return Ok(());
            }
        }
    }
}

impl Codec for Adts {
    fn encode(&mut self, samples: &[i16], out: &mut Vec<u8>) -> Result<(), EncodeError> {
        self.num_samples += samples.len() as u64;
        self.feed(samples, out)
    }

    fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        // ADTS cannot say where the audio ends: silence pushes the last samples through the encoder's delay.
        let silence = [0i16; FRAME];
        let most_feeds = self.delay as usize / FRAME + 2;
        for _ in 0..most_feeds {
            if self.num_samples == 0 || self.num_frames * (FRAME as u64) >= self.num_samples + self.delay {
                break;
            }
            self.feed(&silence, out)?;
        }
        Ok(())
    }
}
