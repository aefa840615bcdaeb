//! Token sampling: repetition penalty, temperature, top-k, top-p, min-p, seeded RNG.
//!
//! Greedy (temperature 0) is deterministic with ties broken towards the lower token id,
//! so two builds that compute the same logits produce the same tokens.

use super::log_sum_exp::{log_sum_exp, max_logit};
use super::types::SamplingParams;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
}

/// The chosen token and its log-probability under the (penalised, untempered) distribution.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub logprob: f32,
    /// The log-softmax's normaliser of the penalised logits (`logprob = logit - log_norm`),
    /// for [`top_logprobs`] of the same logits.
    pub log_norm: f32,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = ChaCha8Rng::seed_from_u64(params.seed);
        Sampler { params, rng }
    }

    /// Samples from `logits` (modified in place by the penalty); `history` is all tokens so far.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> Sampled {
        let p = &self.params;
        if p.repetition_penalty > 0.0 && p.repetition_penalty != 1.0 {
            apply_repetition_penalty(logits, history, p.repetition_penalty, p.repetition_window);
        }
        let sampled = |logits: &[f32], tok: usize| -> Sampled {
            let log_norm = log_sum_exp(logits);
            Sampled { token: tok as u32, logprob: logits[tok] - log_norm, log_norm }
        };
        if p.temperature <= 0.0 {
            return sampled(logits, argmax(logits));
        }
        // Candidates sorted by logit, descending (stable: ties keep lower ids first).
        let mut cand: Vec<(usize, f32)> = logits.iter().copied().enumerate().collect();
        cand.sort_by(|a, b| b.1.total_cmp(&a.1));
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.truncate(p.top_k);
        }
        let max = cand[0].1;
        let mut probs: Vec<f64> = cand.iter().map(|&(_, l)| (((l - max) / p.temperature) as f64).exp()).collect();
        let sum: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= sum);
        // min-p: drop tokens below min_p * p(top).
        let mut keep = probs.len();
        if p.min_p > 0.0 {
            let thr = probs[0] * p.min_p as f64;
            keep = probs.iter().position(|&x| x < thr).unwrap_or(keep).max(1);
        }
        // top-p: smallest prefix whose mass reaches top_p.
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, &x) in probs[..keep].iter().enumerate() {
                acc += x;
                if acc >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        let mass: f64 = probs[..keep].iter().sum();
        let mut r = self.rng.gen::<f64>() * mass;
        let mut chosen = cand[keep - 1].0;
        for (i, &x) in probs[..keep].iter().enumerate() {
            if r < x {
                chosen = cand[i].0;
                break;
            }
            r -= x;
        }
        sampled(logits, chosen)
    }
}

/// The `n` most likely tokens and their log-probabilities under `logits` (log-softmax),
/// most likely first; ties keep the lower id first, like [`argmax`]. `log_norm` is the
/// logits' [`log_sum_exp`] (`Sampled::log_norm` after sampling from them: the sampled
/// token's logprob then agrees exactly, and the vocabulary is not summed twice).
pub fn top_logprobs(logits: &[f32], n: usize, log_norm: f32) -> Vec<super::types::TopLogprob> {
    if n == 0 {
        return Vec::new();
    }
    let lse = log_norm;
    // A running top-n (n <= 20): one pass over the vocabulary, no full sort.
    let mut top: Vec<(usize, f32)> = Vec::with_capacity(n + 1);
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() || (top.len() == n && l <= top[n - 1].1) {
            continue;
        }
        let at = top.partition_point(|&(_, v)| v >= l);
        top.insert(at, (i, l));
        top.truncate(n);
    }
    top.into_iter().map(|(i, l)| super::types::TopLogprob { id: i as u32, logprob: l - lse }).collect()
}

/// Index of the largest logit; the lowest index wins ties. NaN never wins; 0 if nothing
/// beats -inf.
pub fn argmax(logits: &[f32]) -> usize {
    // Two passes: the maximum (vectorised), then its first index.
    let max = max_logit(logits);
    if max == f32::NEG_INFINITY {
        return 0;
    }
    logits.iter().position(|&v| v == max).expect("the maximum is one of the logits")
}

/// llama.cpp's penalty: positive logits are divided, negative multiplied, once per distinct token.
pub fn apply_repetition_penalty(logits: &mut [f32], history: &[u32], penalty: f32, window: usize) {
    let start = history.len().saturating_sub(window);
    let mut seen = std::collections::HashSet::new();
    for &t in &history[start..] {
        let t = t as usize;
        if t < logits.len() && seen.insert(t) {
            let l = &mut logits[t];
            *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams { temperature, ..Default::default() }
    }

    /// The one-at-a-time definition `argmax` must agree with.
    fn argmax_reference(logits: &[f32]) -> usize {
        let mut best = 0;
        let mut best_v = f32::NEG_INFINITY;
        for (i, &v) in logits.iter().enumerate() {
            if v > best_v {
                best_v = v;
                best = i;
            }
        }
        best
    }

    #[test]
    fn argmax_matches_the_one_at_a_time_definition() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for len in [0usize, 1, 5, 15, 16, 17, 33, 1000, 49_152] {
            for case in 0..40 {
                // Few distinct values, so ties (also between -0.0 and 0.0) are common; some
                // NaN and infinities.
                let v: Vec<f32> = (0..len)
                    .map(|_| match rng.gen_range(0..20) {
                        0 => f32::NAN,
                        1 => f32::NEG_INFINITY,
                        2 if case % 4 == 0 => f32::INFINITY,
                        3 => -0.0,
                        _ => (rng.gen_range(-4i32..4) as f32) * if case % 2 == 0 { 1.0 } else { -1.0 },
                    })
                    .collect();
                assert_eq!(argmax(&v), argmax_reference(&v), "len {len} case {case}: {v:?}");
            }
        }
        assert_eq!(argmax(&[f32::NAN; 40]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 40]), 0);
        let mut v = vec![f32::NEG_INFINITY; 40];
        v[37] = -1e30;
        assert_eq!(argmax(&v), 37);
    }

    #[test]
    fn greedy_picks_max_and_lowest_on_ties() {
        let mut s = Sampler::new(params(0.0));
        assert_eq!(s.sample(&mut [0.1, 3.0, 3.0, -1.0], &[]).token, 1);
    }

    #[test]
    fn same_seed_same_tokens_different_seed_differs() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let run = |seed| {
            let mut s = Sampler::new(SamplingParams { temperature: 1.0, seed, ..Default::default() });
            (0..50).map(|_| s.sample(&mut logits.clone(), &[]).token).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut s = Sampler::new(SamplingParams { temperature: 5.0, top_k: 1, seed: 3, ..Default::default() });
        for _ in 0..20 {
            assert_eq!(s.sample(&mut [0.0, 1.0, 0.5], &[]).token, 1);
        }
    }

    #[test]
    fn top_p_and_min_p_restrict_support() {
        // p ~ [0.88, 0.12, ~0]: top_p 0.5 keeps only token 0; min_p 0.5 also.
        let logits = [4.0f32, 2.0, -10.0];
        for p in [
            SamplingParams { temperature: 1.0, top_p: 0.5, seed: 1, ..Default::default() },
            SamplingParams { temperature: 1.0, min_p: 0.5, seed: 1, ..Default::default() },
        ] {
            let mut s = Sampler::new(p);
            for _ in 0..50 {
                assert_eq!(s.sample(&mut logits.clone(), &[]).token, 0);
            }
        }
    }

    #[test]
    fn repetition_penalty_changes_greedy_choice() {
        let mut s = Sampler::new(SamplingParams { repetition_penalty: 2.0, ..Default::default() });
        assert_eq!(s.sample(&mut [2.0, 1.5], &[0]).token, 1);
        let mut l = [2.0f32, -1.0];
        apply_repetition_penalty(&mut l, &[1, 1, 0], 2.0, 64);
        assert_eq!(l, [1.0, -2.0]);
    }

    #[test]
    fn top_logprobs_are_the_most_likely_tokens_in_order() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let top = top_logprobs(&logits, 3, log_sum_exp(&logits));
        assert_eq!(top.iter().map(|t| t.id).collect::<Vec<_>>(), [1, 3, 2]);
        // The sampled token's logprob (greedy: id 1) is the first alternative's, bit for bit.
        let mut l = logits;
        let s = Sampler::new(SamplingParams::default()).sample(&mut l, &[]);
        assert_eq!((s.token, s.logprob.to_bits()), (1, top[0].logprob.to_bits()));
        let p: f32 = top_logprobs(&[0.0, 0.0], 5, log_sum_exp(&[0.0, 0.0])).iter().map(|t| t.logprob.exp()).sum();
        assert!((p - 1.0).abs() < 1e-6, "{p}");
        assert!(top_logprobs(&logits, 0, log_sum_exp(&logits)).is_empty());
    }

    #[test]
    fn logprob_is_log_softmax() {
        let mut s = Sampler::new(params(0.0));
        let out = s.sample(&mut [0.0, 0.0], &[]);
        assert!((out.logprob - 0.5f32.ln()).abs() < 1e-6);
    }
}
