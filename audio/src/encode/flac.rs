//! FLAC: 16-bit mono frames of one block size, each sent once its block is full; the header leaves the length unknown.

use flacenc::bitsink::ByteSink;
use flacenc::component::{BitRepr, Stream, StreamInfo};
use flacenc::error::Verify;
use flacenc::source::{Fill, FrameBuf};

use super::{AudioFormat, Codec, EncodeError};

/// Samples a frame: a 24 kHz Drama frame is two blocks, so its first window leaves nothing behind.
const BLOCK: usize = 1024;
const BITS_PER_SAMPLE: usize = 16;

pub(super) struct Flac {
    config: flacenc::error::Verified<flacenc::config::Encoder>,
    info: StreamInfo,
    held: Vec<i32>,
    num_frames: usize,
}

fn fault(what: &str, e: impl std::fmt::Debug) -> EncodeError {
    EncodeError::new(AudioFormat::Flac, format!("{what}: {e:?}"))
}

impl Flac {
    /// The codec, and the stream's header: `fLaC` and a STREAMINFO whose length, frame sizes and MD5 are unknown (0).
    pub(super) fn new(sample_rate: u32) -> Result<(Flac, Vec<u8>), EncodeError> {
        let config = flacenc::config::Encoder::default().into_verified().map_err(|(_, e)| fault("config", e))?;
        let mut info =
            StreamInfo::new(sample_rate as usize, 1, BITS_PER_SAMPLE).map_err(|e| fault("stream info", e))?;
        info.set_block_sizes(BLOCK, BLOCK).map_err(|e| fault("block sizes", e))?;
        info.set_frame_sizes(0, 0).map_err(|e| fault("frame sizes", e))?;
        let mut sink = ByteSink::new();
        Stream::with_stream_info(info.clone()).write(&mut sink).map_err(|e| fault("header", e))?;
        Ok((Flac { config, info, held: Vec::new(), num_frames: 0 }, sink.into_inner()))
    }

    /// Encodes `samples` as the stream's next frame.
    fn frame(&mut self, samples: &[i32], out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let mut buf = FrameBuf::with_size(1, samples.len()).map_err(|e| fault("frame buffer", e))?;
        buf.fill_interleaved(samples).map_err(|e| fault("frame buffer", e))?;
        let frame = flacenc::encode_fixed_size_frame(&self.config, &buf, self.num_frames, &self.info)
            .map_err(|e| fault("encode", e))?;
        self.num_frames += 1;
        let mut sink = ByteSink::new();
        frame.write(&mut sink).map_err(|e| fault("frame", e))?;
        out.extend_from_slice(sink.as_slice());
        Ok(())
    }
}

impl Codec for Flac {
    fn encode(&mut self, samples: &[i16], out: &mut Vec<u8>) -> Result<(), EncodeError> {
        self.held.extend(samples.iter().map(|&s| i32::from(s)));
        let num_blocks = self.held.len() / BLOCK;
        let held = std::mem::take(&mut self.held);
        for block in held[..num_blocks * BLOCK].chunks(BLOCK) {
            self.frame(block, out)?;
        }
        self.held = held[num_blocks * BLOCK..].to_vec();
        Ok(())
    }

    fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        // A fixed-block stream's last frame may be shorter than the rest.
        let held = std::mem::take(&mut self.held);
        if !held.is_empty() {
            self.frame(&held, out)?;
        }
        Ok(())
    }
}
