//! Tokenizing a prompt against the context: a prompt that cannot fit is refused after
//! about as much work as a prompt that just fits, however long its text (a 4 MB prompt
//! used to be tokenized whole before the length check refused it).

use super::types::SubmitError;
use crate::tokenizer::Tokenizer;

/// The prompt's tokens, or `Invalid` as soon as they are known not to leave room for one
/// generated token in a context of `ctx` tokens.
pub fn encode_within_context(tk: &Tokenizer, text: &str, add_bos: bool, ctx: usize) -> Result<Vec<u32>, SubmitError> {
    tk.encode_limited(text, add_bos, true, ctx.saturating_sub(1))
        .map_err(|_| SubmitError::Invalid(super::InvalidRequest::PromptFillsContext { context: ctx }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{TokenizerKind, TokenizerParts};

    #[test]
    fn long_prompts_are_refused_and_short_ones_tokenized_as_before() {
        let (tokens, merges) = crate::tokenizer::train::train_byte_level_bpe(crate::tokenizer::train::CORPUS, 400);
        let tk = Tokenizer::from_parts(TokenizerParts {
            kind: Some(TokenizerKind::Bpe),
            tokens,
            merges,
            pre: "gpt-2".into(),
            ..Default::default()
        })
        .unwrap();
        let text = "the quick brown fox jumps over the lazy dog";
        let all = tk.encode(text, false, true);
        assert_eq!(encode_within_context(&tk, text, false, all.len() + 1), Ok(all.clone()));
        let err = encode_within_context(&tk, text, false, all.len()).unwrap_err();
        assert!(matches!(&err, SubmitError::Invalid(m) if m.to_string().contains("context holds")), "{err:?}");
        // A text far past any context is refused without tokenizing it (this would take
        // seconds if it were tokenized).
        let huge = "word ".repeat(2_000_000);
        let t = std::time::Instant::now();
        assert!(encode_within_context(&tk, &huge, false, 2048).is_err());
        assert!(t.elapsed() < std::time::Duration::from_millis(500), "{:?}", t.elapsed());
    }
}
