//! Streamed replies: server-sent events in OpenAI's chunk shapes, ending in `data: [DONE]`.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream::{self, Stream, StreamExt};
use serde::Serialize;
use tensorfold_actors::request_types::{Event, FinishReason, TokenLogprob, Usage};
use tokio::sync::mpsc;

use super::openai::{
    ChatChunkChoice, ChatCompletionChunk, ChatLogprobs, ChunkUsage, CompletionChoice, CompletionLogprobs, Delta,
};
use super::reply::{merged_usage, Kind, LogprobText, ReplyMeta, ENDED_EARLY};
use super::tools::{tool_deltas, tool_finish_reason, StreamPart, ToolStream};
use super::validate::ReplyOptions;
use crate::server::error::ApiError;
use tensorfold_engine::text::reasoning::{Piece, ReasoningSplit};
use tensorfold_engine::text::tokenizer::Tokenizer;

pub const DONE: &str = "data: [DONE]\n\n";

/// One `data:` event; serializing our own types cannot fail, but if it did the client gets an error event.
fn frame(value: &impl Serialize) -> String {
    match serde_json::to_string(value) {
        Ok(json) => format!("data: {json}\n\n"),
        Err(e) => error_frame(&ApiError::Internal(format!("serializing a chunk: {e}"))),
    }
}

fn error_frame(error: &ApiError) -> String {
    let body = error.body();
    serde_json::to_string(&body).map_or_else(|_| String::new(), |json| format!("data: {json}\n\n"))
}

/// One choice's part of the stream.
struct ChoiceState {
    logprobs: Option<LogprobText>,
    /// The prompt's text under `echo`: the choice's first chunk.
    prefix: String,
    /// Set when the choice is done.
    usage: Option<Usage>,
    /// Holds back text that may start a tool call, when tools are in play.
    tools: Option<ToolStream>,
    /// Splits reasoning from the answer, when the template thinks.
    reasoning: Option<ReasoningSplit>,
}

impl ChoiceState {
    /// A chat token's deltas: its reasoning, then the answer's content and calls.
    fn deltas(&mut self, text: String) -> Vec<Delta> {
        let pieces = match self.reasoning.as_mut() {
            Some(split) => split.push(&text),
            None => vec![Piece::Answer(text)],
        };
        self.piece_deltas(pieces)
    }

    fn piece_deltas(&mut self, pieces: Vec<Piece>) -> Vec<Delta> {
        let mut deltas = Vec::new();
        for piece in pieces {
            match piece {
                Piece::Reasoning(text) => deltas.push(Delta::reasoning(text)),
                Piece::Answer(text) => deltas.extend(tool_deltas(self.tools.as_mut(), text)),
            }
        }
        deltas
    }
}

/// Turns the events of a request's choices into SSE text.
pub struct ChunkWriter {
    meta: ReplyMeta,
    include_usage: bool,
    n: usize,
    choices: Vec<ChoiceState>,
}

impl ChunkWriter {
    /// A writer for one choice per prefix (empty unless `echo`).
    pub fn new(
        meta: ReplyMeta,
        options: ReplyOptions,
        tokenizer: Arc<Tokenizer>,
        prefixes: Vec<String>,
    ) -> ChunkWriter {
        let choices = prefixes
            .into_iter()
            .map(|prefix| ChoiceState {
                logprobs: options.logprobs.then(|| LogprobText::new(Arc::clone(&tokenizer))),
                prefix,
                usage: None,
                tools: options.tools.map(ToolStream::new),
                reasoning: options.reasoning.map(ReasoningSplit::new),
            })
            .collect();
        ChunkWriter { meta, include_usage: options.include_usage, n: options.n, choices }
    }

    fn usage(&self) -> ChunkUsage {
        if self.include_usage {
            ChunkUsage::Null
        } else {
            ChunkUsage::Absent
        }
    }

    fn chat_chunk(&self, choices: Vec<ChatChunkChoice>, usage: ChunkUsage) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.meta.id.clone(),
            object: "chat.completion.chunk",
            created: self.meta.created,
            model: self.meta.model.clone(),
            choices,
            usage,
        }
    }

    /// What goes out before any token: each chat choice announces the assistant's role, and each echoed
    /// completion choice its prompt.
    pub fn opening(&self) -> String {
        let mut out = String::new();
        for (index, choice) in (0..).zip(&self.choices) {
            match self.meta.kind {
                Kind::Chat => {
                    let delta = Delta { role: Some("assistant"), content: Some(String::new()), ..Delta::default() };
                    let choice = ChatChunkChoice { index, delta, logprobs: None, finish_reason: None };
                    out += &frame(&self.chat_chunk(vec![choice], self.usage()));
                }
                Kind::Completion if !choice.prefix.is_empty() => {
                    let text = choice.prefix.clone();
                    let choice = CompletionChoice { index, text, logprobs: None, finish_reason: None };
                    out += &frame(&self.meta.completion(vec![choice], self.usage()));
                }
                Kind::Completion => {}
            }
        }
        out
    }

    /// The text for choice `index`'s next event (`None` when its channel closed), and whether the stream is over.
    pub fn event(&mut self, index: usize, event: Option<Event>) -> (String, bool) {
        match event {
            Some(Event::Token { id, text, logprob }) => (self.token(index, id, text, logprob.as_ref()), false),
            Some(Event::Done { finish, usage, .. }) => self.done(index, finish, usage),
            Some(Event::Error(e)) => (error_frame(&ApiError::Engine(e)) + DONE, true),
            Some(Event::Audio { .. } | Event::Embedding { .. }) => {
                (error_frame(&ApiError::Internal("audio on a text request".into())) + DONE, true)
            }
            None => (error_frame(&ApiError::Internal(ENDED_EARLY.into())) + DONE, true),
        }
    }

    fn token(&mut self, index: usize, id: u32, text: String, logprob: Option<&TokenLogprob>) -> String {
        let usage = self.usage();
        let Some(choice) = self.choices.get_mut(index) else { return String::new() };
        let logprob = logprob.filter(|_| choice.logprobs.is_some());
        if text.is_empty() && logprob.is_none() {
            return String::new();
        }
        let index = index as u32;
        match self.meta.kind {
            Kind::Chat => {
                let logprobs = match (&choice.logprobs, logprob) {
                    (Some(render), Some(lp)) => Some(ChatLogprobs { content: vec![render.chat(id, lp)] }),
                    _ => None,
                };
                let mut deltas = choice.deltas(text);
                if deltas.is_empty() && logprobs.is_some() {
                    deltas.push(Delta::default());
                }
                let mut logprobs = logprobs;
                let mut chunk =
                    |delta| ChatChunkChoice { index, delta, logprobs: logprobs.take(), finish_reason: None };
                deltas.into_iter().map(|delta| frame(&self.chat_chunk(vec![chunk(delta)], usage))).collect()
            }
            Kind::Completion => {
                let logprobs = match (choice.logprobs.as_mut(), logprob) {
                    (Some(render), Some(lp)) => {
                        let mut entry = CompletionLogprobs::default();
                        render.push_completion(&mut entry, id, lp);
                        Some(entry)
                    }
                    _ => None,
                };
                let choice = CompletionChoice { index, text, logprobs, finish_reason: None };
                frame(&self.meta.completion(vec![choice], usage))
            }
        }
    }

    /// The choice's finish chunk; after the last choice's, the usage chunk and `[DONE]`.
    fn done(&mut self, index: usize, finish: FinishReason, usage: Usage) -> (String, bool) {
        let mut finish_reason = Some(finish.as_str());
        let mut held = Vec::new();
        if let Some(choice) = self.choices.get_mut(index) {
            choice.usage = Some(usage);
            let rest = choice.reasoning.as_mut().map(ReasoningSplit::finish).unwrap_or_default();
            held = choice.piece_deltas(rest);
            if let Some(tools) = choice.tools.as_mut() {
                held.extend(tools.finish().into_iter().map(StreamPart::into_delta));
                finish_reason = Some(tool_finish_reason(tools.made_calls(), finish.as_str()));
            }
        }
        let index = index as u32;
        let mut out = match self.meta.kind {
            Kind::Chat => {
                let chunk = |delta| ChatChunkChoice { index, delta, logprobs: None, finish_reason: None };
                let held: String =
                    held.into_iter().map(|d| frame(&self.chat_chunk(vec![chunk(d)], self.usage()))).collect();
                let choice = ChatChunkChoice { index, delta: Delta::default(), logprobs: None, finish_reason };
                held + &frame(&self.chat_chunk(vec![choice], self.usage()))
            }
            Kind::Completion => {
                let choice = CompletionChoice { index, text: String::new(), logprobs: None, finish_reason };
                frame(&self.meta.completion(vec![choice], self.usage()))
            }
        };
        let usages: Option<Vec<Usage>> = self.choices.iter().map(|c| c.usage).collect();
        let Some(usages) = usages else { return (out, false) };
        if self.include_usage {
            let usage = ChunkUsage::Usage(merged_usage(usages, self.n).into());
            out += &match self.meta.kind {
                Kind::Chat => frame(&self.chat_chunk(Vec::new(), usage)),
                Kind::Completion => frame(&self.meta.completion(Vec::new(), usage)),
            };
        }
        (out + DONE, true)
    }
}

/// One lane's events tagged with its choice index, ending after its last (`None` if the channel closed first).
fn choice_events(index: usize, events: mpsc::Receiver<Event>) -> impl Stream<Item = (usize, Option<Event>)> {
    stream::unfold(Some(events), move |events| async move {
        let mut events = events?;
        let event = events.recv().await;
        let more = matches!(event, Some(Event::Token { .. } | Event::Audio { .. }));
        Some(((index, event), more.then_some(events)))
    })
}

/// The response body; it owns every choice's receiver, so dropping the body (a client gone) cancels them all.
pub fn event_stream(
    lanes: Vec<mpsc::Receiver<Event>>,
    writer: ChunkWriter,
) -> impl Stream<Item = Result<Bytes, Infallible>> + 'static {
    let opening = writer.opening();
    // Chunks of different choices interleave as their tokens arrive.
    let events = stream::select_all(lanes.into_iter().enumerate().map(|(i, rx)| Box::pin(choice_events(i, rx))));
    stream::unfold(Some((events, writer, opening)), |state| async move {
        let (mut events, mut writer, opening) = state?;
        if !opening.is_empty() {
            return Some((Ok(Bytes::from(opening)), Some((events, writer, String::new()))));
        }
        loop {
            let (index, event) = events.next().await.unwrap_or((0, None));
            let (text, finished) = writer.event(index, event);
            if finished {
                // The receivers go with the state, before the last bytes are even written.
                return Some((Ok(Bytes::from(text)), None));
            }
            if !text.is_empty() {
                return Some((Ok(Bytes::from(text)), Some((events, writer, String::new()))));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;
    use crate::server::test_support::tokenizer;
    use tensorfold_actors::request_types::EngineError;

    fn writer(kind: Kind, include_usage: bool, logprobs: bool) -> ChunkWriter {
        let meta = ReplyMeta { id: "id-1".into(), created: 7, model: "tiny".into(), kind };
        ChunkWriter::new(
            meta,
            ReplyOptions { stream: true, include_usage, logprobs, n: 1, tools: None, reasoning: None },
            tokenizer(),
            vec![String::new()],
        )
    }

    fn token(id: u32, text: &str) -> Event {
        Event::Token { id, text: text.into(), logprob: Some(TokenLogprob { logprob: -0.5, top: vec![(id, -0.5)] }) }
    }

    fn done() -> Event {
        Event::Done {
            finish: FinishReason::Stop,
            usage: Usage { prompt_tokens: 4, completion_tokens: 2, cached_tokens: 0 },
            stop_sequence: None,
        }
    }

    /// Runs events through the stream and parses each `data:` payload; `[DONE]` stays a string.
    async fn payloads(writer: ChunkWriter, events: Vec<Event>) -> Vec<serde_json::Value> {
        let (sender, receiver) = mpsc::channel(16);
        for event in events {
            sender.try_send(event).expect("room in the channel");
        }
        drop(sender);
        let chunks: Vec<Bytes> = event_stream(vec![receiver], writer).map(|c| c.expect("infallible")).collect().await;
        let text: String = chunks.iter().map(|c| std::str::from_utf8(c).expect("utf-8")).collect();
        assert!(text.ends_with(DONE), "{text}");
        text.split_terminator("\n\n")
            .map(|event| {
                let data = event.strip_prefix("data: ").expect("every event is data");
                serde_json::from_str(data).unwrap_or_else(|_| serde_json::Value::String(data.to_string()))
            })
            .collect()
    }

    #[actix_web::test]
    async fn test_chat_stream_shape() {
        let events = vec![token(3, "hello"), token(0, ""), token(4, " world"), done()];
        let got = payloads(writer(Kind::Chat, false, false), events).await;
        let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
            serde_json::json!({"id": "id-1", "object": "chat.completion.chunk", "created": 7, "model": "tiny",
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
        };
        let expected = vec![
            chunk(serde_json::json!({"role": "assistant", "content": ""}), serde_json::Value::Null),
            chunk(serde_json::json!({"content": "hello"}), serde_json::Value::Null),
            chunk(serde_json::json!({"content": " world"}), serde_json::Value::Null),
            chunk(serde_json::json!({}), serde_json::json!("stop")),
            serde_json::json!("[DONE]"),
        ];
        assert_eq!(got, expected);
    }

    #[actix_web::test]
    async fn test_include_usage_adds_a_last_chunk_and_nulls() {
        let got = payloads(writer(Kind::Chat, true, false), vec![token(3, "hello"), done()]).await;
        assert_eq!(got.len(), 5);
        assert!(got[..3].iter().all(|c| c["usage"].is_null() && c.get("usage").is_some()));
        assert_eq!(got[3]["choices"], serde_json::json!([]));
        let usage = serde_json::json!({
            "prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6, "prompt_tokens_details": {"cached_tokens": 0}
        });
        assert_eq!(got[3]["usage"], usage);
        assert_eq!(got[4], "[DONE]");
    }

    #[actix_web::test]
    async fn test_completion_stream_shape() {
        let got = payloads(writer(Kind::Completion, true, true), vec![token(3, "hello"), done()]).await;
        assert_eq!(got.len(), 4);
        assert_eq!(got[0]["object"], "text_completion");
        assert_eq!(got[0]["choices"][0]["text"], "hello");
        assert_eq!(got[0]["choices"][0]["logprobs"]["tokens"], serde_json::json!(["hello"]));
        assert_eq!(got[0]["choices"][0]["finish_reason"], serde_json::Value::Null);
        assert_eq!(got[1]["choices"][0]["text"], "");
        assert_eq!(got[1]["choices"][0]["finish_reason"], "stop");
        assert_eq!(got[2]["choices"], serde_json::json!([]));
        assert_eq!(got[2]["usage"]["total_tokens"], 6);
    }

    #[actix_web::test]
    async fn test_chat_logprobs_ride_on_each_token() {
        let got = payloads(writer(Kind::Chat, false, true), vec![token(3, "hello"), done()]).await;
        let entry = &got[1]["choices"][0]["logprobs"]["content"][0];
        assert_eq!(entry["token"], "hello");
        assert_eq!(entry["logprob"], -0.5);
    }

    #[actix_web::test]
    async fn test_error_mid_stream_is_a_final_error_event_named_by_the_engine() {
        let error = Event::Error(EngineError::Device("device lost".into()));
        let got = payloads(writer(Kind::Chat, true, false), vec![token(3, "hello"), error]).await;
        assert_eq!(got.len(), 4);
        let message = "the GPU failed: device lost";
        assert_eq!(
            got[2],
            serde_json::json!({"error": {"message": message, "type": "server_error", "param": null,
                "code": "engine_device_error"}})
        );
        assert_eq!(got[3], "[DONE]");
    }

    #[actix_web::test]
    async fn test_closed_channel_is_not_a_silent_end() {
        let got = payloads(writer(Kind::Completion, false, false), vec![token(3, "hello")]).await;
        assert_eq!(got[1]["error"]["message"], ENDED_EARLY);
        assert_eq!(got[2], "[DONE]");
    }

    #[actix_web::test]
    async fn test_dropping_the_body_drops_the_receiver() {
        let (sender, receiver) = mpsc::channel(4);
        let mut body = Box::pin(event_stream(vec![receiver], writer(Kind::Chat, false, false)));
        assert!(body.next().await.is_some(), "the opening chunk");
        sender.try_send(token(3, "hello")).expect("room");
        assert!(body.next().await.is_some(), "a token chunk");
        assert!(!sender.is_closed());
        drop(body);
        assert!(sender.is_closed(), "the runtime must see the request cancelled");
    }
}
