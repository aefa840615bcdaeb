//! Hyperparameters read from GGUF metadata, per architecture.

use crate::backend::{RopeScaling, RopeStyle};
use crate::gguf::GgufFile;
use anyhow::{bail, Context};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    /// Qwen2-MoE: qwen2 attention, routed experts plus a sigmoid-gated shared expert.
    Qwen2Moe,
    /// Qwen3-MoE: qwen3 attention, routed experts with renormalised top-k weights.
    Qwen3Moe,
    /// Gemma 3 (text): the `crate::model` docs list what differs from llama.
    Gemma3,
    /// gpt-oss (llama.cpp's LLM_ARCH_OPENAI_MOE): biased attention with per-head sinks,
    /// sliding-window attention on even layers, MoE with softmax over the selected logits
    /// and swiglu_oai experts.
    GptOss,
}

impl Arch {
    pub fn parse(name: &str) -> Option<Arch> {
        match name {
            "llama" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            "qwen2moe" => Some(Arch::Qwen2Moe),
            "qwen3moe" => Some(Arch::Qwen3Moe),
            "gemma3" => Some(Arch::Gemma3),
            "gpt-oss" => Some(Arch::GptOss),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen2Moe => "qwen2moe",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Gemma3 => "gemma3",
            Arch::GptOss => "gpt-oss",
        }
    }

    /// llama.cpp: LLAMA_ROPE_TYPE_NORM for llama, NEOX for the Qwen and Gemma families
    /// (llama_model_rope_type).
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Arch::Llama => RopeStyle::Norm,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen2Moe | Arch::Qwen3Moe | Arch::Gemma3 | Arch::GptOss => RopeStyle::Neox,
        }
    }

    /// Per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3).
    pub fn has_qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3)
    }

    /// Whether the FFN of every layer is a mixture of experts.
    pub fn is_moe(self) -> bool {
        matches!(self, Arch::Qwen2Moe | Arch::Qwen3Moe | Arch::GptOss)
    }
}

pub const SUPPORTED_ARCHS: &str = "llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma3, gpt-oss";

/// Mixture-of-experts hyperparameters (`{arch}.expert_*` metadata).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeParams {
    pub n_expert: usize,
    /// Experts each token is routed to (top-k).
    pub n_expert_used: usize,
    /// Feed-forward width of one routed expert.
    pub n_ff_exp: usize,
    /// Feed-forward width of the shared expert (qwen2moe), 0 when there is none.
    pub n_ff_shexp: usize,
    /// Renormalise the top-k weights to sum to 1 (llama.cpp: on for qwen3moe, off for qwen2moe).
    pub norm_topk: bool,
    /// Multiplier of the expert weights (`expert_weights_scale`; 0 or 1 mean none).
    pub weights_scale: f32,
    /// How router logits become expert weights.
    pub gating: Gating,
    /// The experts' activation.
    pub act: ExpertAct,
}

/// llama.cpp's expert gating functions that civetta runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts, top-k of the probabilities (qwen2moe, qwen3moe).
    Softmax,
    /// Top-k of the raw logits, then softmax over the k selected (gpt-oss;
    /// LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT).
    SoftmaxWeight,
}

/// The experts' gated activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertAct {
    /// silu(gate) * up.
    SwiGlu,
    /// gpt-oss's clamped SwiGLU (`moe::swiglu_oai`).
    SwiGluOai,
}

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
    /// Present for mixture-of-experts architectures.
    pub moe: Option<MoeParams>,
    /// Interleaved sliding-window (local) attention layers (Gemma 3); None: every layer global.
    pub sliding_window: Option<SlidingWindow>,
    /// RoPE frequency scaling declared by the file (`rope.scaling.*`); None: plain RoPE.
    pub rope_scaling: Option<RopeScalingParams>,
}

/// How the rotary frequencies are scaled for a longer context than the model was trained on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeScalingKind {
    /// Every angle divided by the factor (position interpolation).
    Linear,
    /// YaRN: high-frequency pairs keep their angles, low-frequency ones are interpolated, with
    /// a ramp between and a magnitude correction (gpt-oss: factor 32 over 4096 positions).
    Yarn,
}

/// The file's `{arch}.rope.scaling.*` metadata, read as llama.cpp's loader reads it
/// (llama_model::load_hparams and llama_context's cparams): type (default linear), factor,
/// original_context_length (default the training context), attn_factor (default 1), and
/// YaRN's beta_fast / beta_slow (defaults 32 / 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeScalingParams {
    pub kind: RopeScalingKind,
    pub factor: f32,
    /// Context the rotary frequencies were trained for (YaRN's correction range).
    pub n_ctx_orig: usize,
    /// `rope.scaling.attn_factor`: an extra multiplier of the rotated q and k.
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
}

/// Gemma 3's local layers, as llama.cpp's gemma3 loader reads them: `{arch}.attention.
/// sliding_window` positions, layer i local when i % period < period - 1 (period from
/// `{arch}.attention.sliding_window_pattern`, default 6: five local layers, then one global),
/// local layers rotated with `{arch}.rope.freq_base_swa` (default 10000, llama_hparams'
/// rope_freq_base_train_swa), global ones with `rope.freq_base`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlidingWindow {
    /// A local layer's query at position p attends to positions p - window + 1 ..= p.
    pub window: usize,
    pub period: usize,
    pub rope_base: f32,
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
        let moe = if arch.is_moe() {
            let n_expert = req_u("expert_count")?;
            let n_expert_used = req_u("expert_used_count")?;
            if n_expert == 0 || n_expert_used == 0 || n_expert_used > n_expert {
                bail!("{path}: {n_expert_used} experts used of {n_expert} is not a valid routing");
            }
            let n_ff_exp = req_u("expert_feed_forward_length")?;
            let n_ff_shexp = match arch {
                Arch::Qwen2Moe => req_u("expert_shared_feed_forward_length")?,
                _ => 0,
            };
            // llama.cpp's graphs fix this per architecture (they ignore `expert_weights_norm`).
            let norm_topk = arch == Arch::Qwen3Moe;
            let weights_scale = f.get_f32(&key("expert_weights_scale")).unwrap_or(0.0);
            let (gating, act) = match arch {
                Arch::GptOss => (Gating::SoftmaxWeight, ExpertAct::SwiGluOai),
                _ => (Gating::Softmax, ExpertAct::SwiGlu),
            };
            Some(MoeParams { n_expert, n_expert_used, n_ff_exp, n_ff_shexp, norm_topk, weights_scale, gating, act })
        } else {
            None
        };
        // MoE files may omit the dense feed-forward width; the expert width stands in.
        let n_ff = match (&moe, f.get_u64(&key("feed_forward_length"))) {
            (_, Some(v)) => v as usize,
            (Some(m), None) => m.n_ff_exp,
            (None, None) => req_u("feed_forward_length")?,
        };
        let mut hp = HParams {
            arch,
            n_vocab,
            n_embd,
            n_layer: req_u("block_count")?,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            rms_eps: f.get_f32(&key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
            rope_base: f.get_f32(&key("rope.freq_base")).unwrap_or(10000.0),
            n_ctx_train: req_u("context_length")?,
            moe,
            sliding_window: None,
            rope_scaling: None,
        };
        hp.rope_scaling = rope_scaling_params(f, &key, hp.n_ctx_train)?;
        if arch == Arch::Gemma3 {
            hp.rms_eps = f.get_f32(&key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-6);
            if f.get(&key("attention.sliding_window_pattern")).is_some_and(|v| v.as_u64().is_none()) {
                bail!("{path}: a per-layer array in {} is not supported (only a period)", key("attention.sliding_window_pattern"));
            }
            if let Some(window) = f.get_u64(&key("attention.sliding_window")).filter(|w| *w > 0) {
                let period = f.get_u64(&key("attention.sliding_window_pattern")).unwrap_or(6) as usize;
                let rope_base = f.get_f32(&key("rope.freq_base_swa")).unwrap_or(10000.0);
                hp.sliding_window = Some(SlidingWindow { window: window as usize, period, rope_base });
            }
            if f.get_f32(&key("final_logit_softcapping")).is_some_and(|c| c != 0.0) {
                bail!("{path}: final_logit_softcapping is not supported");
            }
            // llama.cpp scales queries by 1/sqrt(n_embd / n_head) for the 62-layer (27B) model
            // and by 1/sqrt(head_dim) otherwise; the attention kernels use the latter.
            if hp.n_layer == 62 {
                bail!("{path}: gemma3 27B's query scale (1/sqrt(n_embd/n_head)) is not supported");
            }
        }
        if arch == Arch::GptOss {
            // llama.cpp's openai-moe loader: a window on layers i % 2 == 0 (pattern 2), the
            // SWA layers' RoPE base defaulting to the global one.
            if f.get(&key("attention.sliding_window_pattern")).is_some() {
                bail!(
                    "{path}: {} is not supported for gpt-oss (llama.cpp's default, period 2, is)",
                    key("attention.sliding_window_pattern")
                );
            }
            let window = req_u("attention.sliding_window")?;
            let rope_base = f.get_f32(&key("rope.freq_base_swa")).unwrap_or(hp.rope_base);
            hp.sliding_window = Some(SlidingWindow { window, period: 2, rope_base });
        }
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

    /// Gemma scales the token embeddings by sqrt(n_embd) (f32, as ggml_scale).
    pub fn embedding_scale(&self) -> Option<f32> {
        (self.arch == Arch::Gemma3).then(|| (self.n_embd as f32).sqrt())
    }

    /// The attention window of layer `li`: Some(positions) on a sliding-window layer.
    pub fn layer_window(&self, li: usize) -> Option<usize> {
        let sw = self.sliding_window?;
        (sw.period == 0 || li % sw.period < sw.period - 1).then_some(sw.window)
    }

    /// The RoPE scaling of layer `li` as ggml's rope_ext takes it, or None for plain RoPE.
    /// As llama.cpp: local (sliding-window) layers keep freq_scale 1 except where the
    /// architecture scales them too (gpt-oss: `rope_freq_scale_train_swa` = the global scale);
    /// YaRN's ext_factor and magnitude apply to every layer (they are per context).
    pub fn layer_rope_scaling(&self, li: usize) -> Option<RopeScaling> {
        let s = self.rope_scaling?;
        // llama.cpp stores 1 / factor and recovers the factor as 1 / that (f32 both ways).
        let global_scale = 1.0 / s.factor;
        let local = self.layer_window(li).is_some();
        let freq_scale = if local && self.arch != Arch::GptOss { 1.0 } else { global_scale };
        let (ext_factor, attn_factor) = match s.kind {
            RopeScalingKind::Linear => (0.0, s.attn_factor),
            RopeScalingKind::Yarn => {
                let factor = 1.0 / global_scale;
                let ln = factor.ln();
                // llama_context: mscale = 0.1 ln(factor) + 1, then divided by the same term,
                // which ggml's rope multiplies back in where ext_factor != 0. f32 as there.
                let mscale = if factor <= 1.0 { 1.0 } else { 0.1 * ln + 1.0 };
                (1.0, mscale * (1.0 / (1.0 + 0.1 * ln)) * s.attn_factor)
            }
        };
        let corr_dims = yarn_corr_dims(self.head_dim, s.n_ctx_orig, self.layer_rope_base(li), s.beta_fast, s.beta_slow);
        Some(RopeScaling { freq_scale, ext_factor, attn_factor, corr_dims })
    }

    /// The RoPE base of layer `li` (local layers have their own).
    pub fn layer_rope_base(&self, li: usize) -> f32 {
        match (self.layer_window(li), self.sliding_window) {
            (Some(_), Some(sw)) => sw.rope_base,
            _ => self.rope_base,
        }
    }
}

/// YaRN's correction range in pair indices, as ggml_rope_yarn_corr_dims: the pair whose
/// wavelength fits `beta` rotations into the original context, floored (beta_fast) and
/// ceiled (beta_slow), clamped to 0..n_dims-1.
fn yarn_corr_dims(n_dims: usize, n_ctx_orig: usize, base: f32, beta_fast: f32, beta_slow: f32) -> [f32; 2] {
    let dim = |beta: f32| n_dims as f32 * (n_ctx_orig as f32 / (beta * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln());
    [dim(beta_fast).floor().max(0.0), dim(beta_slow).ceil().min(n_dims as f32 - 1.0)]
}

/// Reads `{arch}.rope.scaling.*`. None where the file asks for no scaling (type none, or a
/// factor of 0 or 1 with no extra magnitude); refuses scaling types and YaRN variants that
/// civetta does not compute.
fn rope_scaling_params(f: &GgufFile, key: &dyn Fn(&str) -> String, n_ctx_train: usize) -> anyhow::Result<Option<RopeScalingParams>> {
    let path = f.path.display();
    let kind = match f.get(&key("rope.scaling.type")) {
        None => RopeScalingKind::Linear,
        Some(v) => match v.as_str() {
            Some("none") => return Ok(None),
            Some("linear") => RopeScalingKind::Linear,
            Some("yarn") => RopeScalingKind::Yarn,
            Some(other) => bail!("{path}: RoPE scaling type \"{other}\" is not supported (none, linear and yarn are)"),
            None => bail!("{path}: {} is not a string", key("rope.scaling.type")),
        },
    };
    // llama.cpp reads these only for other architectures (deepseek2, grok, hunyuan); a file
    // that sets them to something else than their neutral value would need that maths.
    for (k, neutral) in [("yarn_ext_factor", -1.0), ("yarn_attn_factor", 1.0), ("yarn_log_multiplier", 0.0), ("alpha", 0.0)] {
        if let Some(v) = f.get_f32(&key(&format!("rope.scaling.{k}"))).filter(|v| *v != neutral) {
            bail!("{path}: {} = {v} is not supported", key(&format!("rope.scaling.{k}")));
        }
    }
    let factor = f.get_f32(&key("rope.scaling.factor")).or_else(|| f.get_f32(&key("rope.scale_linear"))).unwrap_or(0.0);
    let attn_factor = f.get_f32(&key("rope.scaling.attn_factor")).unwrap_or(1.0);
    if !(factor.is_finite() && factor >= 0.0 && attn_factor.is_finite()) {
        bail!("{path}: RoPE scaling factor {factor} / attn_factor {attn_factor} are not valid");
    }
    if (factor == 0.0 || factor == 1.0) && attn_factor == 1.0 {
        return Ok(None);
    }
    Ok(Some(RopeScalingParams {
        kind,
        factor: if factor == 0.0 { 1.0 } else { factor },
        n_ctx_orig: f.get_u64(&key("rope.scaling.original_context_length")).map(|v| v as usize).unwrap_or(n_ctx_train),
        attn_factor,
        beta_fast: f.get_f32(&key("rope.scaling.yarn_beta_fast")).unwrap_or(32.0),
        beta_slow: f.get_f32(&key("rope.scaling.yarn_beta_slow")).unwrap_or(1.0),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{synth_model, SynthSpec};

    #[test]
    fn yarn_correction_range_of_the_real_gpt_oss() {
        // gpt-oss-20b/120b: head_dim 64, rope base 150000, original context 4096, betas 32 / 1:
        // pairs below 8 keep their angles, pairs above 18 are interpolated.
        assert_eq!(yarn_corr_dims(64, 4096, 150000.0, 32.0, 1.0), [8.0, 18.0]);
        // Clamped to 0 and n_dims - 1.
        assert_eq!(yarn_corr_dims(32, 64, 150000.0, 32.0, 1.0), [0.0, 4.0]);
        assert_eq!(yarn_corr_dims(8, 1 << 30, 10.0, 1.0, 1.0)[1], 7.0);
    }

    fn hparams_of(spec: &SynthSpec) -> HParams {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        synth_model(spec, &path).unwrap();
        HParams::from_gguf(&GgufFile::open(&path).unwrap()).unwrap()
    }

    #[test]
    fn gpt_oss_yarn_scales_every_layer_as_llama_cpp() {
        let mut spec = SynthSpec::preset("gpt-oss", crate::gguf::GgmlType::Q8_0, "tiny").unwrap();
        spec.context = 1024;
        let hp = hparams_of(&spec);
        let s = hp.rope_scaling.expect("yarn read");
        assert_eq!((s.kind, s.factor, s.n_ctx_orig, s.beta_fast, s.beta_slow), (RopeScalingKind::Yarn, 32.0, 32, 32.0, 1.0));
        // Windowed (even) and full layers alike: gpt-oss scales its SWA layers too.
        for li in 0..2 {
            assert!(hp.layer_window(li).is_some() == (li == 0));
            let r = hp.layer_rope_scaling(li).unwrap();
            assert_eq!((r.freq_scale, r.ext_factor), (1.0 / 32.0, 1.0));
            // llama.cpp divides out the 1 + 0.1 ln 32 that ggml's rope multiplies back in.
            assert!((r.attn_factor - 1.0).abs() < 1e-6, "{}", r.attn_factor);
            assert_eq!(r.corr_dims, [0.0, 3.0]);
        }
        spec.yarn_factor = None;
        let plain = hparams_of(&spec);
        assert!(plain.rope_scaling.is_none() && plain.layer_rope_scaling(1).is_none());
    }
}
