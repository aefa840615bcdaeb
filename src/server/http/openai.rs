//! The OpenAI wire types (the subset civetta serves) and their mapping onto the engine's
//! [`GenerationRequest`]. Every field is optional or nullable where OpenAI's is, unknown
//! fields are ignored (clients send many), and features the engine does not have are
//! refused with a 400 naming the field rather than silently ignored.

use super::error::ApiError;
use crate::engine::{self, ChatMessage, FinishReason, GenerationRequest, PromptInput, SamplingParams};
use serde::{Deserialize, Serialize};

/// OpenAI's default temperature when the field is absent.
const DEFAULT_TEMPERATURE: f32 = 1.0;
/// OpenAI's default `max_tokens` of the legacy completions endpoint.
const DEFAULT_COMPLETION_MAX_TOKENS: usize = 16;
/// Repetition window used with `repeat_penalty` (llama.cpp's `repeat_last_n` default).
const REPETITION_WINDOW: usize = 64;

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// Parameters shared by both endpoints.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonParams {
    #[serde(default)]
    pub model: Option<String>,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    pub n: Option<u32>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
    // llama.cpp / vLLM extensions.
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub ignore_eos: Option<bool>,
    /// llama.cpp's `return_tokens`: each choice (and stream chunk) also carries the token ids.
    pub return_tokens: Option<bool>,
    /// civetta's extension: the longest this generation may run, in seconds (it can only
    /// shorten server.http_request_timeout_seconds); past it 504, or an SSE error event.
    pub timeout: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessageIn>,
    pub max_completion_tokens: Option<u32>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    pub tools: Option<Vec<serde_json::Value>>,
    pub response_format: Option<ResponseFormat>,
    #[serde(flatten)]
    pub common: CommonParams,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    pub content: Option<Content>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    /// Legacy: the number of top alternatives per token (0: the sampled token's logprob only).
    pub logprobs: Option<u32>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub best_of: Option<u32>,
    #[serde(flatten)]
    pub common: CommonParams,
}

/// `prompt`: a string, token ids, or a one-element batch of either.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenBatches(Vec<Vec<u32>>),
}

/// What a handler needs besides the engine request.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub stream: bool,
    pub include_usage: bool,
    pub logprobs: bool,
    pub return_tokens: bool,
    /// No explicit max_tokens: generate until the context is full (chat's default).
    pub fill_context: bool,
    /// The request's own time limit (`timeout`).
    pub timeout: Option<std::time::Duration>,
}

/// The model name check: absent or empty means the served model; others are 404.
pub fn check_model(requested: Option<&str>, served: &str) -> Result<(), ApiError> {
    match requested {
        Some(m) if !m.is_empty() && m != served => Err(ApiError::model_not_found(m, served)),
        _ => Ok(()),
    }
}

impl CommonParams {
    fn sampling(&self) -> Result<SamplingParams, ApiError> {
        if let Some(t) = self.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(ApiError::invalid_param("temperature", format!("temperature must be between 0 and 2, got {t}")));
            }
        }
        for (name, v) in [("frequency_penalty", self.frequency_penalty), ("presence_penalty", self.presence_penalty)] {
            if v.is_some_and(|v| v != 0.0) {
                return Err(ApiError::invalid_param(name, format!("{name} is not supported; use repeat_penalty")));
            }
        }
        if self.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
            return Err(ApiError::invalid_param("logit_bias", "logit_bias is not supported"));
        }
        Ok(SamplingParams {
            temperature: self.temperature.unwrap_or(DEFAULT_TEMPERATURE),
            top_k: self.top_k.unwrap_or(0) as usize,
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
            repetition_penalty: self.repeat_penalty.unwrap_or(1.0),
            repetition_window: REPETITION_WINDOW,
            seed: self.seed.unwrap_or_else(rand::random),
        })
    }

    fn stop(&self) -> Vec<String> {
        match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        }
    }

    fn check_n(&self) -> Result<(), ApiError> {
        match self.n {
            None | Some(1) => Ok(()),
            Some(n) => Err(ApiError::invalid_param("n", format!("n must be 1 (one choice per request), got {n}"))),
        }
    }

    fn options(&self, logprobs: bool, fill_context: bool) -> Options {
        let stream = self.stream.unwrap_or(false);
        Options {
            stream,
            include_usage: stream && self.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false),
            logprobs,
            return_tokens: self.return_tokens.unwrap_or(false),
            fill_context,
            timeout: self.timeout.map(std::time::Duration::from_secs_f64),
        }
    }

    fn request(&self, prompt: PromptInput, max_tokens: Option<u32>, default_max: usize) -> Result<GenerationRequest, ApiError> {
        self.check_n()?;
        if self.timeout.is_some_and(|t| !(t.is_finite() && t > 0.0 && t < 1e9)) {
            return Err(ApiError::invalid_param("timeout", "timeout must be a number of seconds > 0"));
        }
        if max_tokens == Some(0) {
            return Err(ApiError::invalid_param("max_tokens", "max_tokens must be at least 1"));
        }
        Ok(GenerationRequest {
            prompt,
            max_tokens: max_tokens.map(|m| m as usize).unwrap_or(default_max),
            sampling: self.sampling()?,
            stop: self.stop(),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            top_logprobs: 0,
        })
    }
}

impl ChatRequest {
    /// The engine request (max_tokens 0 when the context should be filled: the handler
    /// sets it once the prompt is tokenized) and the response options.
    pub fn to_engine(&self) -> Result<(GenerationRequest, Options), ApiError> {
        if self.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            return Err(ApiError::invalid_param("tools", "tool calling is not supported"));
        }
        if let Some(f) = &self.response_format {
            if f.kind != "text" {
                return Err(ApiError::invalid_param(
                    "response_format",
                    format!("response_format {:?} is not supported (only \"text\")", f.kind),
                ));
            }
        }
        let logprobs = self.logprobs.unwrap_or(false);
        let top = top_count("top_logprobs", self.top_logprobs)?;
        if top > 0 && !logprobs {
            return Err(ApiError::invalid_param("top_logprobs", "top_logprobs needs logprobs: true"));
        }
        if self.messages.is_empty() {
            return Err(ApiError::invalid_param("messages", "messages must not be empty"));
        }
        let messages = self.messages.iter().enumerate().map(|(i, m)| chat_message(i, m)).collect::<Result<Vec<_>, _>>()?;
        let max = self.max_completion_tokens.or(self.common.max_tokens);
        let fill_context = max.is_none();
        let mut req = self.common.request(PromptInput::Chat(messages), max, 0)?;
        req.top_logprobs = top;
        Ok((req, self.common.options(logprobs, fill_context)))
    }
}

fn chat_message(i: usize, m: &ChatMessageIn) -> Result<ChatMessage, ApiError> {
    let role = match m.role.as_str() {
        "system" | "user" | "assistant" => m.role.clone(),
        // OpenAI's newer name for system instructions.
        "developer" => "system".to_string(),
        other => {
            return Err(ApiError::invalid_param(
                "messages",
                format!("messages[{i}].role {other:?} is not supported (system, developer, user, assistant)"),
            ))
        }
    };
    let content = match &m.content {
        None => return Err(ApiError::invalid_param("messages", format!("messages[{i}].content is missing"))),
        Some(Content::Text(t)) => t.clone(),
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::invalid_param(
                            "messages",
                            format!("messages[{i}].content[{j}] of type {kind:?} is not supported (text parts only)"),
                        ))
                    }
                }
            }
            text
        }
    };
    Ok(ChatMessage { role, content })
}

impl CompletionRequest {
    pub fn to_engine(&self, add_bos: bool) -> Result<(GenerationRequest, Options), ApiError> {
        if self.echo == Some(true) {
            return Err(ApiError::invalid_param("echo", "echo is not supported"));
        }
        if self.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid_param("suffix", "suffix is not supported"));
        }
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(ApiError::invalid_param("best_of", "best_of must be 1"));
        }
        let top = top_count("logprobs", self.logprobs)?;
        let one = |n: usize| {
            if n == 1 {
                Ok(())
            } else {
                Err(ApiError::invalid_param("prompt", format!("one prompt per request, got a batch of {n}")))
            }
        };
        let prompt = match &self.prompt {
            Prompt::Text(t) => PromptInput::Text { text: t.clone(), add_bos },
            Prompt::Tokens(ids) => PromptInput::Tokens(ids.clone()),
            Prompt::Texts(v) => {
                one(v.len())?;
                PromptInput::Text { text: v[0].clone(), add_bos }
            }
            Prompt::TokenBatches(v) => {
                one(v.len())?;
                PromptInput::Tokens(v[0].clone())
            }
        };
        if matches!(&prompt, PromptInput::Text { text, .. } if text.is_empty()) || matches!(&prompt, PromptInput::Tokens(t) if t.is_empty())
        {
            return Err(ApiError::invalid_param("prompt", "prompt is empty"));
        }
        let mut req = self.common.request(prompt, self.common.max_tokens, DEFAULT_COMPLETION_MAX_TOKENS)?;
        req.top_logprobs = top;
        Ok((req, self.common.options(self.logprobs.is_some(), false)))
    }
}

/// OpenAI's `finish_reason`: EOS and stop sequences are "stop", limits are "length".
pub fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop | FinishReason::Eos => "stop",
        FinishReason::Length | FinishReason::Context => "length",
        // Never reaches a client (nobody is reading a cancelled stream).
        FinishReason::Cancelled => "cancelled",
    }
}

// ---- responses ---------------------------------------------------------------------

#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// OpenAI's `usage.prompt_tokens_details`: prompt tokens served from the prefix cache.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl Usage {
    pub fn of(s: &engine::GenerationSummary) -> Usage {
        Usage {
            prompt_tokens: s.prompt_tokens,
            completion_tokens: s.completion_tokens,
            total_tokens: s.prompt_tokens + s.completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: s.cached_prompt_tokens },
        }
    }
}

/// The number of alternatives asked for (`top_logprobs`, or the legacy completions
/// `logprobs`): 0 to [`engine::MAX_TOP_LOGPROBS`].
fn top_count(param: &'static str, n: Option<u32>) -> Result<usize, ApiError> {
    let n = n.unwrap_or(0) as usize;
    if n > engine::MAX_TOP_LOGPROBS {
        return Err(ApiError::invalid_param(param, format!("{param} must be between 0 and {}, got {n}", engine::MAX_TOP_LOGPROBS)));
    }
    Ok(n)
}

/// One entry of chat `logprobs.content`, and of its `top_logprobs` (with an empty
/// `top_logprobs` of its own, skipped).
#[derive(Debug, Clone, Serialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<Vec<TokenLogprob>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<TokenLogprob>,
}

/// Legacy completions `logprobs`.
#[derive(Debug, Clone, Serialize, Default)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    /// Per token: `{token text: logprob}` of its alternatives (null when none were asked for).
    pub top_logprobs: Option<Vec<serde_json::Map<String, serde_json::Value>>>,
    pub text_offset: Vec<usize>,
}

#[derive(Debug, Serialize)]
pub struct ModelObject<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(json: &str) -> Result<(GenerationRequest, Options), ApiError> {
        serde_json::from_str::<ChatRequest>(json).unwrap().to_engine()
    }

    #[test]
    fn chat_request_maps_to_engine_request() {
        let (r, o) = chat(
            r#"{"model":"m","messages":[{"role":"developer","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}],
                "max_completion_tokens":7,"temperature":0,"seed":3,"stop":"x","stream":true,"stream_options":{"include_usage":true},
                "top_k":5,"min_p":0.1,"repeat_penalty":1.1,"user":"ignored","logprobs":true,"top_logprobs":0}"#,
        )
        .unwrap();
        let PromptInput::Chat(m) = &r.prompt else { panic!("{:?}", r.prompt) };
        assert_eq!((m[0].role.as_str(), m[1].content.as_str()), ("system", "hi there"));
        assert_eq!((r.max_tokens, r.stop.clone()), (7, vec!["x".to_string()]));
        assert_eq!((r.sampling.temperature, r.sampling.seed, r.sampling.top_k, r.sampling.min_p), (0.0, 3, 5, 0.1));
        assert_eq!(r.sampling.repetition_penalty, 1.1);
        assert_eq!(
            o,
            Options { stream: true, include_usage: true, logprobs: true, return_tokens: false, fill_context: false, timeout: None }
        );
        let (r, o) = chat(r#"{"messages":[{"role":"user","content":"hi"}],"stop":null,"stream":null,"n":1}"#).unwrap();
        assert!(o.fill_context && !o.stream);
        assert_eq!(r.sampling.temperature, DEFAULT_TEMPERATURE);
    }

    #[test]
    fn unsupported_chat_features_are_refused_by_name() {
        for (json, param) in [
            (r#"{"messages":[{"role":"user","content":"hi"}],"n":2}"#, "n"),
            (r#"{"messages":[]}"#, "messages"),
            (r#"{"messages":[{"role":"tool","content":"x"}]}"#, "messages"),
            (r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#, "messages"),
            (r#"{"messages":[{"role":"user","content":"hi"}],"top_logprobs":3}"#, "top_logprobs"),
            (r#"{"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":21}"#, "top_logprobs"),
            (r#"{"messages":[{"role":"user","content":"hi"}],"temperature":3}"#, "temperature"),
            (r#"{"messages":[{"role":"user","content":"hi"}],"frequency_penalty":0.5}"#, "frequency_penalty"),
            (r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":0}"#, "max_tokens"),
            (r#"{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}]}"#, "tools"),
            (r#"{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"}}"#, "response_format"),
        ] {
            let e = chat(json).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param), (400, Some(param)), "{json}: {e:?}");
        }
    }

    #[test]
    fn completion_prompts() {
        let parse = |json: &str| serde_json::from_str::<CompletionRequest>(json).unwrap().to_engine(true);
        let (r, o) = parse(r#"{"prompt":"hello"}"#).unwrap();
        assert_eq!(r.prompt, PromptInput::Text { text: "hello".into(), add_bos: true });
        assert_eq!(r.max_tokens, DEFAULT_COMPLETION_MAX_TOKENS);
        assert!(!o.logprobs && !o.fill_context);
        assert_eq!(parse(r#"{"prompt":[1,2,3],"max_tokens":4}"#).unwrap().0.prompt, PromptInput::Tokens(vec![1, 2, 3]));
        assert_eq!(parse(r#"{"prompt":[[5,6]]}"#).unwrap().0.prompt, PromptInput::Tokens(vec![5, 6]));
        assert_eq!(parse(r#"{"prompt":["a"]}"#).unwrap().0.prompt, PromptInput::Text { text: "a".into(), add_bos: true });
        assert!(parse(r#"{"prompt":"a","logprobs":0}"#).unwrap().1.logprobs);
        assert_eq!(parse(r#"{"prompt":"a","logprobs":5}"#).unwrap().0.top_logprobs, 5);
        let (r, o) = chat(r#"{"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":20}"#).unwrap();
        assert!(o.logprobs && r.top_logprobs == 20);
        for (json, param) in [
            (r#"{"prompt":["a","b"]}"#, "prompt"),
            (r#"{"prompt":""}"#, "prompt"),
            (r#"{"prompt":"a","echo":true}"#, "echo"),
            (r#"{"prompt":"a","logprobs":21}"#, "logprobs"),
            (r#"{"prompt":"a","best_of":3}"#, "best_of"),
        ] {
            assert_eq!(parse(json).unwrap_err().param, Some(param), "{json}");
        }
    }

    #[test]
    fn model_names() {
        assert!(check_model(None, "m").is_ok() && check_model(Some(""), "m").is_ok() && check_model(Some("m"), "m").is_ok());
        assert_eq!(check_model(Some("gpt-4o"), "m").unwrap_err().status.as_u16(), 404);
    }

    #[test]
    fn finish_reasons() {
        assert_eq!(finish_reason(FinishReason::Eos), "stop");
        assert_eq!(finish_reason(FinishReason::Stop), "stop");
        assert_eq!(finish_reason(FinishReason::Context), "length");
    }
}
