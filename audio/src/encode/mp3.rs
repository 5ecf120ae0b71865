//! MP3 through LAME: constant bit rate, mono, each chunk's whole frames sent as LAME completes them.

use mp3lame_encoder::{Bitrate, Builder, FlushGap, MonoPcm, Quality};

use super::{AudioFormat, Codec, EncodeError};

/// The highest rate MPEG-2 Layer III allows at 16 to 24 kHz, as OpenAI's mp3 speech is sent.
const BITRATE: Bitrate = Bitrate::Kbps160;
/// What LAME may write on its final flush.
const FLUSH_BYTES: usize = 7200;

pub(super) struct Mp3(mp3lame_encoder::Encoder);

fn fault(what: &str, e: impl std::fmt::Debug) -> EncodeError {
    EncodeError::new(AudioFormat::Mp3, format!("{what}: {e:?}"))
}

impl Mp3 {
    pub(super) fn new(sample_rate: u32) -> Result<Mp3, EncodeError> {
        let mut builder = Builder::new().ok_or_else(|| fault("lame_init", "no memory"))?;
        builder.set_num_channels(1).map_err(|e| fault("channels", e))?;
        builder.set_sample_rate(sample_rate).map_err(|e| fault("sample rate", e))?;
        builder.set_brate(BITRATE).map_err(|e| fault("bit rate", e))?;
        builder.set_mode(mp3lame_encoder::Mode::Mono).map_err(|e| fault("mode", e))?;
        builder.set_quality(Quality::Good).map_err(|e| fault("quality", e))?;
        builder.set_to_write_vbr_tag(false).map_err(|e| fault("tag", e))?;
        Ok(Mp3(builder.build().map_err(|e| fault("lame_init_params", e))?))
    }
}

impl Codec for Mp3 {
    fn encode(&mut self, samples: &[i16], out: &mut Vec<u8>) -> Result<(), EncodeError> {
        // LAME's own bound on the bytes one call may write.
        out.reserve(samples.len() * 5 / 4 + FLUSH_BYTES);
        self.0.encode_to_vec(MonoPcm(samples), out).map_err(|e| fault("encode", e))?;
        Ok(())
    }

    fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        out.reserve(FLUSH_BYTES);
        self.0.flush_to_vec::<FlushGap>(out).map_err(|e| fault("flush", e))?;
        Ok(())
    }
}
