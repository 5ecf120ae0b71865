//! Ogg Opus (RFC 7845): frames of 20 ms from opus-rs (a pure-Rust port of libopus), each pushed chunk's frames
//! flushed as one Ogg page.

use ogg::writing::{PacketWriteEndInfo, PacketWriter};
use opus_rs::{Application, OpusEncoder};

use super::{AudioFormat, Codec, EncodeError};

/// Opus counts every stream's samples at 48 kHz, whatever rate it was encoded at.
const GRANULE_RATE: u32 = 48_000;
const FRAME_MS: u32 = 20;
const BITRATE: i32 = 96_000;
/// RFC 6716's largest packet.
const MAX_PACKET_BYTES: usize = 1275;
const SERIAL: u32 = 0x7466_6f6c;

pub(super) struct OggOpus {
    encoder: OpusEncoder,
    writer: PacketWriter<'static, Vec<u8>>,
    /// Samples of one frame at the input rate.
    frame: usize,
    /// Granule units (48 kHz samples) per input sample.
    granule_step: u64,
    /// The encoder's look-ahead at 48 kHz, which decoders skip.
    pre_skip: u64,
    /// Samples not yet a whole frame.
    held: Vec<i16>,
    num_samples: u64,
    num_frames: u64,
}

fn fault(what: &str, e: impl std::fmt::Display) -> EncodeError {
    EncodeError::new(AudioFormat::Opus, format!("{what}: {e}"))
}

impl OggOpus {
    /// The codec, and the stream's header pages (OpusHead, OpusTags).
    pub(super) fn new(sample_rate: u32) -> Result<(OggOpus, Vec<u8>), EncodeError> {
        if !matches!(sample_rate, 8_000 | 12_000 | 16_000 | 24_000 | 48_000) {
            return Err(fault("sample rate", format!("{sample_rate} Hz is not one Opus encodes")));
        }
        let mut encoder =
            OpusEncoder::new(sample_rate as i32, 1, Application::Audio).map_err(|e| fault("create", e))?;
        encoder.bitrate_bps = BITRATE;
        let granule_step = u64::from(GRANULE_RATE / sample_rate);
        let pre_skip = lookahead(sample_rate) * granule_step;
        let mut codec = OggOpus {
            encoder,
            writer: PacketWriter::new(Vec::new()),
            frame: (sample_rate * FRAME_MS / 1000) as usize,
            granule_step,
            pre_skip,
            held: Vec::new(),
            num_samples: 0,
            num_frames: 0,
        };
        let head = opus_head(pre_skip as u16, sample_rate);
        codec.write(head, PacketWriteEndInfo::EndPage, 0)?;
        codec.write(opus_tags(), PacketWriteEndInfo::EndPage, 0)?;
        let header = std::mem::take(codec.writer.inner_mut());
        Ok((codec, header))
    }

    fn write(&mut self, packet: Vec<u8>, end: PacketWriteEndInfo, granule: u64) -> Result<(), EncodeError> {
        self.writer.write_packet(packet, SERIAL, end, granule).map_err(|e| fault("ogg", e))
    }

    /// Encodes the whole frames of `held`; the last one ends a page (with the stream when `end` is given).
    fn encode_frames(&mut self, end: Option<u64>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let num_frames = self.held.len() / self.frame;
        for i in 0..num_frames {
            let frame = &self.held[i * self.frame..(i + 1) * self.frame];
            let mut packet = vec![0; MAX_PACKET_BYTES];
            let len = self.encoder.encode_i16(frame, self.frame, &mut packet).map_err(|e| fault("encode", e))?;
            packet.truncate(len);
            self.num_frames += 1;
            let mut granule = self.num_frames * self.frame as u64 * self.granule_step;
            let info = match (i + 1 == num_frames, end) {
                (false, _) => PacketWriteEndInfo::NormalPacket,
                (true, None) => PacketWriteEndInfo::EndPage,
                (true, Some(last)) => {
                    granule = last;
                    PacketWriteEndInfo::EndStream
                }
            };
            self.write(packet, info, granule)?;
        }
        self.held.drain(..num_frames * self.frame);
        out.append(self.writer.inner_mut());
        Ok(())
    }
}

impl Codec for OggOpus {
    fn encode(&mut self, samples: &[i16], out: &mut Vec<u8>) -> Result<(), EncodeError> {
        self.held.extend_from_slice(samples);
        self.num_samples += samples.len() as u64;
        self.encode_frames(None, out)
    }

    fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        // Silence past the end until every sample has left the look-ahead, in whole frames.
        let lookahead = (self.pre_skip / self.granule_step) as usize;
        let needed = self.held.len() + lookahead;
        self.held.resize(needed.div_ceil(self.frame).max(1) * self.frame, 0);
        // The last page's granule marks where the audio ends, so decoders drop the padding.
        let last = self.pre_skip + self.num_samples * self.granule_step;
        self.encode_frames(Some(last), out)
    }
}

/// The encoder's look-ahead in input samples, as libopus reports it: 2.5 ms of its own plus 4 ms of delay compensation.
fn lookahead(sample_rate: u32) -> u64 {
    u64::from(sample_rate / 400 + sample_rate / 250)
}

/// RFC 7845's identification header: version 1, mono, no gain, channel mapping family 0.
fn opus_head(pre_skip: u16, input_rate: u32) -> Vec<u8> {
    let mut head = b"OpusHead".to_vec();
    head.extend([1, 1]);
    head.extend(pre_skip.to_le_bytes());
    head.extend(input_rate.to_le_bytes());
    head.extend(0i16.to_le_bytes());
    head.push(0);
    head
}

/// RFC 7845's comment header: the vendor string and no comments.
fn opus_tags() -> Vec<u8> {
    let vendor = "tensorfold (opus-rs)";
    let mut tags = b"OpusTags".to_vec();
    tags.extend((vendor.len() as u32).to_le_bytes());
    tags.extend(vendor.as_bytes());
    tags.extend(0u32.to_le_bytes());
    tags
}
