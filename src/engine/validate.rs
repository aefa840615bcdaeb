//! Request validation: what the engine refuses before anything reaches the model (empty or
//! over-long prompts, token ids outside the vocabulary, sampling values out of range, stop
//! sequences). Errors are `SubmitError::Invalid` (gRPC INVALID_ARGUMENT).

use super::types::*;
use super::Engine;

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
                    return Err(SubmitError::Invalid("prompt is empty".into()));
                }
                super::prompt_limit::encode_within_context(tk, text, *add_bos, self.inner.ctx_len)?
            }
            PromptInput::Tokens(ids) => ids.clone(),
            PromptInput::Chat(messages) => {
                if messages.is_empty() {
                    return Err(SubmitError::Invalid("messages are empty".into()));
                }
                let text = tk.apply_chat_template(messages, true).map_err(|e| SubmitError::Invalid(format!("chat template: {e:#}")))?;
                super::prompt_limit::encode_within_context(tk, &text, false, self.inner.ctx_len)?
            }
        })
    }

    /// Checks a request against the model and limits without running anything.
    pub fn validate(&self, req: &GenerationRequest) -> Result<Vec<u32>, SubmitError> {
        let invalid = |m: String| Err(SubmitError::Invalid(m));
        let prompt = self.prompt_tokens(&req.prompt)?;
        let ctx = self.inner.ctx_len;
        let vocab = self.inner.info.vocab_size;
        if prompt.is_empty() {
            return invalid("prompt is empty (no tokens)".into());
        }
        if let Some(bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return invalid(format!("token id {bad} is outside the vocabulary of {vocab}"));
        }
        if prompt.len() >= ctx {
            return invalid(format!("prompt has {} tokens; the context holds {ctx}", prompt.len()));
        }
        if req.max_tokens == 0 {
            return invalid("max_tokens must be at least 1".into());
        }
        if prompt.len() + req.max_tokens > ctx {
            return invalid(format!(
                "max_tokens {} is beyond the context: prompt {} + max_tokens > context {ctx}",
                req.max_tokens,
                prompt.len()
            ));
        }
        // The paged KV pool must be able to hold the whole request at once, or it would wait
        // forever (a smaller request waits for blocks instead).
        let total_blocks = self.inner.kv_total_blocks;
        let need_blocks = (prompt.len() + req.max_tokens).div_ceil(super::kv::KV_BLOCK_TOKENS);
        if total_blocks > 0 && need_blocks > total_blocks {
            return invalid(format!(
                "prompt {} + max_tokens {} tokens need {need_blocks} KV blocks of {}; the KV cache holds {total_blocks} (engine.kv_cache_bytes)",
                prompt.len(),
                req.max_tokens,
                super::kv::KV_BLOCK_TOKENS
            ));
        }
        let s = &req.sampling;
        if !s.temperature.is_finite() || s.temperature < 0.0 {
            return invalid(format!("temperature must be a finite number >= 0, got {}", s.temperature));
        }
        if !(s.top_p > 0.0 && s.top_p <= 1.0) {
            return invalid(format!("top_p must be in (0, 1], got {}", s.top_p));
        }
        if !(s.min_p >= 0.0 && s.min_p < 1.0) {
            return invalid(format!("min_p must be in [0, 1), got {}", s.min_p));
        }
        if !s.repetition_penalty.is_finite() || s.repetition_penalty < 0.0 {
            return invalid(format!("repetition_penalty must be >= 0, got {}", s.repetition_penalty));
        }
        if req.stop.len() > MAX_STOP_SEQUENCES {
            return invalid(format!("at most {MAX_STOP_SEQUENCES} stop sequences, got {}", req.stop.len()));
        }
        for st in &req.stop {
            if st.is_empty() {
                return invalid("stop sequences must not be empty".into());
            }
            if st.len() > MAX_STOP_BYTES {
                return invalid(format!("stop sequences are limited to {MAX_STOP_BYTES} bytes"));
            }
        }
        Ok(prompt)
    }
}
