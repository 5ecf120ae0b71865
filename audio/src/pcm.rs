//! PCM as clients receive it: 16-bit little-endian samples, and a WAV header for a stream of unknown length.

/// Bytes of the canonical WAV header.
pub const WAV_HEADER_BYTES: usize = 44;

/// One sample in [-1, 1] as a 16-bit integer; values outside are clipped, NaN is silence.
pub fn to_i16(sample: f32) -> i16 {
    if sample.is_nan() {
        return 0;
    }
    (sample.clamp(-1.0, 1.0) * i16::MAX as f32).round() as i16
}

/// Samples as 16-bit little-endian bytes.
pub fn to_i16_le(pcm: &[f32]) -> Vec<u8> {
    pcm.iter().flat_map(|s| to_i16(*s).to_le_bytes()).collect()
}

/// A mono 16-bit WAV header whose sizes say "unknown length" (0xFFFFFFFF), as streaming servers write it.
pub fn streaming_wav_header(sample_rate: u32) -> [u8; WAV_HEADER_BYTES] {
    let mut h = [0u8; WAV_HEADER_BYTES];
    let (channels, bits) = (1u16, 16u16);
    let block_align = channels * bits / 8;
    h[0..4].copy_from_slice(b"RIFF");
    h[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    h[8..12].copy_from_slice(b"WAVE");
    h[12..16].copy_from_slice(b"fmt ");
    h[16..20].copy_from_slice(&16u32.to_le_bytes());
    h[20..22].copy_from_slice(&1u16.to_le_bytes());
    h[22..24].copy_from_slice(&channels.to_le_bytes());
    h[24..28].copy_from_slice(&sample_rate.to_le_bytes());
    h[28..32].copy_from_slice(&(sample_rate * block_align as u32).to_le_bytes());
    h[32..34].copy_from_slice(&block_align.to_le_bytes());
    h[34..36].copy_from_slice(&bits.to_le_bytes());
    h[36..40].copy_from_slice(b"data");
    h[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_samples_round_and_clip_to_16_bits() {
        let got: Vec<i16> = [0.0, 1.0, -1.0, 2.0, -7.5, 0.5, f32::NAN].iter().map(|s| to_i16(*s)).collect();
        assert_eq!(got, [0, 32767, -32767, 32767, -32767, 16384, 0]);
        assert_eq!(to_i16_le(&[1.0, -1.0 / 32767.0]), [0xff, 0x7f, 0xff, 0xff]);
    }

    #[test]
    fn test_streaming_header_is_a_mono_16_bit_wav_header() {
        let h = streaming_wav_header(24_000);
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap());
        let u16_at = |i: usize| u16::from_le_bytes(h[i..i + 2].try_into().unwrap());
        assert_eq!((&h[0..4], &h[8..16], &h[36..40]), (&b"RIFF"[..], &b"WAVEfmt "[..], &b"data"[..]));
        assert_eq!(
            (u16_at(20), u16_at(22), u32_at(24), u32_at(28), u16_at(32), u16_at(34)),
            (1, 1, 24_000, 48_000, 2, 16)
        );
        assert_eq!((u32_at(4), u32_at(40)), (u32::MAX, u32::MAX));
    }
}
