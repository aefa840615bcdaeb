//! Tokenizers from GGUF metadata: byte-level BPE (`gpt2`: GPT-2, Llama 3, Qwen2, SmolLM
//! pre-tokenizers) and SentencePiece (`llama`), special tokens, chat templates, and a
//! streaming UTF-8 decoder.

mod bpe;
mod chat;
mod pretokenize;
mod spm;
mod stream;
pub mod train;

pub use chat::ChatMessage;
pub use stream::StreamDecoder;

use crate::gguf::GgufFile;
use anyhow::{bail, Context};
use std::collections::HashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerKind {
    Bpe,
    Spm,
}

/// GGUF token types (llama.cpp's llama_token_type).
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// Everything a tokenizer is built from (what GGUF metadata holds).
#[derive(Debug, Clone, Default)]
pub struct TokenizerParts {
    pub kind: Option<TokenizerKind>,
    pub tokens: Vec<String>,
    pub scores: Vec<f32>,
    pub token_types: Vec<i32>,
    pub merges: Vec<String>,
    pub pre: String,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    pub chat_template: Option<String>,
}

pub struct Tokenizer {
    kind: TokenizerKind,
    tokens: Vec<String>,
    token_types: Vec<i32>,
    /// Bytes each token contributes to output text.
    token_bytes: Vec<Vec<u8>>,
    ids: HashMap<String, u32>,
    bpe: Option<bpe::Bpe>,
    spm: Option<spm::Spm>,
    pre: String,
    pre_splitter: pretokenize::PreTokenizer,
    /// Special tokens matched in text when parse_special is on, longest first.
    specials: Vec<(String, u32)>,
    bos: Option<u32>,
    eos: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    add_space_prefix: bool,
    chat_template: Option<String>,
}

impl Tokenizer {
    pub fn from_gguf(f: &GgufFile) -> anyhow::Result<Tokenizer> {
        let model = f.get_str("tokenizer.ggml.model").context("tokenizer.ggml.model is missing")?;
        let kind = match model {
            "gpt2" => TokenizerKind::Bpe,
            "llama" => TokenizerKind::Spm,
            other => bail!("unsupported tokenizer model \"{other}\" (supported: gpt2, llama)"),
        };
        let tokens: Vec<String> = f
            .get_str_array("tokenizer.ggml.tokens")
            .context("tokenizer.ggml.tokens is missing or not an array of strings")?
            .into_iter()
            .map(str::to_string)
            .collect();
        let id = |k: &str| f.get_u32(k);
        Tokenizer::from_parts(TokenizerParts {
            kind: Some(kind),
            scores: f.get_f32_array("tokenizer.ggml.scores").unwrap_or_default(),
            token_types: f.get_i32_array("tokenizer.ggml.token_type").unwrap_or_default(),
            merges: f.get_str_array("tokenizer.ggml.merges").unwrap_or_default().into_iter().map(str::to_string).collect(),
            pre: f.get_str("tokenizer.ggml.pre").unwrap_or("default").to_string(),
            bos: id("tokenizer.ggml.bos_token_id"),
            eos: id("tokenizer.ggml.eos_token_id"),
            eot: id("tokenizer.ggml.eot_token_id"),
            add_bos: f.get_bool("tokenizer.ggml.add_bos_token"),
            add_space_prefix: f.get_bool("tokenizer.ggml.add_space_prefix"),
            chat_template: f.get_str("tokenizer.chat_template").map(str::to_string),
            tokens,
        })
    }

    pub fn from_parts(p: TokenizerParts) -> anyhow::Result<Tokenizer> {
        let kind = p.kind.context("tokenizer kind missing")?;
        let n = p.tokens.len();
        if n == 0 {
            bail!("the vocabulary is empty");
        }
        let token_types = if p.token_types.len() == n { p.token_types } else { vec![token_type::NORMAL; n] };
        for (name, v) in [("bos", p.bos), ("eos", p.eos), ("eot", p.eot)] {
            if let Some(v) = v {
                if v as usize >= n {
                    bail!("{name} token id {v} is outside the vocabulary of {n}");
                }
            }
        }
        let mut ids = HashMap::with_capacity(n);
        for (i, t) in p.tokens.iter().enumerate() {
            ids.entry(t.clone()).or_insert(i as u32);
        }
        let token_bytes: Vec<Vec<u8>> = p
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| match token_types[i] {
                token_type::CONTROL | token_type::UNUSED => Vec::new(),
                token_type::USER_DEFINED => t.as_bytes().to_vec(),
                _ => match kind {
                    TokenizerKind::Bpe => bpe::token_to_bytes(t),
                    TokenizerKind::Spm => spm::piece_to_bytes(t),
                },
            })
            .collect();
        let bpe = match kind {
            TokenizerKind::Bpe => Some(bpe::Bpe::new(&p.merges, &ids)?),
            TokenizerKind::Spm => None,
        };
        let spm = match kind {
            TokenizerKind::Spm => Some(spm::Spm::new(&p.tokens, &p.scores, &token_types)),
            TokenizerKind::Bpe => None,
        };
        let mut specials: Vec<(String, u32)> = p
            .tokens
            .iter()
            .enumerate()
            .filter(|(i, t)| matches!(token_types[*i], token_type::CONTROL | token_type::USER_DEFINED) && !t.is_empty())
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let mut eog: Vec<u32> = [p.eos, p.eot].into_iter().flatten().collect();
        for name in ["<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>", "</s>", "<|end_of_text|>", "<end_of_turn>"] {
            if let Some(&i) = ids.get(name) {
                if token_types[i as usize] == token_type::CONTROL && !eog.contains(&i) {
                    eog.push(i);
                }
            }
        }
        let pre_splitter = pretokenize::PreTokenizer::for_name(&p.pre);
        Ok(Tokenizer {
            kind,
            add_bos: p.add_bos.unwrap_or(kind == TokenizerKind::Spm),
            add_space_prefix: p.add_space_prefix.unwrap_or(true),
            tokens: p.tokens,
            token_types,
            token_bytes,
            ids,
            bpe,
            spm,
            pre: p.pre,
            pre_splitter,
            specials,
            bos: p.bos,
            eos: p.eos,
            eog,
            chat_template: p.chat_template,
        })
    }

    /// Encodes text; with `parse_special`, control and user-defined token texts in `text`
    /// become their ids instead of being encoded as text.
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::new();
        if add_bos {
            if let Some(b) = self.bos {
                out.push(b);
            }
        }
        let mut first_text = true;
        for (seg, special) in self.split_specials(text, parse_special) {
            if let Some(id) = special {
                out.push(id);
                continue;
            }
            match self.kind {
                TokenizerKind::Bpe => {
                    let bpe = self.bpe.as_ref().expect("bpe tokenizer");
                    for piece in self.pre_splitter.split(seg) {
                        bpe.encode_word(piece, &self.ids, &mut out);
                    }
                }
                TokenizerKind::Spm => {
                    let spm = self.spm.as_ref().expect("spm tokenizer");
                    // llama.cpp adds the space prefix only to the first text fragment.
                    let prefix = self.add_space_prefix && first_text;
                    spm.encode(seg, prefix, &self.ids, &mut out);
                }
            }
            first_text = false;
        }
        out
    }

    /// Splits text into plain segments and special tokens.
    fn split_specials<'a>(&self, text: &'a str, parse_special: bool) -> Vec<(&'a str, Option<u32>)> {
        if !parse_special || self.specials.is_empty() {
            return vec![(text, None)];
        }
        let mut out = Vec::new();
        let mut start = 0;
        let mut i = 0;
        let bytes = text.as_bytes();
        while i < bytes.len() {
            if text.is_char_boundary(i) {
                if let Some((s, id)) = self.specials.iter().find(|(s, _)| text[i..].starts_with(s.as_str())) {
                    if start < i {
                        out.push((&text[start..i], None));
                    }
                    out.push(("", Some(*id)));
                    i += s.len();
                    start = i;
                    continue;
                }
            }
            i += 1;
        }
        if start < text.len() {
            out.push((&text[start..], None));
        }
        out
    }

    /// Bytes a token contributes to output text (empty for control tokens).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.token_bytes.get(id as usize).map(|v| v.as_slice()).unwrap_or(&[])
    }

    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id));
        }
        let s = String::from_utf8_lossy(&bytes).into_owned();
        if self.kind == TokenizerKind::Spm && self.add_space_prefix {
            if let Some(rest) = s.strip_prefix(' ') {
                return rest.to_string();
            }
        }
        s
    }

    pub fn piece(&self, id: u32) -> &str {
        self.tokens.get(id as usize).map(String::as_str).unwrap_or("")
    }
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        self.ids.get(piece).copied()
    }
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }
    pub fn add_bos_default(&self) -> bool {
        self.add_bos
    }
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }
    pub fn is_control(&self, id: u32) -> bool {
        self.token_types.get(id as usize) == Some(&token_type::CONTROL)
    }
    pub fn kind(&self) -> TokenizerKind {
        self.kind
    }
    pub fn pre_tokenizer(&self) -> &str {
        &self.pre
    }
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Renders the model's chat template (HF conventions) for `messages`.
    pub fn apply_chat_template(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> anyhow::Result<String> {
        let tpl = self.chat_template.as_deref().context("the model has no chat template (tokenizer.chat_template)")?;
        let piece = |id: Option<u32>| id.map(|i| self.piece(i).to_string()).unwrap_or_default();
        chat::render(tpl, messages, add_generation_prompt, &piece(self.bos), &piece(self.eos))
    }
}

#[cfg(test)]
mod tests;
