//! Every `response_format` of `/v1/audio/speech` decoded back against the PCM of the same request and seed, chunked
//! and in SSE, on the default voice and the tiny Drama checkpoint.

mod common;

use std::io::Cursor;
use std::path::{Path, PathBuf};

use common::server::Server;
use common::speech::{sse_speech, SseSpeech};
use serde_json::{json, Value};
use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::DecoderOptions;
use symphonia::core::errors::Error as DecodeError;
use symphonia::core::formats::FormatOptions;
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;

const SPEECH: &str = "/v1/audio/speech";
const SAMPLE_RATE: u32 = 24000;
const WAV_HEADER_BYTES: usize = 44;
/// Sentences enough for several windows of the default voice, and of Drama's frames.
const TEXT: &str = "The lighthouse keeper climbed the stairs one last time. The storm arrived before midnight, \
                    and the lamp turned on through the rain until the morning.";
/// Lossy formats must keep this signal-to-noise ratio against the PCM.
const MIN_SNR_DB: f64 = 20.0;
/// Encoder delay searched for when aligning a lossy decode with the PCM (LAME's is 1105, FDK's 2048 at 24 kHz).
const MAX_DELAY: usize = 3072;

fn drama_dir() -> PathBuf {
    let committed = || Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/drama");
    std::env::var_os("TF_TEST_DRAMA").map_or_else(committed, PathBuf::from)
}

/// Drama as the text and speech model, beside the default voice (left out on a test device, which may not fetch it).
fn server() -> Server {
    let dir = drama_dir();
    Server::start_with_model(&dir, &["--speech-model", dir.to_str().expect("a UTF-8 path")])
}

fn on_device() -> bool {
    std::env::var_os("TF_TEST_DEVICE").is_some()
}

fn body(voice: &str, format: &str) -> Value {
    json!({"model": "tts-1", "input": TEXT, "voice": voice, "seed": 7, "response_format": format})
}

/// The audio of a 200 reply, after checking its content type and sample rate.
fn speak(server: &Server, body: &Value, content_type: &str) -> Vec<u8> {
    let response = server.post_json(SPEECH, body);
    assert_eq!(response.status, 200, "{body}: {}\n{}", response.text(), server.stderr());
    assert_eq!(response.header("content-type"), Some(content_type), "{body}: {:?}", response.headers);
    assert_eq!(response.header("x-sample-rate"), Some("24000"), "{body}: {:?}", response.headers);
    response.body
}

fn samples(pcm: &[u8]) -> Vec<i16> {
    pcm.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect()
}

/// 16-bit mono samples decoded by symphonia, which shares no code with our encoders.
fn symphonia_decode(bytes: Vec<u8>, extension: &str) -> Vec<i16> {
    let source = MediaSourceStream::new(Box::new(Cursor::new(bytes)), Default::default());
    let mut hint = Hint::new();
    hint.with_extension(extension);
    let probed = symphonia::default::get_probe()
        .format(&hint, source, &FormatOptions::default(), &MetadataOptions::default())
        .unwrap_or_else(|e| panic!("{extension}: not a stream symphonia reads: {e}"));
    let mut format = probed.format;
    let track = format.default_track().unwrap_or_else(|| panic!("{extension}: no track"));
    assert_eq!(track.codec_params.sample_rate, Some(SAMPLE_RATE), "{extension}: {:?}", track.codec_params);
    let mut decoder = symphonia::default::get_codecs()
        .make(&track.codec_params, &DecoderOptions { verify: true })
        .unwrap_or_else(|e| panic!("{extension}: no decoder: {e}"));
    let mut out = Vec::new();
    loop {
        let packet = match format.next_packet() {
            Ok(packet) => packet,
            Err(DecodeError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => panic!("{extension}: reading a packet: {e}"),
        };
        let decoded = decoder.decode(&packet).unwrap_or_else(|e| panic!("{extension}: decoding a packet: {e}"));
        assert_eq!(decoded.spec().channels.count(), 1, "{extension}: mono");
        let mut buffer = SampleBuffer::<i16>::new(decoded.capacity() as u64, *decoded.spec());
        buffer.copy_interleaved_ref(decoded);
        out.extend_from_slice(buffer.samples());
    }
    out
}

/// Ogg Opus decoded by opus-rs at 24 kHz, its pre-skip dropped and its end cut at the last page's granule (RFC 7845).
fn opus_decode(bytes: Vec<u8>) -> Vec<i16> {
    let mut reader = ogg::PacketReader::new(Cursor::new(bytes));
    let mut next = || reader.read_packet().expect("an Ogg page").expect("another packet");
    let head = next();
    assert_eq!(&head.data[..8], b"OpusHead", "the first packet");
    assert_eq!((head.data[8], head.data[9]), (1, 1), "version 1, mono");
    let pre_skip = u16::from_le_bytes([head.data[10], head.data[11]]) as usize;
    assert_eq!(u32::from_le_bytes(head.data[12..16].try_into().unwrap()), SAMPLE_RATE, "the input rate");
    assert_eq!(&next().data[..8], b"OpusTags", "the second packet");
    let mut decoder = opus_rs::OpusDecoder::new(SAMPLE_RATE as i32, 1).expect("a decoder");
    let (mut out, mut frame) = (Vec::new(), vec![0f32; 5760]);
    loop {
        let packet = next();
        let n = decoder.decode(&packet.data, frame.len(), &mut frame).expect("an Opus packet");
        out.extend(frame[..n].iter().map(|&s| (s * 32768.0).round().clamp(-32768.0, 32767.0) as i16));
        if packet.last_in_stream() {
            // Granules count 48 kHz samples: two of ours each.
            let end = packet.absgp_page() as usize / 2;
            assert!(end <= out.len(), "the last granule {end} is past the {} samples decoded", out.len());
            out.truncate(end);
            return out.split_off((pre_skip / 2).min(out.len()));
        }
    }
}

/// The SNR in dB of `decoded` against `reference`, at the delay in 0..=MAX_DELAY that fits a second of it best.
fn aligned_snr(reference: &[i16], decoded: &[i16]) -> (f64, usize) {
    let noise_at = |delay: usize, span: std::ops::Range<usize>| -> f64 {
        let shifted = decoded.iter().skip(delay + span.start).map(|&s| f64::from(s)).chain(std::iter::repeat(0.0));
        reference[span].iter().zip(shifted).map(|(&r, d)| (f64::from(r) - d).powi(2)).sum()
    };
    // The delay is chosen on the loudest second and the SNR measured over the whole.
    let second = SAMPLE_RATE as usize;
    let energy = |start: usize| reference[start..].iter().take(second).map(|&s| f64::from(s).powi(2)).sum::<f64>();
    let starts = (0..reference.len()).step_by(second / 4).map(|start| (start, energy(start)));
    let (loudest, _) = starts.max_by(|a, b| a.1.total_cmp(&b.1)).unwrap_or((0, 0.0));
    let probe = loudest..(loudest + second).min(reference.len());
    let delays = (0..=MAX_DELAY.min(decoded.len())).map(|delay| (delay, noise_at(delay, probe.clone())));
    let (delay, _) = delays.min_by(|a, b| a.1.total_cmp(&b.1)).unwrap_or((0, 0.0));
    let signal: f64 = reference.iter().map(|&s| f64::from(s).powi(2)).sum();
    (10.0 * (signal / noise_at(delay, 0..reference.len()).max(1.0)).log10(), delay)
}

/// Every format of one request against its PCM; lossy ones only where the audio is speech.
fn check_formats(server: &Server, voice: &str, lossy: bool) {
    let pcm = samples(&speak(server, &body(voice, "pcm"), "audio/pcm"));
    assert!(pcm.len() >= 4 * 2048, "{voice}: {} samples, fewer than four Drama frames", pcm.len());
    let wav = speak(server, &body(voice, "wav"), "audio/wav");
    assert!(samples(&wav[WAV_HEADER_BYTES..]) == pcm, "{voice}: WAV samples differ from the PCM");
    let flac = symphonia_decode(speak(server, &body(voice, "flac"), "audio/flac"), "flac");
    assert_eq!(flac.len(), pcm.len(), "{voice}: FLAC length");
    assert!(flac == pcm, "{voice}: FLAC decodes to other samples than the PCM");
    if !lossy {
        return;
    }
    // Opus's last granule cuts its padding; LAME adds its delay of 1105 and at most two 576-sample frames of padding;
    // FDK's ADTS adds its delay of 2048 and pads the last 1024-sample frame.
    let lossy = [("opus", "audio/ogg", 0), ("mp3", "audio/mpeg", 1105 + 2 * 576), ("aac", "audio/aac", 2048 + 1024)];
    for (format, content_type, most_extra) in lossy {
        let bytes = speak(server, &body(voice, format), content_type);
        let decoded = if format == "opus" { opus_decode(bytes) } else { symphonia_decode(bytes, format) };
        let extra = decoded.len() as i64 - pcm.len() as i64;
        assert!(
            (0..=most_extra as i64).contains(&extra),
            "{voice} {format}: {} samples for {}",
            decoded.len(),
            pcm.len()
        );
        let (snr, delay) = aligned_snr(&pcm, &decoded);
        println!(
            "{voice} {format}: {} samples for {}, SNR {snr:.1} dB at a delay of {delay}",
            decoded.len(),
            pcm.len()
        );
        assert!(snr >= MIN_SNR_DB, "{voice} {format}: SNR {snr:.1} dB (delay {delay}) is below {MIN_SNR_DB} dB");
    }
}

#[test]
fn test_every_format_decodes_back_to_the_pcm_of_the_same_request() {
    let server = server();
    check_formats(&server, "tara", false);
    if on_device() {
        println!("skipping the default voice: a test device does not load it");
        return;
    }
    check_formats(&server, "heart", true);
}

#[test]
fn test_sse_carries_every_format_as_it_is_encoded() {
    let server = server();
    let voices: &[&str] = if on_device() { &["tara"] } else { &["tara", "heart"] };
    for voice in voices {
        for format in ["mp3", "opus", "aac", "flac", "wav", "pcm"] {
            let request = body(voice, format);
            let chunked = server.post_json(SPEECH, &request).body;
            let SseSpeech { audio: sse, num_deltas, .. } = sse_speech(&server, &request);
            assert!(
                sse == chunked,
                "{voice} {format}: SSE carried {} bytes, the chunked reply {}",
                sse.len(),
                chunked.len()
            );
            // The first bytes leave with the first window's audio, long before the last window is made.
            assert!(num_deltas > 2, "{voice} {format}: the audio came in {num_deltas} pieces");
        }
    }
}

#[test]
fn test_the_default_format_is_mp3_and_bad_formats_name_the_accepted_ones() {
    let server = server();
    let mut request = body("tara", "mp3");
    request.as_object_mut().expect("an object").remove("response_format");
    let default = speak(&server, &request, "audio/mpeg");
    assert!(default == speak(&server, &body("tara", "mp3"), "audio/mpeg"), "the default is not the mp3 reply");
    for bad in ["ogg", "MP3", "", "wave"] {
        let response = server.post_json(SPEECH, &body("tara", bad));
        assert_eq!(response.status, 400, "{bad:?}: {}", response.text());
        let error = &response.json()["error"];
        assert_eq!(error["param"], "response_format", "{error}");
        let message = error["message"].as_str().unwrap_or_default();
        let accepted = r#""mp3", "opus", "aac", "flac", "wav", "pcm""#;
        assert!(message.contains(accepted), "{bad:?}: {message:?} does not list {accepted}");
    }
}
