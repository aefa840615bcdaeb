//! Request validation: what the engine refuses before anything reaches the model (empty or
//! over-long prompts, token ids outside the vocabulary, sampling values out of range, stop
//! sequences). Errors are `SubmitError::Invalid` with a typed [`InvalidRequest`] (gRPC
//! INVALID_ARGUMENT with a BadRequest naming `field()`, HTTP 400 with `param`); success is a
//! [`ValidRequest`], the only kind of request the scheduler takes.

use super::types::*;
use super::Engine;

/// Why a request was refused before reaching the model. The messages are the API's error
/// texts; `field` names the request field at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidRequest {
    #[error("prompt is empty")]
    EmptyPrompt,
    #[error("prompt is empty (no tokens)")]
    NoPromptTokens,
    #[error("messages are empty")]
    EmptyMessages,
    #[error("chat template: {0}")]
    ChatTemplate(String),
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    TokenOutsideVocabulary { id: u32, vocab: usize },
    /// Tokenizing stopped once the prompt could not fit (`prompt_limit`).
    #[error("prompt has at least {context} tokens; the context holds {context}")]
    PromptFillsContext { context: usize },
    #[error("prompt has {tokens} tokens; the context holds {context}")]
    PromptTooLong { tokens: usize, context: usize },
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    #[error("max_tokens {max_tokens} is beyond the context: prompt {prompt} + max_tokens > context {context}")]
    MaxTokensBeyondContext { max_tokens: usize, prompt: usize, context: usize },
    /// The paged KV pool could never hold the prompt (it would wait forever). Generated
    /// tokens need no reservation: blocks are taken as they are needed, other sequences are
    /// preempted for them, and a sequence alone in a full pool finishes as at the context's end.
    #[error("prompt {prompt} tokens need {blocks} KV blocks of {block_tokens}; the KV cache holds {pool_blocks} (engine.kv_cache_bytes)")]
    BeyondKvCache { prompt: usize, blocks: usize, block_tokens: usize, pool_blocks: usize },
    #[error("temperature must be a finite number >= 0, got {0}")]
    Temperature(f32),
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
    #[error("min_p must be in [0, 1), got {0}")]
    MinP(f32),
    #[error("repetition_penalty must be >= 0, got {0}")]
    RepetitionPenalty(f32),
    #[error("at most {max} stop sequences, got {got}")]
    TooManyStops { max: usize, got: usize },
    #[error("stop sequences must not be empty")]
    EmptyStop,
    #[error("stop sequences are limited to {max_bytes} bytes")]
    StopTooLong { max_bytes: usize },
}

impl InvalidRequest {
    /// The request field at fault (gRPC BadRequest field, OpenAI `param`).
    pub fn field(&self) -> &'static str {
        use InvalidRequest::*;
        match self {
            EmptyPrompt
            | NoPromptTokens
            | TokenOutsideVocabulary { .. }
            | PromptFillsContext { .. }
            | PromptTooLong { .. }
            | BeyondKvCache { .. } => "prompt",
            EmptyMessages | ChatTemplate(_) => "messages",
            ZeroMaxTokens | MaxTokensBeyondContext { .. } => "max_tokens",
            Temperature(_) => "sampling.temperature",
            TopP(_) => "sampling.top_p",
            MinP(_) => "sampling.min_p",
            RepetitionPenalty(_) => "sampling.repetition_penalty",
            TooManyStops { .. } | EmptyStop | StopTooLong { .. } => "stop",
        }
    }
}

/// A request that passed [`Engine::validate`]: its prompt's token ids and its parameters.
/// Only validation constructs one (the fields are private to this module), so the scheduler
/// can rely on what was checked: a non-empty prompt of in-vocabulary ids shorter than the
/// context, max_tokens >= 1 fitting the context, sampling values in range, a prompt that fits
/// the KV pool.
#[derive(Debug, Clone)]
pub struct ValidRequest {
    prompt: Vec<u32>,
    params: GenerationRequest,
}

impl ValidRequest {
    /// The prompt's token ids (template, BOS and special tokens applied).
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// The request's parameters (max_tokens, sampling, stop sequences, ...).
    pub fn params(&self) -> &GenerationRequest {
        &self.params
    }
}

/// Limits on stop sequences (bad requests are rejected before reaching the model).
const MAX_STOP_SEQUENCES: usize = 16;
const MAX_STOP_BYTES: usize = 256;

impl Engine {
    /// Tokenizes the prompt as the engine would (template, BOS, special tokens).
    pub fn prompt_tokens(&self, prompt: &PromptInput) -> Result<Vec<u32>, SubmitError> {
        let tk = &self.inner.tokenizer;
        Ok(match prompt {
            PromptInput::Text { text, add_bos } => {
                if text.is_empty() {
                    return Err(InvalidRequest::EmptyPrompt.into());
                }
                super::prompt_limit::encode_within_context(tk, text, *add_bos, self.inner.ctx_len)?
            }
            PromptInput::Tokens(ids) => ids.clone(),
            PromptInput::Chat(messages) => {
                if messages.is_empty() {
                    return Err(InvalidRequest::EmptyMessages.into());
                }
                let text = tk.apply_chat_template(messages, true).map_err(|e| InvalidRequest::ChatTemplate(format!("{e:#}")))?;
                super::prompt_limit::encode_within_context(tk, &text, false, self.inner.ctx_len)?
            }
        })
    }

    /// Checks a request against the model and limits without running anything.
    pub fn validate(&self, req: GenerationRequest) -> Result<ValidRequest, SubmitError> {
        let invalid = |e: InvalidRequest| Err(SubmitError::Invalid(e));
        let prompt = self.prompt_tokens(&req.prompt)?;
        let ctx = self.inner.ctx_len;
        let vocab = self.inner.info.vocab_size;
        if prompt.is_empty() {
            return invalid(InvalidRequest::NoPromptTokens);
        }
        if let Some(bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return invalid(InvalidRequest::TokenOutsideVocabulary { id: *bad, vocab });
        }
        if prompt.len() >= ctx {
            return invalid(InvalidRequest::PromptTooLong { tokens: prompt.len(), context: ctx });
        }
        if req.max_tokens == 0 {
            return invalid(InvalidRequest::ZeroMaxTokens);
        }
        if prompt.len() + req.max_tokens > ctx {
            return invalid(InvalidRequest::MaxTokensBeyondContext { max_tokens: req.max_tokens, prompt: prompt.len(), context: ctx });
        }
        // The paged KV pool must be able to hold the prompt, which is admitted with all its
        // blocks at once, or it would wait forever (a smaller one waits for blocks instead).
        let total_blocks = self.inner.kv_total_blocks;
        let need_blocks = prompt.len().div_ceil(super::kv::KV_BLOCK_TOKENS);
        if total_blocks > 0 && need_blocks > total_blocks {
            return invalid(InvalidRequest::BeyondKvCache {
                prompt: prompt.len(),
                blocks: need_blocks,
                block_tokens: super::kv::KV_BLOCK_TOKENS,
                pool_blocks: total_blocks,
            });
        }
        let s = &req.sampling;
        if !s.temperature.is_finite() || s.temperature < 0.0 {
            return invalid(InvalidRequest::Temperature(s.temperature));
        }
        if !(s.top_p > 0.0 && s.top_p <= 1.0) {
            return invalid(InvalidRequest::TopP(s.top_p));
        }
        if !(s.min_p >= 0.0 && s.min_p < 1.0) {
            return invalid(InvalidRequest::MinP(s.min_p));
        }
        if !s.repetition_penalty.is_finite() || s.repetition_penalty < 0.0 {
            return invalid(InvalidRequest::RepetitionPenalty(s.repetition_penalty));
        }
        if req.stop.len() > MAX_STOP_SEQUENCES {
            return invalid(InvalidRequest::TooManyStops { max: MAX_STOP_SEQUENCES, got: req.stop.len() });
        }
        for st in &req.stop {
            if st.is_empty() {
                return invalid(InvalidRequest::EmptyStop);
            }
            if st.len() > MAX_STOP_BYTES {
                return invalid(InvalidRequest::StopTooLong { max_bytes: MAX_STOP_BYTES });
            }
        }
        Ok(ValidRequest { prompt, params: req })
    }
}
