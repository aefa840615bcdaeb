//! `civetta model synth`: deterministic synthetic GGUF models for tests and benchmarks.
//!
//! The files look like what llama.cpp's `convert_hf_to_gguf.py` writes for Llama 3, Qwen2
//! and Qwen3 (metadata keys, tensor names and shapes, a real byte-level BPE tokenizer trained
//! on the built-in corpus, the family's special tokens and chat template), with seeded
//! random weights (ChaCha8; every tensor seeded from the model seed and its name):
//!
//! - token embeddings ~ N(0, 1); projections ~ N(0, gain^2 / fan_in), so activations stay
//!   well conditioned through the layers; norm weights ~ 1 + N(0, 0.1^2);
//! - the untied output matrix is random plus a "successor" term: row v also points along
//!   the embedding of token perm(v) for a seeded permutation, so the logits usually have one
//!   clear winner (the successor of the current token) and greedy decoding is robust to the
//!   ~1e-2 relative logit noise that activation quantisation (Q8_0/Q8_K) can cause; the rest
//!   of the network decides the winner whenever its contribution outweighs that term
//!   (docs/REFERENCE.md has the measured margins).
//!
//! The writer holds all tensor data in memory until `write_file`, so a model needs about its
//! file size in RAM (an 8B Q8_0 model about 8.5 GB).

use crate::gguf::{GgmlType, GgufWriter, MetadataValue as V};
use crate::tokenizer::{token_type, train};
use anyhow::{bail, ensure, Context};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use std::path::{Path, PathBuf};

pub const ARCHES: [&str; 4] = ["llama", "qwen2", "qwen3", "gemma3"];
/// Mixture-of-experts architectures: the attention of their dense family (qwen2, qwen3) with
/// routed experts (and qwen2moe's shared expert) in place of the dense FFN.
pub const MOE_ARCHES: [&str; 3] = ["qwen2moe", "qwen3moe", "gpt-oss"];
/// `mxfp4` is for gpt-oss only: its experts in MXFP4, the other matrices Q8_0 (as the real files).
pub const QUANTS: [&str; 12] = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "mxfp4"];
pub const SIZES: [&str; 4] = ["tiny", "small", "1b", "8b"];

#[derive(clap::Args, Debug, Clone)]
pub struct SynthArgs {
    /// Architecture: llama, qwen2, qwen3, gemma3, qwen2moe, qwen3moe, gpt-oss.
    #[arg(long, default_value = "llama")]
    pub arch: String,
    /// Type of the 2-D weight matrices (token_embd included; norms and biases stay f32):
    /// f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k; mxfp4 (gpt-oss: MXFP4
    /// experts, Q8_0 elsewhere).
    #[arg(long, default_value = "q8_0")]
    pub quant: String,
    /// Size preset: tiny (tests), small, 1b, 8b (realistic shapes for benchmarks).
    #[arg(long, default_value = "tiny")]
    pub size: String,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Override the preset's layer count.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Override the preset's embedding width.
    #[arg(long)]
    pub dim: Option<usize>,
    /// Override the preset's feed-forward width.
    #[arg(long)]
    pub ffn: Option<usize>,
    /// Override the preset's query head count.
    #[arg(long)]
    pub heads: Option<usize>,
    /// Override the preset's key/value head count (GQA).
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// Override the head size (qwen3 only; llama and qwen2 use dim / heads).
    #[arg(long)]
    pub head_dim: Option<usize>,
    /// Vocabulary size: BPE tokens trained on the corpus, unused padding tokens, specials.
    #[arg(long)]
    pub vocab: Option<usize>,
    /// Override the MoE preset's expert count (qwen2moe, qwen3moe, gpt-oss).
    #[arg(long)]
    pub experts: Option<usize>,
    /// Override the MoE preset's experts used per token (top-k).
    #[arg(long)]
    pub experts_used: Option<usize>,
    /// Override the MoE preset's feed-forward width of one expert.
    #[arg(long)]
    pub expert_ffn: Option<usize>,
    #[arg(long, default_value_t = 2048)]
    pub context: usize,
    /// gpt-oss only: YaRN RoPE scaling factor written to the file (default 32, as the real
    /// files; the original context is context / factor, 4096 for the real 131072); 0 writes no
    /// scaling keys.
    #[arg(long)]
    pub yarn_factor: Option<u32>,
    /// Tie the output projection to the token embedding (no output.weight tensor).
    #[arg(long)]
    pub tied: bool,
    #[arg(short = 'o', long)]
    pub output: PathBuf,
}

/// Everything that determines a synthetic model file.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthSpec {
    pub arch: String,
    pub quant: GgmlType,
    pub seed: u64,
    pub layers: usize,
    pub dim: usize,
    pub ffn: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub context: usize,
    pub tied: bool,
    /// Experts of the MoE architectures (None for dense ones).
    pub moe: Option<SynthMoe>,
    /// YaRN RoPE scaling factor (gpt-oss), with `rope.scaling.original_context_length` =
    /// context / factor; None: no scaling keys.
    pub yarn_factor: Option<u32>,
}

/// Expert shapes of a synthetic MoE model.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthMoe {
    pub experts: usize,
    pub experts_used: usize,
    pub expert_ffn: usize,
    /// Shared expert width (qwen2moe), 0 for none.
    pub shared_ffn: usize,
}

impl SynthSpec {
    /// A size preset. All dims are multiples of 256, so every weight type (K-quants need
    /// rows of 256) works; the vocabulary is a multiple of 64.
    pub fn preset(arch: &str, quant: GgmlType, size: &str) -> anyhow::Result<SynthSpec> {
        if !ARCHES.contains(&arch) && !MOE_ARCHES.contains(&arch) {
            bail!("unknown architecture \"{arch}\" (expected one of {}, {})", ARCHES.join(", "), MOE_ARCHES.join(", "));
        }
        // (layers, dim, ffn, heads, kv_heads, qwen3 head_dim, vocab)
        let (layers, dim, ffn, heads, kv_heads, qwen3_head_dim, vocab) = match size {
            "tiny" => (4, 256, 512, 8, 2, 64, 640),
            "small" => (8, 512, 1536, 8, 4, 128, 1024),
            "1b" => (16, 2048, 5632, 16, 8, 128, 32000),
            "8b" => (32, 4096, 14336, 32, 8, 128, 32000),
            other => bail!("unknown size preset \"{other}\" (expected one of {})", SIZES.join(", ")),
        };
        // Qwen3 decouples the head size from dim / heads; the tiny preset uses a larger head
        // than dim / heads so that the reference tests exercise that.
        let head_dim = if decoupled_head_dim(arch) { qwen3_head_dim } else { dim / heads };
        // Qwen3-30B-A3B routes to 8 of 128 experts of width 768 (dim 2048); the small presets
        // keep 8 experts, top-2, and experts as wide as a K-quant block row allows.
        let moe = MOE_ARCHES.contains(&arch).then(|| {
            let (experts, experts_used, expert_ffn) = match size {
                "tiny" => (8, 2, 256),
                "small" => (8, 2, 512),
                _ => (128, 8, 768),
            };
            SynthMoe { experts, experts_used, expert_ffn, shared_ffn: if arch == "qwen2moe" { 2 * expert_ffn } else { 0 } }
        });
        Ok(SynthSpec {
            arch: arch.to_string(),
            quant,
            seed: 1,
            layers,
            dim,
            ffn,
            heads,
            kv_heads,
            head_dim,
            vocab,
            context: 2048,
            tied: false,
            moe,
            yarn_factor: (arch == "gpt-oss").then_some(GPT_OSS_YARN_FACTOR),
        })
    }

    pub fn from_args(a: &SynthArgs) -> anyhow::Result<SynthSpec> {
        let quant = parse_quant(&a.quant)?;
        let mut s = SynthSpec::preset(&a.arch, quant, &a.size)?;
        s.seed = a.seed;
        s.layers = a.layers.unwrap_or(s.layers);
        s.ffn = a.ffn.unwrap_or(s.ffn);
        s.kv_heads = a.kv_heads.unwrap_or(s.kv_heads);
        s.vocab = a.vocab.unwrap_or(s.vocab);
        s.context = a.context;
        s.tied = a.tied;
        match a.yarn_factor {
            Some(_) if !s.is_gpt_oss() => bail!("--yarn-factor is for gpt-oss only"),
            Some(0) => s.yarn_factor = None,
            Some(f) => s.yarn_factor = Some(f),
            None => {}
        }
        if let Some(m) = &mut s.moe {
            m.experts = a.experts.unwrap_or(m.experts);
            m.experts_used = a.experts_used.unwrap_or(m.experts_used);
            m.expert_ffn = a.expert_ffn.unwrap_or(m.expert_ffn);
        } else if a.experts.is_some() || a.experts_used.is_some() || a.expert_ffn.is_some() {
            bail!("--experts, --experts-used and --expert-ffn are only for {}", MOE_ARCHES.join(", "));
        }
        if a.dim.is_some() || a.heads.is_some() || a.head_dim.is_some() {
            s.dim = a.dim.unwrap_or(s.dim);
            s.heads = a.heads.unwrap_or(s.heads);
            ensure!(s.heads > 0, "heads must be at least 1");
            s.head_dim = match (s.arch.as_str(), a.head_dim) {
                (arch, Some(h)) if decoupled_head_dim(arch) => h,
                (arch, None) if decoupled_head_dim(arch) => s.head_dim,
                (_, None) => s.dim / s.heads,
                (arch, Some(_)) => bail!("--head-dim is only for qwen3 and gemma3 ({arch} uses dim / heads)"),
            };
        }
        s.validate()?;
        Ok(s)
    }

    /// Checks that the shapes make a valid model for the weight type.
    pub fn validate(&self) -> anyhow::Result<()> {
        ensure!(ARCHES.contains(&self.arch.as_str()) || MOE_ARCHES.contains(&self.arch.as_str()), "unknown architecture \"{}\"", self.arch);
        ensure!(
            self.moe.is_some() == MOE_ARCHES.contains(&self.arch.as_str()),
            "{}: expert shapes are for the MoE architectures only",
            self.arch
        );
        if let Some(m) = &self.moe {
            ensure!(
                m.experts > 0 && (1..=m.experts).contains(&m.experts_used),
                "{} experts used of {} is not a valid routing",
                m.experts_used,
                m.experts
            );
            let block = self.quant.block_size();
            for (what, n) in [("expert ffn", m.expert_ffn), ("shared expert ffn", m.shared_ffn)] {
                ensure!(n % block == 0, "{what} = {n} is not a multiple of the {} block size {block}", self.quant);
            }
            ensure!(m.expert_ffn > 0, "expert ffn must be at least 1");
        }
        ensure!(crate::quant::supports(self.quant), "weight type {} is not supported", self.quant);
        ensure!(self.quant != GgmlType::MXFP4 || self.is_gpt_oss(), "mxfp4 is for gpt-oss's experts only");
        for (what, n) in [
            ("layers", self.layers),
            ("dim", self.dim),
            ("ffn", self.ffn),
            ("heads", self.heads),
            ("kv heads", self.kv_heads),
            ("head size", self.head_dim),
            ("context", self.context),
        ] {
            ensure!(n > 0, "{what} must be at least 1");
        }
        ensure!(self.heads.is_multiple_of(self.kv_heads), "heads ({}) must be a multiple of kv heads ({})", self.heads, self.kv_heads);
        ensure!(self.head_dim.is_multiple_of(2), "the head size ({}) must be even for RoPE", self.head_dim);
        if !decoupled_head_dim(&self.arch) {
            ensure!(
                self.heads * self.head_dim == self.dim,
                "{}: heads x head size ({} x {}) must equal dim ({})",
                self.arch,
                self.heads,
                self.head_dim,
                self.dim
            );
        }
        let block = self.dense_quant().block_size();
        for (what, n) in [("dim", self.dim), ("ffn", self.ffn), ("heads x head size", self.heads * self.head_dim)] {
            ensure!(n % block == 0, "{what} = {n} is not a multiple of the {} block size {block}", self.quant);
        }
        if let Some(f) = self.yarn_factor {
            ensure!(f >= 1 && self.context / f as usize >= 1, "yarn factor {f} leaves no original context of {}", self.context);
        }
        let min_vocab = 256 + self.specials().len();
        ensure!(self.vocab >= min_vocab, "vocab must be at least {min_vocab} (256 byte tokens and the special tokens)");
        ensure!(self.vocab <= u32::MAX as usize && self.context <= u32::MAX as usize, "vocab and context must fit in u32");
        Ok(())
    }

    fn is_llama(&self) -> bool {
        self.arch == "llama"
    }

    fn is_gemma3(&self) -> bool {
        self.arch == "gemma3"
    }

    fn is_gpt_oss(&self) -> bool {
        self.arch == "gpt-oss"
    }

    /// The type of the matrices other than the experts (`mxfp4` files keep them in Q8_0).
    fn dense_quant(&self) -> GgmlType {
        if self.quant == GgmlType::MXFP4 {
            GgmlType::Q8_0
        } else {
            self.quant
        }
    }

    /// The family's special tokens, appended after the BPE and padding tokens.
    fn specials(&self) -> &'static [&'static str] {
        if self.is_llama() {
            &["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
        } else {
            &["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        }
    }
}

/// The dense architecture whose attention (and tokenizer family) an architecture uses.
fn family(arch: &str) -> &str {
    match arch {
        "qwen2moe" => "qwen2",
        "qwen3moe" => "qwen3",
        a => a,
    }
}

/// Qwen3 (and qwen3moe) and Gemma 3 state the head size (key_length) instead of deriving it as
/// dim / heads.
fn decoupled_head_dim(arch: &str) -> bool {
    matches!(family(arch), "qwen3" | "gemma3")
}

/// gpt-oss's YaRN factor (config.json rope_scaling: factor 32 over 4096 original positions).
pub const GPT_OSS_YARN_FACTOR: u32 = 32;

/// Gemma 3's local-attention window in synthetic models: short, so that prompts of a few
/// dozen tokens already reach past it on the local layers (the real 270M model has 512).
pub const GEMMA3_SYNTH_WINDOW: usize = 8;

fn parse_quant(s: &str) -> anyhow::Result<GgmlType> {
    match GgmlType::parse(s) {
        Some(t) if QUANTS.contains(&s.to_ascii_lowercase().as_str()) => Ok(t),
        _ => bail!("unknown weight type \"{s}\" (expected one of {})", QUANTS.join(", ")),
    }
}

pub fn run(args: &SynthArgs) -> anyhow::Result<()> {
    let spec = SynthSpec::from_args(args)?;
    if let Some(dir) = args.output.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
    }
    synth_model(&spec, &args.output)?;
    eprintln!(
        "wrote {} ({} {}, {} layers, dim {}, ffn {}, {}/{} heads of {}, vocab {}{})",
        args.output.display(),
        spec.arch,
        spec.quant,
        spec.layers,
        spec.dim,
        spec.ffn,
        spec.heads,
        spec.kv_heads,
        spec.head_dim,
        spec.vocab,
        if spec.tied { ", tied output" } else { "" }
    );
    Ok(())
}

const LLAMA3_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// llama.cpp's `llama_ftype` for a file whose matrices all have type `t`.
fn file_type(t: GgmlType) -> u32 {
    use GgmlType::*;
    match t {
        F32 => 0,
        F16 => 1,
        Q4_0 => 2,
        Q4_1 => 3,
        Q8_0 => 7,
        Q5_0 => 8,
        Q5_1 => 9,
        Q4_K => 14, // Q4_K_S: every matrix Q4_K
        Q5_K => 16, // Q5_K_S
        Q6_K => 18,
        BF16 => 32,
        MXFP4 => 38, // MXFP4_MOE: experts MXFP4, the rest as written
        _ => 0,
    }
}

/// Writes the model described by `spec` to `path`.
pub fn synth_model(spec: &SynthSpec, path: &Path) -> anyhow::Result<()> {
    spec.validate()?;
    let mut w = GgufWriter::new();
    add_hparams(&mut w, spec);
    add_tokenizer(&mut w, spec);
    add_tensors(&mut w, spec)?;
    w.write_file(path).with_context(|| format!("writing {}", path.display()))
}

fn add_hparams(w: &mut GgufWriter, spec: &SynthSpec) {
    let a = spec.arch.as_str();
    let k = |s: &str| format!("{a}.{s}");
    let u = |n: usize| V::U32(n as u32);
    w.add_metadata("general.architecture", V::String(a.into()));
    w.add_metadata("general.name", V::String(format!("civetta-synth-{a}-{}", spec.quant.name().to_ascii_lowercase())));
    w.add_metadata("general.file_type", V::U32(file_type(spec.quant)));
    w.add_metadata("general.quantization_version", V::U32(2));
    w.add_metadata(&k("context_length"), u(spec.context));
    w.add_metadata(&k("embedding_length"), u(spec.dim));
    w.add_metadata(&k("block_count"), u(spec.layers));
    w.add_metadata(&k("feed_forward_length"), u(spec.ffn));
    w.add_metadata(&k("attention.head_count"), u(spec.heads));
    w.add_metadata(&k("attention.head_count_kv"), u(spec.kv_heads));
    w.add_metadata(&k("attention.layer_norm_rms_epsilon"), V::F32(if spec.is_llama() || spec.is_gpt_oss() { 1e-5 } else { 1e-6 }));
    let rope_base = match a {
        "llama" => 10000.0,
        "gpt-oss" => 150000.0,
        _ => 1_000_000.0,
    };
    w.add_metadata(&k("rope.freq_base"), V::F32(rope_base));
    // As convert_hf_to_gguf.py: LlamaModel adds the vocab size and rope dimension count;
    // Qwen3's config has an explicit head_dim, which becomes the key/value lengths.
    if spec.is_llama() {
        w.add_metadata(&k("vocab_size"), u(spec.vocab));
        w.add_metadata(&k("rope.dimension_count"), u(spec.head_dim));
    }
    if decoupled_head_dim(a) {
        w.add_metadata(&k("attention.key_length"), u(spec.head_dim));
        w.add_metadata(&k("attention.value_length"), u(spec.head_dim));
    }
    if let Some(m) = &spec.moe {
        w.add_metadata(&k("expert_count"), u(m.experts));
        w.add_metadata(&k("expert_used_count"), u(m.experts_used));
        w.add_metadata(&k("expert_feed_forward_length"), u(m.expert_ffn));
        if m.shared_ffn > 0 {
            w.add_metadata(&k("expert_shared_feed_forward_length"), u(m.shared_ffn));
        }
    }
    if spec.is_gemma3() {
        // As the real file: sliding window, no pattern key (llama.cpp's default period 6)
        // and no freq_base_swa (default 10000).
        w.add_metadata(&k("attention.sliding_window"), u(GEMMA3_SYNTH_WINDOW));
    }
    if spec.is_gpt_oss() {
        // Windowed even layers (llama.cpp's default pattern 2).
        w.add_metadata(&k("attention.sliding_window"), u(GEMMA3_SYNTH_WINDOW));
    }
    if let Some(f) = spec.yarn_factor {
        // The keys convert_hf_to_gguf.py writes for gpt-oss's rope_scaling (type yarn, factor,
        // original_max_position_embeddings, beta_fast 32, beta_slow 1); the training context
        // is factor x the original one, as in the real files (32 x 4096).
        w.add_metadata(&k("rope.scaling.type"), V::String("yarn".into()));
        w.add_metadata(&k("rope.scaling.factor"), V::F32(f as f32));
        w.add_metadata(&k("rope.scaling.original_context_length"), u(spec.context / f as usize));
        w.add_metadata(&k("rope.scaling.yarn_beta_fast"), V::F32(32.0));
        w.add_metadata(&k("rope.scaling.yarn_beta_slow"), V::F32(1.0));
    }
}

fn add_tokenizer(w: &mut GgufWriter, spec: &SynthSpec) {
    let specials = spec.specials();
    // The corpus supports about 640 tokens; larger vocabularies are padded with unused tokens.
    let (mut tokens, merges) = train::train_byte_level_bpe(train::CORPUS, spec.vocab - specials.len());
    let mut types = vec![token_type::NORMAL; tokens.len()];
    while tokens.len() + specials.len() < spec.vocab {
        tokens.push(format!("<|reserved_{}|>", tokens.len()));
        types.push(token_type::UNUSED);
    }
    let first_special = tokens.len() as u32;
    tokens.extend(specials.iter().map(|s| s.to_string()));
    types.extend(specials.iter().map(|_| token_type::CONTROL));
    // Llama 3 instruct: bos <|begin_of_text|>, eos <|eot_id|>. Qwen2.5/3 instruct: bos and
    // padding <|endoftext|>, eos <|im_end|>.
    let (bos, eos, pad) = if spec.is_llama() {
        (first_special, first_special + 4, first_special + 1)
    } else {
        (first_special, first_special + 2, first_special)
    };
    w.add_metadata("tokenizer.ggml.model", V::String("gpt2".into()));
    w.add_metadata("tokenizer.ggml.pre", V::String(if spec.is_llama() { "llama-bpe" } else { "qwen2" }.into()));
    w.add_metadata("tokenizer.ggml.tokens", V::Array(tokens.into_iter().map(V::String).collect()));
    w.add_metadata("tokenizer.ggml.token_type", V::Array(types.into_iter().map(V::I32).collect()));
    w.add_metadata("tokenizer.ggml.merges", V::Array(merges.into_iter().map(V::String).collect()));
    w.add_metadata("tokenizer.ggml.bos_token_id", V::U32(bos));
    w.add_metadata("tokenizer.ggml.eos_token_id", V::U32(eos));
    w.add_metadata("tokenizer.ggml.padding_token_id", V::U32(pad));
    w.add_metadata("tokenizer.ggml.add_bos_token", V::Bool(spec.is_llama()));
    w.add_metadata("tokenizer.chat_template", V::String(if spec.is_llama() { LLAMA3_TEMPLATE } else { CHATML_TEMPLATE }.into()));
}

/// Standard deviation of the router logits of synthetic MoE models.
const ROUTER_GAIN: f32 = 2.0;

/// Gain of the random part of the output matrix: logits have a standard deviation of about
/// this many units.
const OUTPUT_GAIN: f32 = 4.0;
/// Norm of the successor term of each output row (see the module docs). With the tiny
/// preset the successor wins about 90% of greedy steps; at 1.0 it is about 60% and the
/// margins are close to those of a purely random matrix.
const SUCCESSOR_NORM: f32 = 1.5;

fn add_tensors(w: &mut GgufWriter, spec: &SynthSpec) -> anyhow::Result<()> {
    let (d, qd, kvd, ff, nv) = (spec.dim, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim, spec.ffn, spec.vocab);
    let (q, qe) = (spec.dense_quant(), spec.quant);
    let seed = spec.seed;
    let gpt_oss = spec.is_gpt_oss();
    let bias = |w: &mut GgufWriter, name: &str, dims: &[u64]| {
        let n = dims.iter().product::<u64>() as usize;
        let v: Vec<f32> = gaussian(tensor_seed(seed, name), n).into_iter().map(|x| 0.1 * x).collect();
        w.add_tensor(name, dims, GgmlType::F32, f32_bytes(&v))
    };
    let f32_tensor = |w: &mut GgufWriter, name: &str, v: Vec<f32>| w.add_tensor(name, &[v.len() as u64], GgmlType::F32, f32_bytes(&v));
    let norm = |w: &mut GgufWriter, name: &str, n: usize| {
        f32_tensor(w, name, gaussian(tensor_seed(seed, name), n).into_iter().map(|x| 1.0 + 0.1 * x).collect())
    };
    let experts_tensor = |w: &mut GgufWriter, name: &str, cols: usize, rows: usize, experts: usize, gain: f32| {
        let std = gain / (cols as f32).sqrt();
        let data = quantized_rows(qe, cols, rows * experts, |r| random_row(seed, name, r, cols, std))?;
        w.add_tensor(name, &[cols as u64, rows as u64, experts as u64], qe, data)
    };
    // `rows` output features of `cols` inputs each, ggml dims [cols, rows].
    let matrix = |w: &mut GgufWriter, name: &str, cols: usize, rows: usize, gain: f32| {
        let std = gain / (cols as f32).sqrt();
        let data = quantized_rows(q, cols, rows, |r| random_row(seed, name, r, cols, std))?;
        w.add_tensor(name, &[cols as u64, rows as u64], q, data)
    };

    matrix(w, "token_embd.weight", d, nv, (d as f32).sqrt())?;
    for i in 0..spec.layers {
        let p = |s: &str| format!("blk.{i}.{s}");
        norm(w, &p("attn_norm.weight"), d)?;
        matrix(w, &p("attn_q.weight"), d, qd, 1.0)?;
        matrix(w, &p("attn_k.weight"), d, kvd, 1.0)?;
        matrix(w, &p("attn_v.weight"), d, kvd, 1.0)?;
        if family(&spec.arch) == "qwen2" || gpt_oss {
            for (name, n) in [(p("attn_q.bias"), qd), (p("attn_k.bias"), kvd), (p("attn_v.bias"), kvd)] {
                f32_tensor(w, &name, gaussian(tensor_seed(seed, &name), n).into_iter().map(|x| 0.1 * x).collect())?;
            }
        }
        if decoupled_head_dim(&spec.arch) {
            norm(w, &p("attn_q_norm.weight"), spec.head_dim)?;
            norm(w, &p("attn_k_norm.weight"), spec.head_dim)?;
        }
        // The residual branches are scaled down so the stream stays dominated by no one layer.
        matrix(w, &p("attn_output.weight"), qd, d, 0.5)?;
        if gpt_oss {
            bias(w, &p("attn_output.bias"), &[d as u64])?;
            // Per-head sink logits around 0: comparable to the attention scores.
            let name = p("attn_sinks.weight");
            f32_tensor(w, &name, gaussian(tensor_seed(seed, &name), spec.heads))?;
        }
        if spec.is_gemma3() {
            norm(w, &p("post_attention_norm.weight"), d)?;
        }
        // gpt-oss calls its pre-FFN norm post_attention_norm.
        norm(w, &p(if gpt_oss { "post_attention_norm.weight" } else { "ffn_norm.weight" }), d)?;
        match &spec.moe {
            None => {
                matrix(w, &p("ffn_gate.weight"), d, ff, 1.0)?;
                matrix(w, &p("ffn_up.weight"), d, ff, 1.0)?;
                matrix(w, &p("ffn_down.weight"), ff, d, 0.5)?;
            }
            Some(m) => {
                // The router stays F32 as llama.cpp's quantiser leaves it; its logits have
                // a standard deviation of about ROUTER_GAIN, so most tokens have clear
                // favourites (routing near-ties would make the comparison with llama.cpp
                // depend on rounding).
                let name = p("ffn_gate_inp.weight");
                let std = ROUTER_GAIN / (d as f32).sqrt();
                let data: Vec<f32> = (0..m.experts).flat_map(|r| random_row(seed, &name, r, d, std)).collect();
                w.add_tensor(&name, &[d as u64, m.experts as u64], GgmlType::F32, f32_bytes(&data))?;
                // Expert-major 3-D tensors [cols, rows, experts]: expert e's matrix is rows
                // e*rows.. of the flattened tensor.
                let (e, eff) = (m.experts, m.expert_ffn);
                experts_tensor(w, &p("ffn_gate_exps.weight"), d, eff, e, 1.0)?;
                experts_tensor(w, &p("ffn_up_exps.weight"), d, eff, e, 1.0)?;
                experts_tensor(w, &p("ffn_down_exps.weight"), eff, d, e, 0.5)?;
                if gpt_oss {
                    bias(w, &p("ffn_gate_inp.bias"), &[e as u64])?;
                    bias(w, &p("ffn_gate_exps.bias"), &[eff as u64, e as u64])?;
                    bias(w, &p("ffn_up_exps.bias"), &[eff as u64, e as u64])?;
                    bias(w, &p("ffn_down_exps.bias"), &[d as u64, e as u64])?;
                }
                if m.shared_ffn > 0 {
                    let name = p("ffn_gate_inp_shexp.weight");
                    f32_tensor(w, &name, random_row(seed, &name, 0, d, 1.0 / (d as f32).sqrt()))?;
                    matrix(w, &p("ffn_gate_shexp.weight"), d, m.shared_ffn, 1.0)?;
                    matrix(w, &p("ffn_up_shexp.weight"), d, m.shared_ffn, 1.0)?;
                    matrix(w, &p("ffn_down_shexp.weight"), m.shared_ffn, d, 0.5)?;
                }
            }
        }
        if spec.is_gemma3() {
            norm(w, &p("post_ffw_norm.weight"), d)?;
        }
    }
    norm(w, "output_norm.weight", d)?;
    if !spec.tied {
        let successor = successor_permutation(seed, nv);
        let std = OUTPUT_GAIN / (d as f32).sqrt();
        let data = quantized_rows(q, d, nv, |v| {
            let mut row = random_row(seed, "output.weight", v, d, std);
            let e = random_row(seed, "token_embd.weight", successor[v], d, 1.0);
            let scale = SUCCESSOR_NORM / e.iter().map(|x| x * x).sum::<f32>().sqrt().max(f32::MIN_POSITIVE);
            row.iter_mut().zip(&e).for_each(|(r, e)| *r += scale * e);
            row
        })?;
        w.add_tensor("output.weight", &[d as u64, nv as u64], q, data)?;
    }
    Ok(())
}

/// Rows generated (in parallel) and quantised one by one into `t`'s block layout.
fn quantized_rows(t: GgmlType, cols: usize, rows: usize, row: impl Fn(usize) -> Vec<f32> + Sync) -> anyhow::Result<Vec<u8>> {
    let row_bytes = t.row_bytes(cols).with_context(|| format!("{t} rows of {cols} elements"))?;
    let mut out = vec![0u8; row_bytes * rows];
    out.par_chunks_mut(row_bytes).enumerate().try_for_each(|(r, dst)| crate::quant::quantize_row(t, &row(r), dst))?;
    Ok(out)
}

/// Row `r` of tensor `name`: `cols` samples of N(0, std^2), a pure function of its arguments.
fn random_row(seed: u64, name: &str, r: usize, cols: usize, std: f32) -> Vec<f32> {
    let s = splitmix64(tensor_seed(seed, name) ^ splitmix64(r as u64));
    gaussian(s, cols).into_iter().map(|x| x * std).collect()
}

/// Token v's output row leans toward the embedding of token successor[v].
fn successor_permutation(seed: u64, n: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    p.shuffle(&mut ChaCha8Rng::seed_from_u64(tensor_seed(seed, "successor")));
    p
}

fn tensor_seed(seed: u64, name: &str) -> u64 {
    // FNV-1a of the name, mixed with the model seed.
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    splitmix64(seed ^ splitmix64(h))
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn gaussian(seed: u64, n: usize) -> Vec<f32> {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            // Box-Muller; u1 > 0 keeps the log finite.
            let u1: f32 = r.gen_range(f32::EPSILON..1.0);
            let u2: f32 = r.gen();
            (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
        })
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;

    fn tiny(arch: &str, quant: &str) -> SynthSpec {
        SynthSpec::preset(arch, parse_quant(quant).unwrap(), "tiny").unwrap()
    }

    fn write(spec: &SynthSpec) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf");
        synth_model(spec, &p).unwrap();
        (dir, p)
    }

    #[test]
    fn same_seed_same_bytes_other_seed_other_weights() {
        let mut s = tiny("llama", "q4_k");
        s.layers = 1;
        let (_d1, a) = write(&s);
        let (_d2, b) = write(&s);
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        s.seed = 2;
        let (_d3, c) = write(&s);
        let (fa, fc) = (GgufFile::open(&a).unwrap(), GgufFile::open(&c).unwrap());
        assert_eq!(fa.tensors.len(), fc.tensors.len());
        let q = |f: &GgufFile| f.tensor_data(f.tensor("blk.0.attn_q.weight").unwrap()).to_vec();
        assert_ne!(q(&fa), q(&fc));
    }

    #[test]
    fn each_arch_has_llama_cpp_tensors_and_metadata() {
        for arch in ARCHES {
            let mut s = tiny(arch, "q8_0");
            s.layers = 2;
            let (_d, p) = write(&s);
            let f = GgufFile::open(&p).unwrap();
            let names: Vec<&str> = f.tensors.iter().map(|t| t.name.as_str()).collect();
            let per_layer = match arch {
                "llama" => 9,
                "qwen2" => 12,  // + q/k/v biases
                "gemma3" => 13, // + q/k norms, post-attention and post-FFN norms
                _ => 11,        // + q/k norms
            };
            assert_eq!(names.len(), 3 + 2 * per_layer, "{arch}: {names:?}");
            let dims = |n: &str| f.tensors.iter().find(|t| t.name == n).unwrap_or_else(|| panic!("{arch}: no {n}")).dims.clone();
            let (hd, q) = (s.head_dim as u64, GgmlType::Q8_0);
            assert_eq!(dims("token_embd.weight"), vec![256, 640]);
            assert_eq!(dims("blk.1.attn_q.weight"), vec![256, 8 * hd]);
            assert_eq!(dims("blk.1.attn_k.weight"), vec![256, 2 * hd]);
            assert_eq!(dims("blk.1.attn_output.weight"), vec![8 * hd, 256]);
            assert_eq!(dims("blk.1.ffn_down.weight"), vec![512, 256]);
            assert_eq!(dims("output.weight"), vec![256, 640]);
            let ty = |n: &str| f.tensors.iter().find(|t| t.name == n).unwrap().ggml_type;
            assert_eq!((ty("blk.0.ffn_up.weight"), ty("blk.0.attn_norm.weight"), ty("output.weight")), (q, GgmlType::F32, q));
            match arch {
                "qwen2" => assert_eq!(dims("blk.0.attn_k.bias"), vec![2 * hd]),
                "qwen3" | "gemma3" => assert_eq!((dims("blk.0.attn_q_norm.weight"), hd), (vec![64], 64)),
                _ => {}
            }
            assert_eq!(f.get_str("general.architecture"), Some(arch));
            assert_eq!(f.get_u64(&format!("{arch}.attention.head_count_kv")), Some(2));
            assert_eq!(f.get_u64("general.file_type"), Some(7));
            assert_eq!(f.get_u64(&format!("{arch}.attention.key_length")).is_some(), decoupled_head_dim(arch));
            assert_eq!(f.get_u64(&format!("{arch}.attention.sliding_window")).is_some(), arch == "gemma3");

            let tk = crate::tokenizer::Tokenizer::from_gguf(&f).unwrap();
            assert_eq!(tk.vocab_size(), 640);
            assert_eq!(tk.add_bos_default(), arch == "llama");
            let eos = if arch == "llama" { "<|eot_id|>" } else { "<|im_end|>" };
            assert_eq!(tk.eos_id(), tk.token_id(eos));
            let text = "The river runs past the old mill.";
            assert_eq!(tk.decode(&tk.encode(text, false, false)), text);
            assert!(tk.encode(text, false, false).len() < text.len() / 2, "{arch}: BPE merges should compress the corpus language");
        }
    }

    #[test]
    fn tied_output_has_no_output_tensor() {
        let mut s = tiny("qwen3", "f16");
        s.layers = 1;
        s.tied = true;
        let (_d, p) = write(&s);
        let f = GgufFile::open(&p).unwrap();
        assert!(f.tensors.iter().all(|t| t.name != "output.weight"));
    }

    #[test]
    fn presets_are_valid_for_every_arch_and_quant() {
        for arch in ARCHES {
            for quant in QUANTS {
                for size in SIZES {
                    let s = SynthSpec::preset(arch, parse_quant(quant).unwrap(), size).unwrap();
                    if quant == "mxfp4" {
                        // MXFP4 is for gpt-oss's experts only.
                        assert!(s.validate().is_err(), "{arch} mxfp4 should be refused");
                        continue;
                    }
                    s.validate().unwrap_or_else(|e| panic!("{arch} {quant} {size}: {e}"));
                }
            }
        }
        let s = SynthSpec::preset("llama", GgmlType::Q8_0, "1b").unwrap();
        assert_eq!((s.dim, s.layers, s.ffn, s.vocab, s.head_dim), (2048, 16, 5632, 32000, 128));
    }

    #[test]
    fn bad_arguments_give_clear_errors() {
        let args = |extra: &[&str]| {
            use clap::Parser;
            #[derive(clap::Parser)]
            struct Cli {
                #[command(flatten)]
                a: SynthArgs,
            }
            let mut v = vec!["synth", "-o", "x.gguf"];
            v.extend_from_slice(extra);
            SynthSpec::from_args(&Cli::try_parse_from(v).unwrap().a).map_err(|e| e.to_string())
        };
        assert!(args(&[]).is_ok());
        assert!(args(&["--arch", "gpt9"]).unwrap_err().contains("unknown architecture"));
        assert!(args(&["--quant", "q3_k"]).unwrap_err().contains("unknown weight type"));
        assert!(args(&["--size", "huge"]).unwrap_err().contains("unknown size preset"));
        assert!(args(&["--heads", "0"]).unwrap_err().contains("heads must be at least 1"));
        assert!(args(&["--kv-heads", "3"]).unwrap_err().contains("multiple of kv heads"));
        assert!(args(&["--quant", "q4_k", "--dim", "384", "--heads", "6"]).unwrap_err().contains("block size 256"));
        assert!(args(&["--vocab", "100"]).unwrap_err().contains("vocab must be at least"));
        assert!(args(&["--head-dim", "48"]).unwrap_err().contains("only for qwen3"));
        let s = args(&["--arch", "qwen3", "--head-dim", "128", "--dim", "512", "--quant", "f16"]).unwrap();
        assert_eq!((s.dim, s.head_dim, s.heads), (512, 128, 8));
    }
}
