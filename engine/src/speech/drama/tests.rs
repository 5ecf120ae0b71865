//! The Orpheus layout on a hand-made vocabulary: frame assembly, code ranges, voices.

use super::*;

const FIRST_CODE: u32 = 1000;

fn layout() -> DramaLayout {
    DramaLayout {
        bos: 1,
        end_of_text: 2,
        start_of_human: 3,
        end_of_human: 4,
        start_of_ai: 5,
        start_of_speech: 6,
        end_of_speech: 7,
        end_of_ai: 8,
        first_code: FIRST_CODE,
        stop_ids: vec![7, 8],
    }
}

fn token(slot: usize, code: usize) -> u32 {
    FIRST_CODE + (slot * CODEBOOK_SIZE + code) as u32
}

fn frame_tokens(codes: [usize; SLOTS_PER_FRAME]) -> Vec<u32> {
    codes.iter().enumerate().map(|(slot, code)| token(slot, *code)).collect()
}

fn push_all(assembler: &mut FrameAssembler, tokens: &[u32]) -> Vec<Assembled> {
    tokens.iter().map(|t| assembler.push(*t)).collect()
}

#[test]
fn test_frame_slots_go_to_codebooks_in_orpheus_order() {
    let mut assembler = FrameAssembler::new(&layout());
    let out = push_all(&mut assembler, &frame_tokens([10, 11, 12, 13, 14, 15, 16]));
    assert_eq!(out[..6], [Assembled::Pending; 6]);
    assert_eq!(out[6], Assembled::Frame(Frame { c0: [10], c1: [11, 14], c2: [12, 13, 15, 16] }));
    assert_eq!(assembler.num_pending(), 0);
}

#[test]
fn test_non_code_and_passed_slot_tokens_are_skipped_without_moving_the_slot() {
    let mut assembler = FrameAssembler::new(&layout());
    let tokens = frame_tokens([1, 2, 3, 4, 5, 6, 7]);
    let mut with_noise = tokens[..3].to_vec();
    // Text tokens, end-of-speech, the token past the last code, and a slot-1 code at slot 3.
    with_noise.extend([42, 7, FIRST_CODE - 1, token(SLOTS_PER_FRAME, 0), token(1, 9)]);
    with_noise.extend(&tokens[3..]);
    let out = push_all(&mut assembler, &with_noise);
    assert_eq!(out[3..8], [Assembled::Skipped; 5]);
    assert_eq!(out.last(), Some(&Assembled::Frame(Frame { c0: [1], c1: [2, 5], c2: [3, 4, 6, 7] })));
}

#[test]
fn test_a_later_slot_code_takes_its_place_and_drops_only_its_frame() {
    let mut assembler = FrameAssembler::new(&layout());
    let mut tokens = frame_tokens([1, 2, 3, 4, 5, 6, 7]);
    tokens[2] = token(5, 3);
    tokens.extend(frame_tokens([8, 9, 10, 11, 12, 13, 14]));
    let out = push_all(&mut assembler, &tokens);
    assert_eq!(out[6], Assembled::Dropped);
    assert_eq!(out[13], Assembled::Frame(Frame { c0: [8], c1: [9, 12], c2: [10, 11, 13, 14] }));
}

#[test]
fn test_code_zero_and_the_last_code_are_codes() {
    let mut assembler = FrameAssembler::new(&layout());
    let last = CODEBOOK_SIZE - 1;
    let out = push_all(&mut assembler, &frame_tokens([0, last, 0, last, 0, last, 0]));
    let (z, l) = (0, last as u32);
    assert_eq!(out[6], Assembled::Frame(Frame { c0: [z], c1: [l, z], c2: [z, l, l, z] }));
}

#[test]
fn test_frame_codes_concatenate_per_codebook() {
    let mut codes = FrameCodes::default();
    codes.push(&Frame { c0: [1], c1: [2, 3], c2: [4, 5, 6, 7] });
    codes.push(&Frame { c0: [8], c1: [9, 10], c2: [11, 12, 13, 14] });
    assert_eq!(codes.num_frames(), 2);
    assert_eq!(codes.codes(), [&[1, 8][..], &[2, 3, 9, 10][..], &[4, 5, 6, 7, 11, 12, 13, 14][..]]);
}

#[test]
fn test_code_tokens_are_exactly_the_seven_slot_ranges() {
    let l = layout();
    let codes: Vec<bool> =
        [FIRST_CODE - 1, FIRST_CODE, token(6, CODEBOOK_SIZE - 1), token(7, 0)].iter().map(|t| l.is_code(*t)).collect();
    assert_eq!(codes, [false, true, true, false]);
    assert!(l.is_end_of_speech(7) && !l.is_end_of_speech(8));
}

#[test]
fn test_voices_default_to_orpheus_and_reject_unknown_names() {
    let voices = orpheus_voices();
    assert_eq!(voices.check(None).unwrap().name(), "tara");
    assert_eq!(voices.check(Some("zoe")).unwrap().name(), "zoe");
    let err = voices.check(Some("Tara")).unwrap_err().to_string();
    assert!(err.contains("\"Tara\"") && err.contains("tara, leah, jess, leo, dan, mia, zac, zoe"), "{err}");
}

#[test]
fn test_voices_file_names_the_set_and_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(voices_from_dir(dir.path()).unwrap(), orpheus_voices());
    let write = |text: &str| std::fs::write(dir.path().join(VOICES_FILE), text).unwrap();
    write(r#"{"voices": ["anna", "ben"], "default_voice": "ben"}"#);
    let voices = voices_from_dir(dir.path()).unwrap();
    assert_eq!((voices.names().len(), voices.default_voice().name()), (2, "ben"));
    for bad in [
        r#"{"voices": ["anna"], "default_voice": "ben"}"#,
        r#"{"voices": ["anna", "anna"]}"#,
        r#"{"voices": []}"#,
        r#"{"voices": [" "]}"#,
        r#"{"voices": ["anna"], "speed": 2}"#,
        "not json",
    ] {
        write(bad);
        let err = voices_from_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains(VOICES_FILE), "{bad}: {err}");
    }
}
