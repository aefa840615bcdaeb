//! `POST /v1/chat/completions`: `chat.completion` objects, or `chat.completion.chunk`
//! events when streaming.

use super::generate::{self, Format, TokenOut, Tracker};
use super::openai::{check_model, ChatLogprobs, ChatRequest, TokenLogprob, Usage};
use super::{parse_body, HttpState, ResponseMeta};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::sync::Arc;

pub const ROUTE: &str = "/v1/chat/completions";

pub async fn handle(State(state): State<Arc<HttpState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let mut tracker = Tracker::new(&state, ROUTE);
    let parsed = parse_body::<ChatRequest>(&state, body)
        .and_then(|r| check_model(r.common.model.as_deref(), &state.model_name).map(|_| r))
        .and_then(|r| r.to_engine());
    let (req, opts) = match parsed {
        Ok(p) => p,
        Err(e) => return tracker.reject("invalid", e).into_response(),
    };
    let g = match generate::submit(&state, req, &opts, tracker).await {
        Ok(g) => g,
        Err((_tracker, e)) => return e.into_response(),
    };
    let fmt = ChatFormat { meta: state.meta("chatcmpl"), logprobs: opts.logprobs, return_tokens: opts.return_tokens };
    if opts.stream {
        generate::stream(g, fmt, opts)
    } else {
        generate::collect(g, fmt).await
    }
}

struct ChatFormat {
    meta: ResponseMeta,
    logprobs: bool,
    return_tokens: bool,
}

impl ChatFormat {
    fn logprobs(&self, tokens: &[TokenOut]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let entry = |bytes: &[u8], logprob: f32, top: Option<Vec<TokenLogprob>>| TokenLogprob {
            token: String::from_utf8_lossy(bytes).into_owned(),
            logprob,
            bytes: bytes.to_vec(),
            top_logprobs: top,
        };
        let content = tokens
            .iter()
            .map(|t| {
                let top = t.top.iter().map(|a| entry(&a.bytes, a.logprob, None)).collect();
                entry(&t.bytes, t.logprob, Some(top))
            })
            .collect();
        serde_json::to_value(ChatLogprobs { content }).expect("logprobs serialize")
    }

    fn chunk(&self, choice: Value) -> Value {
        let m = &self.meta;
        json!({
            "id": m.id, "object": "chat.completion.chunk", "created": m.created, "model": m.model,
            "system_fingerprint": m.fingerprint, "choices": [choice],
        })
    }

    fn with_tokens(&self, mut choice: Value, tokens: &[TokenOut]) -> Value {
        if self.return_tokens {
            choice["tokens"] = json!(tokens.iter().map(|t| t.id).collect::<Vec<_>>());
        }
        choice
    }
}

impl Format for ChatFormat {
    fn start_chunk(&self) -> Option<Value> {
        Some(self.chunk(json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null})))
    }

    fn delta_chunk(&self, text: &str, tokens: &[TokenOut], _offset: usize) -> Value {
        let choice = json!({"index": 0, "delta": {"content": text}, "logprobs": self.logprobs(tokens), "finish_reason": null});
        self.chunk(self.with_tokens(choice, tokens))
    }

    fn finish_chunk(&self, finish_reason: &str) -> Value {
        self.chunk(json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish_reason}))
    }

    fn usage_chunk(&self, usage: Usage) -> Value {
        let mut c = self.chunk(Value::Null);
        c["choices"] = json!([]);
        c["usage"] = json!(usage);
        c
    }

    fn response(&self, text: &str, tokens: &[TokenOut], finish_reason: &str, usage: Usage) -> Value {
        let m = &self.meta;
        let choice = json!({
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": self.logprobs(tokens),
            "finish_reason": finish_reason,
        });
        json!({
            "id": m.id, "object": "chat.completion", "created": m.created, "model": m.model,
            "system_fingerprint": m.fingerprint, "choices": [self.with_tokens(choice, tokens)], "usage": usage,
        })
    }
}
