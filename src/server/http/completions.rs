//! `POST /v1/completions` (the legacy text endpoint): `text_completion` objects, streamed
//! as events of the same object type.

use super::generate::{self, Format, TokenOut, Tracker};
use super::openai::{check_model, CompletionLogprobs, CompletionRequest, Usage};
use super::{parse_body, HttpState, ResponseMeta};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::sync::Arc;

pub const ROUTE: &str = "/v1/completions";

pub async fn handle(State(state): State<Arc<HttpState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let mut tracker = Tracker::new(&state, ROUTE);
    let add_bos = state.engine.tokenizer().add_bos_default();
    let parsed = parse_body::<CompletionRequest>(&state, body)
        .and_then(|r| check_model(r.common.model.as_deref(), &state.model_name).map(|_| r))
        .and_then(|r| r.to_engine(add_bos));
    let (req, opts) = match parsed {
        Ok(p) => p,
        Err(e) => return tracker.reject("invalid", e).into_response(),
    };
    let top_logprobs = req.top_logprobs;
    let g = match generate::submit(&state, req, &opts, tracker).await {
        Ok(g) => g,
        Err((_tracker, e)) => return e.into_response(),
    };
    let fmt = CompletionFormat { meta: state.meta("cmpl"), logprobs: opts.logprobs, top_logprobs, return_tokens: opts.return_tokens };
    if opts.stream {
        generate::stream(g, fmt, opts)
    } else {
        generate::collect(g, fmt).await
    }
}

struct CompletionFormat {
    meta: ResponseMeta,
    logprobs: bool,
    /// Alternatives asked for per token (the legacy `logprobs: N`).
    top_logprobs: usize,
    return_tokens: bool,
}

impl CompletionFormat {
    /// `text_offset` counts bytes of the completion from `offset` (the text sent before).
    fn logprobs(&self, tokens: &[TokenOut], offset: usize) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let mut lp = CompletionLogprobs::default();
        if self.top_logprobs > 0 {
            let top =
                tokens.iter().map(|t| t.top.iter().map(|a| (String::from_utf8_lossy(&a.bytes).into_owned(), a.logprob.into())).collect());
            lp.top_logprobs = Some(top.collect());
        }
        let mut at = offset;
        for t in tokens {
            lp.tokens.push(String::from_utf8_lossy(&t.bytes).into_owned());
            lp.token_logprobs.push(t.logprob);
            lp.text_offset.push(at);
            at += t.bytes.len();
        }
        serde_json::to_value(lp).expect("logprobs serialize")
    }

    fn object(&self, choice: Value, tokens: &[TokenOut]) -> Value {
        let m = &self.meta;
        let mut choice = choice;
        if self.return_tokens {
            choice["tokens"] = json!(tokens.iter().map(|t| t.id).collect::<Vec<_>>());
        }
        json!({
            "id": m.id, "object": "text_completion", "created": m.created, "model": m.model,
            "system_fingerprint": m.fingerprint, "choices": [choice],
        })
    }
}

impl Format for CompletionFormat {
    fn start_chunk(&self) -> Option<Value> {
        None
    }

    fn delta_chunk(&self, text: &str, tokens: &[TokenOut], offset: usize) -> Value {
        self.object(json!({"index": 0, "text": text, "logprobs": self.logprobs(tokens, offset), "finish_reason": null}), tokens)
    }

    fn finish_chunk(&self, finish_reason: &str) -> Value {
        self.object(json!({"index": 0, "text": "", "logprobs": null, "finish_reason": finish_reason}), &[])
    }

    fn usage_chunk(&self, usage: Usage) -> Value {
        let mut c = self.object(Value::Null, &[]);
        c["choices"] = json!([]);
        c["usage"] = json!(usage);
        c
    }

    fn response(&self, text: &str, tokens: &[TokenOut], finish_reason: &str, usage: Usage) -> Value {
        let choice = json!({"index": 0, "text": text, "logprobs": self.logprobs(tokens, 0), "finish_reason": finish_reason});
        let mut o = self.object(choice, tokens);
        o["usage"] = json!(usage);
        o
    }
}
