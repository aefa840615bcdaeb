//! `civetta model synth`: deterministic synthetic GGUF models for tests and benchmarks.
//!
//! Weights are seeded random (ChaCha8), scaled so activations stay well conditioned and the
//! output logits are peaked enough that greedy decoding is robust to ~1e-3 numeric noise.
//! The tokenizer is a real byte-level BPE trained on the built-in corpus, with the special
//! tokens and chat template of the architecture's family.

use crate::gguf::{GgmlType, GgufWriter, MetadataValue as V};
use crate::tokenizer::{token_type, train};
use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug, Clone)]
pub struct SynthArgs {
    /// Architecture: llama, qwen2, qwen3.
    #[arg(long, default_value = "llama")]
    pub arch: String,
    /// Type of the 2-D weight matrices: f32, f16, bf16, q8_0, q4_0, q4_1, q4_k, q5_k, q6_k.
    #[arg(long, default_value = "q8_0")]
    pub quant: String,
    /// Size preset: tiny (tests), small, 1b, 8b (GPU benchmarks).
    #[arg(long, default_value = "tiny")]
    pub size: String,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub layers: Option<usize>,
    #[arg(long)]
    pub dim: Option<usize>,
    #[arg(long)]
    pub ffn: Option<usize>,
    #[arg(long)]
    pub heads: Option<usize>,
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// Vocabulary size (BPE tokens trained on the corpus, then padding tokens).
    #[arg(long)]
    pub vocab: Option<usize>,
    #[arg(long, default_value_t = 2048)]
    pub context: usize,
    /// Tie the output projection to the token embedding.
    #[arg(long)]
    pub tied: bool,
    #[arg(short = 'o', long)]
    pub output: PathBuf,
}

#[derive(Debug, Clone)]
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
}

impl SynthSpec {
    pub fn from_args(a: &SynthArgs) -> anyhow::Result<SynthSpec> {
        let quant = GgmlType::parse(&a.quant).with_context(|| format!("unknown quant type \"{}\"", a.quant))?;
        if !crate::quant::supports(quant) {
            bail!("quant type {quant} is not supported");
        }
        // (layers, dim, ffn, heads, kv_heads, vocab)
        let (layers, dim, ffn, heads, kv, vocab) = match a.size.as_str() {
            "tiny" => (4, 256, 512, 8, 2, 640),
            "small" => (8, 512, 1536, 8, 4, 1024),
            "1b" => (16, 2048, 5632, 16, 8, 32000),
            "8b" => (32, 4096, 14336, 32, 8, 32000),
            other => bail!("unknown size preset \"{other}\" (tiny, small, 1b, 8b)"),
        };
        let arch = a.arch.clone();
        if !["llama", "qwen2", "qwen3"].contains(&arch.as_str()) {
            bail!("unknown architecture \"{arch}\" (llama, qwen2, qwen3)");
        }
        let dim = a.dim.unwrap_or(dim);
        let heads = a.heads.unwrap_or(heads);
        // Qwen3 decouples the head size from dim/heads; use a larger head to exercise that.
        let head_dim = if arch == "qwen3" { 2 * dim / heads } else { dim / heads };
        let spec = SynthSpec {
            arch,
            quant,
            seed: a.seed,
            layers: a.layers.unwrap_or(layers),
            dim,
            ffn: a.ffn.unwrap_or(ffn),
            heads,
            kv_heads: a.kv_heads.unwrap_or(kv),
            head_dim,
            vocab: a.vocab.unwrap_or(vocab),
            context: a.context,
            tied: a.tied,
        };
        let bs = quant.block_size();
        for (what, n) in [("dim", spec.dim), ("ffn", spec.ffn), ("heads*head_dim", spec.heads * spec.head_dim)] {
            if n % bs != 0 {
                bail!("{what} = {n} is not a multiple of the {quant} block size {bs}");
            }
        }
        if spec.heads % spec.kv_heads != 0 || spec.head_dim % 2 != 0 {
            bail!("heads ({}) must be a multiple of kv heads ({}) and the head size even", spec.heads, spec.kv_heads);
        }
        if spec.vocab < 300 {
            bail!("vocab must be at least 300 (256 byte tokens + merges + specials)");
        }
        Ok(spec)
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
        "wrote {} ({} {}, {} layers, dim {}, vocab {})",
        args.output.display(),
        spec.arch,
        spec.quant,
        spec.layers,
        spec.dim,
        spec.vocab
    );
    Ok(())
}

const LLAMA3_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Writes the model described by `spec` to `path`.
pub fn synth_model(spec: &SynthSpec, path: &Path) -> anyhow::Result<()> {
    let llama = spec.arch == "llama";
    let specials: &[&str] = if llama {
        &["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    } else {
        &["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    };
    let bpe_size = (spec.vocab - specials.len()).min(1024);
    let (mut tokens, merges) = train::train_byte_level_bpe(train::CORPUS, bpe_size);
    let mut types = vec![token_type::NORMAL; tokens.len()];
    while tokens.len() + specials.len() < spec.vocab {
        tokens.push(format!("<|unused_{}|>", tokens.len()));
        types.push(token_type::UNUSED);
    }
    let first_special = tokens.len() as u32;
    for s in specials {
        tokens.push(s.to_string());
        types.push(token_type::CONTROL);
    }
    let (bos, eos) = if llama { (first_special, first_special + 4) } else { (first_special, first_special + 2) };

    let mut w = GgufWriter::new();
    let a = spec.arch.as_str();
    let k = |s: &str| format!("{a}.{s}");
    w.add_metadata("general.architecture", V::String(a.into()));
    w.add_metadata("general.name", V::String(format!("civetta-synth-{a}-{}", spec.quant)));
    w.add_metadata(&k("context_length"), V::U32(spec.context as u32));
    w.add_metadata(&k("embedding_length"), V::U32(spec.dim as u32));
    w.add_metadata(&k("block_count"), V::U32(spec.layers as u32));
    w.add_metadata(&k("feed_forward_length"), V::U32(spec.ffn as u32));
    w.add_metadata(&k("attention.head_count"), V::U32(spec.heads as u32));
    w.add_metadata(&k("attention.head_count_kv"), V::U32(spec.kv_heads as u32));
    w.add_metadata(&k("attention.layer_norm_rms_epsilon"), V::F32(if llama { 1e-5 } else { 1e-6 }));
    w.add_metadata(&k("rope.freq_base"), V::F32(if llama { 10000.0 } else { 1_000_000.0 }));
    if a == "qwen3" {
        w.add_metadata(&k("attention.key_length"), V::U32(spec.head_dim as u32));
        w.add_metadata(&k("attention.value_length"), V::U32(spec.head_dim as u32));
    }
    w.add_metadata(&k("vocab_size"), V::U32(spec.vocab as u32));
    w.add_metadata("tokenizer.ggml.model", V::String("gpt2".into()));
    w.add_metadata("tokenizer.ggml.pre", V::String(if llama { "llama-bpe" } else { "qwen2" }.into()));
    w.add_metadata("tokenizer.ggml.tokens", V::Array(tokens.iter().map(|t| V::String(t.clone())).collect()));
    w.add_metadata("tokenizer.ggml.token_type", V::Array(types.iter().map(|&t| V::I32(t)).collect()));
    w.add_metadata("tokenizer.ggml.merges", V::Array(merges.iter().map(|m| V::String(m.clone())).collect()));
    w.add_metadata("tokenizer.ggml.bos_token_id", V::U32(bos));
    w.add_metadata("tokenizer.ggml.eos_token_id", V::U32(eos));
    w.add_metadata("tokenizer.ggml.padding_token_id", V::U32(eos));
    w.add_metadata("tokenizer.ggml.add_bos_token", V::Bool(llama));
    w.add_metadata("tokenizer.chat_template", V::String(if llama { LLAMA3_TEMPLATE } else { CHATML_TEMPLATE }.into()));

    let (d, qd, kvd, ff, nv) = (spec.dim, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim, spec.ffn, spec.vocab);
    let tensor_seed = std::cell::Cell::new(spec.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let next_seed = || {
        tensor_seed.set(tensor_seed.get().wrapping_add(0x2545_F491_4F6C_DD1D));
        tensor_seed.get()
    };
    let q = spec.quant;
    // Embeddings ~ N(0, 1); projections ~ N(0, gain/sqrt(fan_in)); the output projection
    // is scaled up so logits have clear winners.
    let mat = |w: &mut GgufWriter, name: &str, cols: usize, rows: usize, gain: f32| -> anyhow::Result<()> {
        let data = random_matrix(next_seed(), cols, rows, gain / (cols as f32).sqrt(), q)?;
        w.add_tensor(name, &[cols as u64, rows as u64], q, data)
    };
    let emb_gain = (d as f32).sqrt();
    mat(&mut w, "token_embd.weight", d, nv, emb_gain)?;
    for i in 0..spec.layers {
        let p = |s: &str| format!("blk.{i}.{s}");
        let norm = |w: &mut GgufWriter, name: &str, n: usize, seed: u64| -> anyhow::Result<()> {
            w.add_tensor(name, &[n as u64], GgmlType::F32, f32_bytes(&norm_vector(seed, n)))
        };
        norm(&mut w, &p("attn_norm.weight"), d, next_seed())?;
        mat(&mut w, &p("attn_q.weight"), d, qd, 1.0)?;
        mat(&mut w, &p("attn_k.weight"), d, kvd, 1.0)?;
        mat(&mut w, &p("attn_v.weight"), d, kvd, 1.0)?;
        if a == "qwen2" {
            for (name, n) in [("attn_q.bias", qd), ("attn_k.bias", kvd), ("attn_v.bias", kvd)] {
                let b: Vec<f32> = gaussian(next_seed(), n).into_iter().map(|x| 0.1 * x).collect();
                w.add_tensor(&p(name), &[n as u64], GgmlType::F32, f32_bytes(&b))?;
            }
        }
        if a == "qwen3" {
            norm(&mut w, &p("attn_q_norm.weight"), spec.head_dim, next_seed())?;
            norm(&mut w, &p("attn_k_norm.weight"), spec.head_dim, next_seed())?;
        }
        mat(&mut w, &p("attn_output.weight"), qd, d, 0.5)?;
        norm(&mut w, &p("ffn_norm.weight"), d, next_seed())?;
        mat(&mut w, &p("ffn_gate.weight"), d, ff, 1.0)?;
        mat(&mut w, &p("ffn_up.weight"), d, ff, 1.0)?;
        mat(&mut w, &p("ffn_down.weight"), ff, d, 0.5)?;
    }
    let n = norm_vector(next_seed(), d);
    w.add_tensor("output_norm.weight", &[d as u64], GgmlType::F32, f32_bytes(&n))?;
    if !spec.tied {
        mat(&mut w, "output.weight", d, nv, 4.0)?;
    }
    w.write_file(path).with_context(|| format!("writing {}", path.display()))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn gaussian(seed: u64, n: usize) -> Vec<f32> {
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            // Box-Muller.
            let u1: f32 = r.gen_range(f32::EPSILON..1.0);
            let u2: f32 = r.gen();
            (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
        })
        .collect()
}

fn norm_vector(seed: u64, n: usize) -> Vec<f32> {
    gaussian(seed, n).into_iter().map(|x| 1.0 + 0.1 * x).collect()
}

/// rows x cols matrix quantised row by row (rows in parallel, each row its own seed).
fn random_matrix(seed: u64, cols: usize, rows: usize, std: f32, t: GgmlType) -> anyhow::Result<Vec<u8>> {
    let rb = t.row_bytes(cols).context("row size")?;
    let mut out = vec![0u8; rb * rows];
    out.par_chunks_mut(rb).enumerate().try_for_each(|(r, dst)| {
        let row: Vec<f32> = gaussian(seed ^ (r as u64).wrapping_mul(0xD1B5_4A32_D192_ED03), cols).into_iter().map(|x| x * std).collect();
        crate::quant::quantize_row(t, &row, dst)
    })?;
    Ok(out)
}
