use super::*;

const RATE: u32 = 24_000;

/// A second of a 440 Hz tone at half scale.
fn tone(num_samples: usize) -> Vec<f32> {
    (0..num_samples).map(|i| 0.5 * (2.0 * std::f32::consts::PI * 440.0 * i as f32 / RATE as f32).sin()).collect()
}

/// Each format's bytes for `chunks` pushed one after another, then the end.
fn encode(format: AudioFormat, chunks: &[&[f32]]) -> (Vec<Vec<u8>>, Vec<u8>) {
    let mut encoder = Encoder::new(format, RATE).expect("an encoder");
    let pushed = chunks.iter().map(|c| encoder.push(c).expect("encoding")).collect();
    (pushed, encoder.finish().expect("finishing"))
}

/// Ogg pages as (header type flags, granule position, packet lengths).
fn ogg_pages(mut bytes: &[u8]) -> Vec<(u8, u64, Vec<usize>)> {
    let mut pages = Vec::new();
    while !bytes.is_empty() {
        assert_eq!(&bytes[..4], b"OggS", "a page starts with its capture pattern");
        let granule = u64::from_le_bytes(bytes[6..14].try_into().unwrap());
        let num_segments = bytes[26] as usize;
        let lacing = &bytes[27..27 + num_segments];
        let mut packets = vec![0];
        for &l in lacing {
            *packets.last_mut().unwrap() += l as usize;
            if l < 255 {
                packets.push(0);
            }
        }
        packets.pop();
        pages.push((bytes[5], granule, packets));
        bytes = &bytes[27 + num_segments + lacing.iter().map(|&l| l as usize).sum::<usize>()..];
    }
    pages
}

#[test]
fn test_formats_are_named_as_openai_names_them() {
    let names: Vec<&str> = AudioFormat::ALL.iter().map(|f| f.name()).collect();
    assert_eq!(names, ["mp3", "opus", "aac", "flac", "wav", "pcm"]);
    for format in AudioFormat::ALL {
        assert_eq!(AudioFormat::parse(format.name()), Some(format));
    }
    assert_eq!(AudioFormat::parse("MP3"), None);
    assert_eq!(AudioFormat::parse("ogg"), None);
}

#[test]
fn test_the_first_bytes_come_with_the_first_audio() {
    let audio = tone(RATE as usize / 4);
    for format in AudioFormat::ALL {
        let (pushed, _) = encode(format, &[&[], &audio]);
        assert!(pushed[0].is_empty(), "{format:?} sent {} bytes before any audio", pushed[0].len());
        let first = &pushed[1];
        let magic: &[u8] = match format {
            AudioFormat::Mp3 => &[0xff],
            AudioFormat::Opus => b"OggS",
            AudioFormat::Aac => &[0xff],
            AudioFormat::Flac => b"fLaC",
            AudioFormat::Wav => b"RIFF",
            AudioFormat::Pcm => &first[..2],
        };
        assert!(first.starts_with(magic), "{format:?} starts with {:02x?}", &first[..first.len().min(8)]);
        assert!(first.len() > 100, "{format:?} sent only {} bytes for a quarter second", first.len());
    }
}

#[test]
fn test_every_chunk_holds_whole_frames() {
    let audio = tone(RATE as usize);
    let chunks: Vec<&[f32]> = audio.chunks(6000).collect();
    // LAME sends bytes as its bit reservoir frees them, across frame boundaries, so mp3 is not here.
    for (format, sync, header) in [(AudioFormat::Aac, 0xfff0u16, 0), (AudioFormat::Flac, 0xfff8, 42)] {
        let (mut sent, last) = encode(format, &chunks);
        sent.push(last);
        sent[0].drain(..header);
        for (i, bytes) in sent.iter().enumerate().filter(|(_, b)| !b.is_empty()) {
            let word = u16::from_be_bytes([bytes[0], bytes[1]]);
            assert_eq!(word & sync, sync, "{format:?} chunk {i} starts with {word:04x}, not a frame's sync word");
        }
    }
}

#[test]
fn test_ogg_opus_marks_where_the_audio_ends() {
    let num_samples = 12_345;
    let audio = tone(num_samples);
    let (pushed, last) = encode(AudioFormat::Opus, &[&audio[..5000], &audio[5000..]]);
    let pages = ogg_pages(&[pushed.concat(), last].concat());
    let (bytes, _) = encode(AudioFormat::Opus, &[&audio]);
    let head = &bytes[0][28..47];
    assert_eq!(&head[..8], b"OpusHead");
    let pre_skip = u16::from_le_bytes([head[10], head[11]]) as u64;
    assert_eq!(u32::from_le_bytes(head[12..16].try_into().unwrap()), RATE, "the input rate");
    assert!(pre_skip > 0, "the encoder looks ahead");
    // OpusHead and OpusTags each alone on a page of granule 0, the first page marked beginning of stream.
    assert_eq!((pages[0].0, pages[0].1, pages[0].2.len()), (2, 0, 1));
    assert_eq!((pages[1].0, pages[1].1, pages[1].2.len()), (0, 0, 1));
    let (flags, granule, _) = pages.last().unwrap();
    assert_eq!(*flags & 4, 4, "the last page ends the stream");
    assert_eq!(*granule, pre_skip + 2 * num_samples as u64, "the last granule is the audio's end at 48 kHz");
    let num_packets: usize = pages[2..].iter().map(|p| p.2.len()).sum();
    assert!(num_packets as u64 * 960 >= *granule, "{num_packets} packets of 20 ms cannot reach {granule}");
    assert!((num_packets as u64 - 1) * 960 < *granule, "{num_packets} packets: more than the audio needs");
    let granules: Vec<u64> = pages.iter().map(|p| p.1).collect();
    assert!(granules.windows(2).all(|w| w[0] <= w[1]), "granules go back: {granules:?}");
}

#[test]
fn test_flac_header_leaves_the_length_unknown() {
    let (pushed, last) = encode(AudioFormat::Flac, &[&tone(3000)]);
    let bytes = [pushed.concat(), last.clone()].concat();
    assert_eq!(&bytes[..4], b"fLaC");
    assert_eq!(bytes[4], 0x80, "one metadata block, STREAMINFO, the last");
    let info = &bytes[8..42];
    assert_eq!(u16::from_be_bytes([info[0], info[1]]), 1024, "min block size");
    assert_eq!(u16::from_be_bytes([info[2], info[3]]), 1024, "max block size");
    assert_eq!(&info[4..10], &[0; 6], "frame sizes unknown");
    let packed = u64::from_be_bytes(info[10..18].try_into().unwrap());
    assert_eq!(packed >> 44, RATE as u64, "sample rate");
    assert_eq!((packed >> 41) & 7, 0, "one channel");
    assert_eq!((packed >> 36) & 31, 15, "16 bits");
    assert_eq!(packed & ((1 << 36) - 1), 0, "total samples unknown");
    // Two whole blocks go out with the audio, the rest at the end.
    assert_eq!(&pushed[0][42..44], &[0xff, 0xf8], "a frame follows the header");
    assert!(!last.is_empty() && last[..2] == [0xff, 0xf8], "the short last block comes at the end");
}

#[test]
fn test_pcm_and_wav_carry_the_samples_and_empty_streams_end_cleanly() {
    let (pcm, _) = encode(AudioFormat::Pcm, &[&[0.5, -1.0]]);
    assert_eq!(pcm[0], [0x00, 0x40, 0x01, 0x80]);
    let (wav, _) = encode(AudioFormat::Wav, &[&[0.5, -1.0]]);
    assert_eq!(wav[0][..44], streaming_wav_header(RATE));
    assert_eq!(wav[0][44..], pcm[0]);
    // LAME's flush writes one silent frame; the others end with their header alone, or nothing.
    for format in AudioFormat::ALL.into_iter().filter(|&f| f != AudioFormat::Mp3) {
        let (_, last) = encode(format, &[]);
        let header_only = matches!(format, AudioFormat::Wav | AudioFormat::Flac | AudioFormat::Opus);
        assert_eq!(!last.is_empty(), header_only, "{format:?} with no audio ends with {} bytes", last.len());
    }
}
