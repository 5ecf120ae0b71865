//! One assistant turn of a chat-shaped request, read as text and whole tool calls: what the Responses and
//! Messages APIs build on, so each of them only shapes its own events.

use std::sync::Arc;

use tensorfold_actors::request_types::{Event, FinishReason, Usage, ValidRequest, Work};
use tensorfold_engine::boundary::TokenWork;
use tensorfold_engine::text::reasoning::{Piece, ReasoningSplit};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::text::openai::{ChatCompletionRequest, ToolCallDelta};
use super::text::reply::ENDED_EARLY;
use super::text::routes::validated_chat;
use super::text::tools::{StreamPart, ToolStream};
use super::text::validate::{TextModel, Validated};
use super::{AppState, Backend};

/// A piece of the assistant's reply, in the order the model wrote it.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    /// Thinking of a template that thinks, split from the answer.
    Reasoning(String),
    Text(String),
    /// A whole call: `arguments` is JSON text.
    Call {
        id: String,
        name: String,
        arguments: String,
    },
}

/// How the turn ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct End {
    pub finish: FinishReason,
    pub made_calls: bool,
    pub usage: Usage,
    /// The stop string that ended the text, when one did.
    pub stop_sequence: Option<String>,
}

/// What the next event of a turn gives: parts, and the end once the lane is done.
#[derive(Debug, PartialEq)]
pub struct Step {
    pub parts: Vec<Part>,
    pub end: Option<End>,
}

/// A running turn; dropping it drops the lane's receiver, which cancels the lane.
pub struct Turn {
    events: mpsc::Receiver<Event>,
    tools: Option<ToolStream>,
    reasoning: Option<ReasoningSplit>,
    done: bool,
}

/// Validates `request` as chat completions would (one choice) and submits its lane; with `keep_reply` the reply
/// is cached with the prompt, for a next turn that continues it.
pub async fn start<B: Backend>(
    state: &AppState<B>,
    request: ChatCompletionRequest,
    keep_reply: bool,
) -> Result<Turn, ApiError> {
    let Validated { lanes, reply, .. } = validated_chat(state, request).await?;
    let Some(work) = lanes.into_iter().next() else {
        return Err(ApiError::Internal("a chat request without a lane".into()));
    };
    let work = TokenWork { keep_reply, ..work };
    let request = ValidRequest { model: state.model_name.clone(), work: Work::Tokens(work) };
    let events = state.runtime.submit(request).await?;
    Ok(Turn::new(events, reply.tools.map(ToolStream::new), reply.reasoning.map(ReasoningSplit::new)))
}

/// What validation reads of the server's text model.
pub fn text_model<B: Backend>(state: &AppState<B>) -> TextModel {
    TextModel {
        tokenizer: Arc::clone(&state.tokenizer),
        grammars: state.grammars.clone(),
        context: state.runtime.limits(&state.model_name).context,
    }
}

impl Turn {
    pub fn new(events: mpsc::Receiver<Event>, tools: Option<ToolStream>, reasoning: Option<ReasoningSplit>) -> Turn {
        Turn { events, tools, reasoning, done: false }
    }

    /// The parts the lane's next event completes; an error once the lane failed or vanished.
    pub async fn next(&mut self) -> Result<Step, ApiError> {
        if self.done {
            return Err(ApiError::Internal("the turn is already over".into()));
        }
        match self.events.recv().await {
            Some(Event::Token { text, .. }) => Ok(Step { parts: self.parts(&text), end: None }),
            Some(Event::Done { finish, usage, stop_sequence }) => {
                self.done = true;
                let rest = self.reasoning.as_mut().map(ReasoningSplit::finish).unwrap_or_default();
                let mut parts = self.pieces(rest);
                parts.extend(self.tools.as_mut().map(|t| parts_of(t.finish())).unwrap_or_default());
                let made_calls = self.tools.as_ref().is_some_and(ToolStream::made_calls);
                Ok(Step { parts, end: Some(End { finish, made_calls, usage, stop_sequence }) })
            }
            Some(Event::Error(e)) => Err(self.failed(ApiError::Engine(e))),
            Some(Event::Audio { .. } | Event::Embedding { .. }) => {
                Err(self.failed(ApiError::Internal("audio on a text request".into())))
            }
            None => Err(self.failed(ApiError::Internal(ENDED_EARLY.into()))),
        }
    }

    /// Every part, neighbouring texts joined, and the end.
    pub async fn collect(mut self) -> Result<(Vec<Part>, End), ApiError> {
        let mut all: Vec<Part> = Vec::new();
        loop {
            let step = self.next().await?;
            for part in step.parts {
                match (all.last_mut(), part) {
                    (Some(Part::Text(text)), Part::Text(more)) => text.push_str(&more),
                    (Some(Part::Reasoning(text)), Part::Reasoning(more)) => text.push_str(&more),
                    (_, part) => all.push(part),
                }
            }
            if let Some(end) = step.end {
                return Ok((all, end));
            }
        }
    }

    fn parts(&mut self, text: &str) -> Vec<Part> {
        if text.is_empty() {
            return Vec::new();
        }
        let pieces = match self.reasoning.as_mut() {
            Some(split) => split.push(text),
            None => vec![Piece::Answer(text.to_string())],
        };
        self.pieces(pieces)
    }

    /// Reasoning as it is; the answer through the tool parser, when tools are in play.
    fn pieces(&mut self, pieces: Vec<Piece>) -> Vec<Part> {
        let mut out = Vec::new();
        for piece in pieces {
            match (piece, self.tools.as_mut()) {
                (Piece::Reasoning(text), _) => out.push(Part::Reasoning(text)),
                (Piece::Answer(text), None) => out.push(Part::Text(text)),
                (Piece::Answer(text), Some(tools)) => out.extend(parts_of(tools.push(&text))),
            }
        }
        out
    }

    fn failed(&mut self, error: ApiError) -> ApiError {
        self.done = true;
        error
    }
}

fn parts_of(stream: Vec<StreamPart>) -> Vec<Part> {
    stream
        .into_iter()
        .filter_map(|part| match part {
            StreamPart::Content(text) if text.is_empty() => None,
            StreamPart::Content(text) => Some(Part::Text(text)),
            StreamPart::Call(ToolCallDelta { id, function, .. }) => Some(Part::Call {
                id: id.unwrap_or_default(),
                name: function.name.unwrap_or_default(),
                arguments: function.arguments.unwrap_or_default(),
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensorfold_engine::text::tool_calls::ToolFormat;

    fn done() -> Event {
        Event::Done {
            finish: FinishReason::Stop,
            usage: Usage { prompt_tokens: 3, completion_tokens: 2, cached_tokens: 1 },
            stop_sequence: None,
        }
    }

    fn token(text: &str) -> Event {
        Event::Token { id: 3, text: text.into(), logprob: None }
    }

    fn turn(events: Vec<Event>, tools: Option<ToolFormat>) -> Turn {
        let (sender, receiver) = mpsc::channel(16);
        for event in events {
            sender.try_send(event).expect("room in the channel");
        }
        Turn::new(receiver, tools.map(ToolStream::new), None)
    }

    #[actix_web::test]
    async fn test_texts_are_joined_and_the_end_carries_usage() {
        let (parts, end) =
            turn(vec![token("hello"), token(""), token(" world"), done()], None).collect().await.expect("ok");
        assert_eq!(parts, vec![Part::Text("hello world".into())]);
        assert_eq!(end.usage.cached_tokens, 1);
        assert!(!end.made_calls);
    }

    #[actix_web::test]
    async fn test_a_closed_lane_is_an_error_not_an_end() {
        let error = turn(vec![token("hello")], None).collect().await.expect_err("no Done");
        assert_eq!(error.to_string(), ENDED_EARLY);
    }

    #[actix_web::test]
    async fn test_a_call_comes_whole_between_texts() {
        let call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>";
        let events = vec![token("Sure. "), token(&call[..9]), token(&call[9..]), done()];
        let (parts, end) = turn(events, Some(ToolFormat::Hermes)).collect().await.expect("ok");
        assert_eq!(parts.len(), 2, "{parts:?}");
        assert_eq!(parts[0], Part::Text("Sure. ".into()));
        let Part::Call { id, name, arguments } = &parts[1] else { panic!("a call: {parts:?}") };
        assert!(id.starts_with("call_"));
        assert_eq!((name.as_str(), arguments.as_str()), ("f", "{\"x\":1}"));
        assert!(end.made_calls);
    }
}
