//! A request's events drained from the runtime: its audio as bit patterns, how many pieces it came in, its text.

use tensorfold_actors::request_types::Event;
use tokio::sync::mpsc::Receiver;

/// Audio bits, the number of audio events and the text, once the request is done; panics on an error event.
pub async fn drain(mut rx: Receiver<Event>) -> (Vec<u32>, usize, String) {
    let (mut bits, mut pieces, mut text) = (Vec::new(), 0, String::new());
    while let Some(event) = rx.recv().await {
        match event {
            Event::Audio { pcm } => {
                bits.extend(pcm.iter().map(|s| s.to_bits()));
                pieces += 1;
            }
            Event::Token { text: t, .. } => text.push_str(&t),
            Event::Done { .. } => return (bits, pieces, text),
            Event::Error(e) => panic!("{e}"),
            Event::Embedding { .. } => panic!("an embedding on a token or voice lane"),
        }
    }
    panic!("the stream ended without Done");
}
