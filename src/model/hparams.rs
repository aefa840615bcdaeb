//! Hyperparameters read from GGUF metadata, per architecture.

use crate::backend::RopeStyle;
use crate::gguf::GgufFile;
use anyhow::{bail, Context};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
}

impl Arch {
    pub fn parse(name: &str) -> Option<Arch> {
        match name {
            "llama" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }

    /// llama.cpp: LLAMA_ROPE_TYPE_NORM for llama, NEOX for the Qwen family.
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Arch::Llama => RopeStyle::Norm,
            Arch::Qwen2 | Arch::Qwen3 => RopeStyle::Neox,
        }
    }

    /// Per-head RMSNorm of q and k before RoPE (Qwen3).
    pub fn has_qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3)
    }
}

pub const SUPPORTED_ARCHS: &str = "llama, qwen2, qwen3";

#[derive(Debug, Clone)]
pub struct HParams {
    pub arch: Arch,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    pub n_ctx_train: usize,
}

impl HParams {
    pub fn from_gguf(f: &GgufFile) -> anyhow::Result<HParams> {
        let path = f.path.display();
        let arch_name = f.architecture().with_context(|| format!("{path}: general.architecture is missing"))?;
        let Some(arch) = Arch::parse(arch_name) else {
            bail!("{path}: unsupported architecture \"{arch_name}\" (supported: {SUPPORTED_ARCHS})");
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let req_u = |k: &str| -> anyhow::Result<usize> {
            f.get_u64(&key(k)).map(|v| v as usize).with_context(|| format!("{path}: metadata {} is missing", key(k)))
        };
        let n_embd = req_u("embedding_length")?;
        let n_head = req_u("attention.head_count")?;
        let n_head_kv = f.get_u64(&key("attention.head_count_kv")).map(|v| v as usize).unwrap_or(n_head);
        let head_dim = f.get_u64(&key("attention.key_length")).map(|v| v as usize).unwrap_or(n_embd.checked_div(n_head).unwrap_or(0));
        let n_vocab = match f.get_u64(&key("vocab_size")) {
            Some(v) => v as usize,
            None => f
                .tensor("token_embd.weight")
                .and_then(|t| t.dims.get(1).copied())
                .with_context(|| format!("{path}: cannot tell the vocabulary size"))? as usize,
        };
        let hp = HParams {
            arch,
            n_vocab,
            n_embd,
            n_layer: req_u("block_count")?,
            n_ff: req_u("feed_forward_length")?,
            n_head,
            n_head_kv,
            head_dim,
            rms_eps: f.get_f32(&key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
            rope_base: f.get_f32(&key("rope.freq_base")).unwrap_or(10000.0),
            n_ctx_train: req_u("context_length")?,
        };
        if hp.n_head == 0 || hp.n_head_kv == 0 || !hp.n_head.is_multiple_of(hp.n_head_kv) {
            bail!("{path}: head counts {} / {} (kv) are not a valid grouping", hp.n_head, hp.n_head_kv);
        }
        if hp.head_dim == 0 || !hp.head_dim.is_multiple_of(2) {
            bail!("{path}: head dimension {} must be even and non-zero", hp.head_dim);
        }
        if hp.n_layer == 0 || hp.n_embd == 0 || hp.n_ff == 0 || hp.n_vocab == 0 {
            bail!("{path}: zero-sized model dimensions");
        }
        Ok(hp)
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}
