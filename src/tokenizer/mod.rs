//! Tokenizers from GGUF metadata: byte-level BPE (`gpt2`: GPT-2, Llama 3, Qwen2, SmolLM
//! pre-tokenizers) and SentencePiece (`llama`), special tokens, chat templates, and a
//! streaming UTF-8 decoder.

mod bpe;
mod chat;
mod pretokenize;
mod spm;
mod stream;
pub mod train;
mod word_cache;

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
    /// SentencePiece scores (ignored for BPE); missing means all zero.
    pub scores: Vec<f32>,
    /// GGUF token types (see [`token_type`]); missing means all normal.
    pub token_types: Vec<i32>,
    /// BPE merges "left right", in rank order.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.pre`; empty means llama.cpp's "default".
    pub pre: String,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub add_bos: Option<bool>,
    /// SentencePiece dummy prefix (`tokenizer.ggml.add_space_prefix`, default true).
    pub add_space_prefix: Option<bool>,
    pub chat_template: Option<String>,
}

pub struct Tokenizer {
    kind: TokenizerKind,
    tokens: Vec<String>,
    token_types: Vec<i32>,
    /// Bytes each token contributes to output text.
    token_bytes: Vec<Vec<u8>>,
    /// Text -> id; for duplicated texts the last id wins, as in llama.cpp.
    ids: HashMap<String, u32>,
    bpe: Option<bpe::Bpe>,
    spm: Option<spm::Spm>,
    pre: String,
    pre_splitter: pretokenize::PreTokenizer,
    /// Tokens matched in raw text before tokenizing (control, user-defined, unknown), longest
    /// first: (text, id, only when parse_special is on).
    specials: Vec<(String, u32, bool)>,
    bos: Option<u32>,
    eos: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    add_space_prefix: bool,
    chat_template: Option<String>,
    /// Input bytes one token can stand for at most, when every byte has a token of its own
    /// (so n bytes give at least n / this many tokens); None when bytes can be dropped.
    max_bytes_per_token: Option<usize>,
}

/// The text tokenizes to more than the caller's limit; tokenizing stopped there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the text has more than {limit} tokens")]
pub struct TooManyTokens {
    pub limit: usize,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("vocab_size", &self.tokens.len())
            .field("pre", &self.pre)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

/// Names that end generation when they are control tokens (as llama.cpp's EOG list).
const EOG_NAMES: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|endoftext|>",
    "<|end|>",
    "</s>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<EOT>",
    // gpt-oss (o200k_harmony): the final answer ends with <|return|>, a tool call with <|call|>.
    "<|return|>",
    "<|call|>",
];

/// A piece of input text: raw text to tokenize, or a special token found in it.
enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

impl Tokenizer {
    pub fn from_gguf(f: &GgufFile) -> anyhow::Result<Tokenizer> {
        let model = f.get_str("tokenizer.ggml.model").context("tokenizer.ggml.model is missing")?;
        let kind = match model {
            "gpt2" => TokenizerKind::Bpe,
            "llama" => TokenizerKind::Spm,
            other => bail!("unsupported tokenizer model {other} (supported: gpt2, llama)"),
        };
        let tokens: Vec<String> = f
            .get_str_array("tokenizer.ggml.tokens")
            .context("tokenizer.ggml.tokens is missing or not an array of strings")?
            .into_iter()
            .map(str::to_string)
            .collect();
        let merges = match (kind, f.get_str_array("tokenizer.ggml.merges")) {
            (_, Some(m)) => m.into_iter().map(str::to_string).collect(),
            (TokenizerKind::Bpe, None) => bail!("tokenizer.ggml.merges is missing or not an array of strings"),
            (TokenizerKind::Spm, None) => Vec::new(),
        };
        let id = |k: &str| f.get_u32(k);
        Tokenizer::from_parts(TokenizerParts {
            kind: Some(kind),
            scores: f.get_f32_array("tokenizer.ggml.scores").unwrap_or_default(),
            token_types: f.get_i32_array("tokenizer.ggml.token_type").unwrap_or_default(),
            merges,
            pre: f.get_str("tokenizer.ggml.pre").unwrap_or("").to_string(),
            bos: id("tokenizer.ggml.bos_token_id"),
            eos: id("tokenizer.ggml.eos_token_id"),
            eot: id("tokenizer.ggml.eot_token_id"),
            eom: id("tokenizer.ggml.eom_token_id"),
            unk: id("tokenizer.ggml.unknown_token_id"),
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
        if n > u32::MAX as usize / 2 {
            bail!("the vocabulary has {n} entries, too many");
        }
        let token_types = match p.token_types.len() {
            0 => vec![token_type::NORMAL; n],
            m if m == n => p.token_types,
            m => bail!("{m} token types for {n} tokens"),
        };
        if !p.scores.is_empty() && p.scores.len() != n {
            bail!("{} token scores for {n} tokens", p.scores.len());
        }
        for (name, v) in [("bos", p.bos), ("eos", p.eos), ("eot", p.eot), ("eom", p.eom), ("unknown", p.unk)] {
            if let Some(v) = v {
                if v as usize >= n {
                    bail!("{name} token id {v} is outside the vocabulary of {n}");
                }
            }
        }
        // llama.cpp renames empty entries so that they cannot match text.
        let tokens: Vec<String> =
            p.tokens.into_iter().enumerate().map(|(i, t)| if t.is_empty() { format!("[EMPTY_{i}]") } else { t }).collect();
        let mut ids = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            ids.insert(t.clone(), i as u32);
        }
        let token_bytes: Vec<Vec<u8>> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| match token_types[i] {
                token_type::CONTROL | token_type::UNUSED | token_type::UNKNOWN => Vec::new(),
                token_type::USER_DEFINED => t.as_bytes().to_vec(),
                _ => match kind {
                    TokenizerKind::Bpe => bpe::token_to_bytes(t),
                    TokenizerKind::Spm => spm::piece_to_bytes(t),
                },
            })
            .collect();
        let pre_spec = pretokenize::spec_for(&p.pre);
        let (bpe, spm) = match kind {
            TokenizerKind::Bpe => (Some(bpe::Bpe::new(n, &p.merges, &ids, pre_spec.ignore_merges)), None),
            TokenizerKind::Spm => {
                let unk = p.unk.or_else(|| token_types.iter().position(|&t| t == token_type::UNKNOWN).map(|i| i as u32));
                (None, Some(spm::Spm::new(&tokens, &p.scores, &ids, unk)))
            }
        };
        let mut specials: Vec<(String, u32, bool)> = tokens
            .iter()
            .enumerate()
            .filter_map(|(i, t)| match token_types[i] {
                token_type::CONTROL | token_type::UNKNOWN => Some((t.clone(), i as u32, true)),
                token_type::USER_DEFINED => Some((t.clone(), i as u32, false)),
                _ => None,
            })
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let mut eog: Vec<u32> = [p.eos, p.eot, p.eom].into_iter().flatten().collect();
        for name in EOG_NAMES {
            if let Some(&i) = ids.get(*name) {
                if token_types[i as usize] == token_type::CONTROL && !eog.contains(&i) {
                    eog.push(i);
                }
            }
        }
        // Harmony (gpt-oss): <|end|> closes every message, the analysis channel's included, so
        // it must not end generation where <|return|> and <|call|> do (llama.cpp's o200k_harmony
        // rule in llama_vocab::load).
        let named = |n: &str| ids.get(n).copied().filter(|i| eog.contains(i));
        if let (Some(_), Some(_), Some(end)) = (named("<|return|>"), named("<|call|>"), named("<|end|>")) {
            eog.retain(|&i| i != end);
        }
        let every_byte_has_a_token = match (&bpe, &spm) {
            (Some(b), _) => b.every_byte_has_a_token(),
            (_, Some(s)) => s.every_byte_has_a_token(),
            _ => false,
        };
        let max_bytes_per_token =
            every_byte_has_a_token.then(|| tokens.iter().zip(&token_bytes).map(|(t, b)| t.len().max(b.len())).max().unwrap_or(1).max(1));
        let pre_splitter = match kind {
            TokenizerKind::Bpe => pretokenize::PreTokenizer::for_name(&p.pre),
            TokenizerKind::Spm => pretokenize::PreTokenizer::for_name("gpt-2"),
        };
        Ok(Tokenizer {
            kind,
            add_bos: p.add_bos.unwrap_or(match kind {
                TokenizerKind::Spm => true,
                TokenizerKind::Bpe => pre_spec.add_bos,
            }),
            add_space_prefix: p.add_space_prefix.unwrap_or(true),
            tokens,
            token_types,
            token_bytes,
            ids,
            bpe,
            spm,
            pre: if p.pre.is_empty() { "default".to_string() } else { p.pre },
            pre_splitter,
            specials,
            bos: p.bos,
            eos: p.eos,
            eog,
            chat_template: p.chat_template,
            max_bytes_per_token,
        })
    }

    /// Encodes text. With `add_bos` the BOS token (when the vocabulary has one) comes first.
    /// User-defined tokens' texts always become their ids (as in llama.cpp and HF); with
    /// `parse_special` control tokens' texts (e.g. "<|im_start|>") do too.
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<u32> {
        self.encode_limited(text, add_bos, parse_special, usize::MAX).unwrap_or_else(|e| unreachable!("{e} without a limit"))
    }

    /// Like [`Tokenizer::encode`], but gives up as soon as the result is known to have more
    /// than `limit` tokens: at once when the text has more bytes than `limit` tokens can
    /// stand for, before a word whose bytes alone need too many tokens, or after the token
    /// past the limit. So a huge text costs about as much as a text of `limit` tokens.
    pub fn encode_limited(&self, text: &str, add_bos: bool, parse_special: bool, limit: usize) -> Result<Vec<u32>, TooManyTokens> {
        let too_many = Err(TooManyTokens { limit });
        // At least ceil(bytes / max_bytes_per_token) tokens.
        let min_tokens = |bytes: usize| self.max_bytes_per_token.map_or(0, |m| bytes.div_ceil(m));
        if min_tokens(text.len()) > limit {
            return too_many;
        }
        let mut out = Vec::with_capacity((text.len() / 3 + 2).min(limit.saturating_add(1)));
        if add_bos {
            if let Some(b) = self.bos {
                out.push(b);
            }
        }
        // SentencePiece adds its dummy prefix to text that starts the input or follows a
        // special token.
        let mut after_special = true;
        for fragment in self.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(seg) => {
                    match (&self.bpe, &self.spm) {
                        (Some(bpe), _) => {
                            for word in self.pre_splitter.split(seg) {
                                if out.len() + min_tokens(word.len()) > limit {
                                    return too_many;
                                }
                                bpe.encode_word(word, &self.ids, &mut out);
                            }
                        }
                        (None, Some(spm)) => spm.encode(seg, self.add_space_prefix && after_special, &self.ids, &mut out),
                        (None, None) => unreachable!("a tokenizer has a BPE or an SPM model"),
                    }
                    after_special = false;
                }
            }
            if out.len() > limit {
                return too_many;
            }
        }
        if out.len() > limit {
            return too_many;
        }
        Ok(out)
    }

    /// Splits text at special tokens like llama.cpp's tokenizer_st_partition: longest token
    /// text first, every occurrence in the remaining raw text.
    fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let mut fragments = Vec::new();
        if text.is_empty() {
            return fragments;
        }
        fragments.push(Fragment::Text(text));
        for (special, id, needs_parse_special) in &self.specials {
            if *needs_parse_special && !parse_special {
                continue;
            }
            if !fragments.iter().any(|f| matches!(f, Fragment::Text(t) if t.contains(special.as_str()))) {
                continue;
            }
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for f in fragments {
                let Fragment::Text(t) = f else {
                    next.push(f);
                    continue;
                };
                let mut rest = t;
                while let Some(pos) = rest.find(special.as_str()) {
                    if pos > 0 {
                        next.push(Fragment::Text(&rest[..pos]));
                    }
                    next.push(Fragment::Token(*id));
                    rest = &rest[pos + special.len()..];
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            fragments = next;
        }
        fragments
    }

    /// Bytes a token contributes to output text (empty for control tokens).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.token_bytes.get(id as usize).map(|v| v.as_slice()).unwrap_or(&[])
    }

    /// Decodes ids to text (invalid UTF-8 becomes U+FFFD). For SentencePiece with the dummy
    /// prefix, the space that the first text token carries is dropped, so that
    /// `decode(encode(s))` gives back `s` (as HF's decoder does).
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        let mut strip_space = self.kind == TokenizerKind::Spm && self.add_space_prefix;
        for &id in ids {
            let mut b = self.token_bytes(id);
            if strip_space && !b.is_empty() {
                b = b.strip_prefix(b" ").unwrap_or(b);
                strip_space = false;
            }
            bytes.extend_from_slice(b);
        }
        String::from_utf8_lossy(&bytes).into_owned()
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
