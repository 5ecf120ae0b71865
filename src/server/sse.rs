//! Streamed replies: server-sent events in OpenAI's chunk shapes, ending in `data: [DONE]`.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream::{self, Stream};
use serde::Serialize;
use tensorfold_actors::request_types::{Event, FinishReason, TokenLogprob, Usage};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::openai::{
    ChatChunkChoice, ChatCompletionChunk, ChatLogprobs, ChunkUsage, CompletionChoice, CompletionLogprobs, Delta,
};
use super::reply::{Kind, LogprobText, ReplyMeta, ENDED_EARLY};
use super::validate::ReplyOptions;
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

/// Turns one request's events into SSE text.
pub struct ChunkWriter {
    meta: ReplyMeta,
    include_usage: bool,
    logprobs: Option<LogprobText>,
}

impl ChunkWriter {
    pub fn new(meta: ReplyMeta, options: ReplyOptions, tokenizer: Arc<Tokenizer>) -> ChunkWriter {
        ChunkWriter {
            meta,
            include_usage: options.include_usage,
            logprobs: options.logprobs.then(|| LogprobText::new(tokenizer)),
        }
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

    /// What goes out before any token: the chat stream announces the assistant's role.
    pub fn opening(&self) -> String {
        match self.meta.kind {
            Kind::Chat => {
                let delta = Delta { role: Some("assistant"), content: Some(String::new()) };
                let choice = ChatChunkChoice { index: 0, delta, logprobs: None, finish_reason: None };
                frame(&self.chat_chunk(vec![choice], self.usage()))
            }
            Kind::Completion => String::new(),
        }
    }

    /// The text for the next event (`None` when the channel closed), and whether the stream is over.
    pub fn event(&mut self, event: Option<Event>) -> (String, bool) {
        match event {
            Some(Event::Token { id, text, logprob }) => (self.token(id, text, logprob.as_ref()), false),
            Some(Event::Done { finish, usage }) => (self.done(finish, usage), true),
            Some(Event::Error(e)) => (error_frame(&ApiError::Engine(e)) + DONE, true),
            Some(Event::Audio { .. } | Event::Embedding { .. }) => {
                (error_frame(&ApiError::Internal("audio on a text request".into())) + DONE, true)
            }
            None => (error_frame(&ApiError::Internal(ENDED_EARLY.into())) + DONE, true),
        }
    }

    fn token(&mut self, id: u32, text: String, logprob: Option<&TokenLogprob>) -> String {
        let logprob = logprob.filter(|_| self.logprobs.is_some());
        if text.is_empty() && logprob.is_none() {
            return String::new();
        }
        match self.meta.kind {
            Kind::Chat => {
                let logprobs = match (&self.logprobs, logprob) {
                    (Some(render), Some(lp)) => Some(ChatLogprobs { content: vec![render.chat(id, lp)] }),
                    _ => None,
                };
                let delta = Delta { role: None, content: Some(text) };
                let choice = ChatChunkChoice { index: 0, delta, logprobs, finish_reason: None };
                frame(&self.chat_chunk(vec![choice], self.usage()))
            }
            Kind::Completion => {
                let logprobs = match (self.logprobs.as_mut(), logprob) {
                    (Some(render), Some(lp)) => {
                        let mut entry = CompletionLogprobs::default();
                        render.push_completion(&mut entry, id, lp);
                        Some(entry)
                    }
                    _ => None,
                };
                let choice = CompletionChoice { index: 0, text, logprobs, finish_reason: None };
                frame(&self.meta.completion(vec![choice], self.usage()))
            }
        }
    }

    fn done(&self, finish: FinishReason, usage: Usage) -> String {
        let finish_reason = Some(finish.as_str());
        let mut out = match self.meta.kind {
            Kind::Chat => {
                let choice = ChatChunkChoice { index: 0, delta: Delta::default(), logprobs: None, finish_reason };
                frame(&self.chat_chunk(vec![choice], self.usage()))
            }
            Kind::Completion => {
                let choice = CompletionChoice { index: 0, text: String::new(), logprobs: None, finish_reason };
                frame(&self.meta.completion(vec![choice], self.usage()))
            }
        };
        if self.include_usage {
            let usage = ChunkUsage::Usage(usage.into());
            out += &match self.meta.kind {
                Kind::Chat => frame(&self.chat_chunk(Vec::new(), usage)),
                Kind::Completion => frame(&self.meta.completion(Vec::new(), usage)),
            };
        }
        out + DONE
    }
}

/// The response body; it owns the receiver, so dropping the body (a client gone) cancels the request.
pub fn event_stream(
    events: mpsc::Receiver<Event>,
    writer: ChunkWriter,
) -> impl Stream<Item = Result<Bytes, Infallible>> + 'static {
    let opening = writer.opening();
    stream::unfold(Some((events, writer, opening)), |state| async move {
        let (mut events, mut writer, opening) = state?;
        if !opening.is_empty() {
            return Some((Ok(Bytes::from(opening)), Some((events, writer, String::new()))));
        }
        loop {
            let (text, finished) = writer.event(events.recv().await);
            if finished {
                // The receiver goes with the state, before the last bytes are even written.
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

    use super::super::test_support::tokenizer;
    use super::*;
    use tensorfold_actors::request_types::EngineError;

    fn writer(kind: Kind, include_usage: bool, logprobs: bool) -> ChunkWriter {
        let meta = ReplyMeta { id: "id-1".into(), created: 7, model: "tiny".into(), kind };
        ChunkWriter::new(meta, ReplyOptions { stream: true, include_usage, logprobs }, tokenizer())
    }

    fn token(id: u32, text: &str) -> Event {
        Event::Token { id, text: text.into(), logprob: Some(TokenLogprob { logprob: -0.5, top: vec![(id, -0.5)] }) }
    }

    fn done() -> Event {
        Event::Done {
            finish: FinishReason::Stop,
            usage: Usage { prompt_tokens: 4, completion_tokens: 2, cached_tokens: 0 },
        }
    }

    /// Runs events through the stream and parses each `data:` payload; `[DONE]` stays a string.
    async fn payloads(writer: ChunkWriter, events: Vec<Event>) -> Vec<serde_json::Value> {
        let (sender, receiver) = mpsc::channel(16);
        for event in events {
            sender.try_send(event).expect("room in the channel");
        }
        drop(sender);
        let chunks: Vec<Bytes> = event_stream(receiver, writer).map(|c| c.expect("infallible")).collect().await;
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
        let mut body = Box::pin(event_stream(receiver, writer(Kind::Chat, false, false)));
        assert!(body.next().await.is_some(), "the opening chunk");
        sender.try_send(token(3, "hello")).expect("room");
        assert!(body.next().await.is_some(), "a token chunk");
        assert!(!sender.is_closed());
        drop(body);
        assert!(sender.is_closed(), "the runtime must see the request cancelled");
    }
}
