//! The MoE routing tap (src/model/moe_trace.rs) that gpu_check uses to separate routing from
//! arithmetic: replaying a model's own recorded routing gives its logits bit for bit, and
//! replaying another routing changes them (so the replay really drives the experts).

use civetta::gguf::{GgmlType, GgufFile};
use civetta::model::{all_logits, Model};
use civetta::synth::{synth_model, SynthSpec};
use std::sync::Arc;

fn check(arch: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let spec = SynthSpec::preset(arch, GgmlType::Q8_0, "tiny").unwrap();
    synth_model(&spec, &path).unwrap();
    let cpu = civetta::backend::create_cpu(0).unwrap();
    let model = Model::load(Arc::new(GgufFile::open(&path).unwrap()), cpu).unwrap();
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 7919 + 13) % spec.vocab as u32).collect();
    let free = all_logits(&model, &prompt).unwrap();
    let tap = model.routing_tap().expect("MoE model has a routing tap").clone();

    tap.start_record();
    let recorded_logits = all_logits(&model, &prompt).unwrap();
    let trace = tap.take_record();
    assert!(!trace.is_empty());
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&recorded_logits), bits(&free), "{arch}: recording changed the logits");
    assert!(trace.iter().all(|c| c.margins.iter().all(|&m| m >= 0.0) && c.margins.len() == c.scales.len()));

    tap.start_replay(&trace);
    let replayed = all_logits(&model, &prompt).unwrap();
    assert_eq!(tap.stop(), 0, "{arch}: every recorded call replayed");
    assert_eq!(bits(&replayed), bits(&free), "{arch}: replaying its own routing must be bit-identical");
    assert_eq!(civetta::model::moe_trace::compare(&trace, &trace).flips, 0);

    // Another routing: every token's experts shifted by one id.
    let mut other = trace.clone();
    let ne = spec_experts(&model);
    for c in &mut other {
        c.routing.experts.iter_mut().for_each(|e| *e = (*e + 1) % ne);
    }
    let diff = civetta::model::moe_trace::compare(&trace, &other);
    // Every choice flips; only the first layer's are primary.
    assert_eq!(diff.flips, trace.iter().map(|c| c.margins.len()).sum::<usize>());
    assert_eq!(diff.primary, trace[0].margins.len());
    tap.start_replay(&other);
    let forced = all_logits(&model, &prompt).unwrap();
    tap.stop();
    assert_ne!(bits(&forced), bits(&free), "{arch}: a different routing must change the logits");
}

fn spec_experts<B: civetta::backend::Backend>(m: &Model<B>) -> u32 {
    m.expert_load().unwrap().snapshot().len() as u32
}

#[test]
fn qwen3moe_replays_its_own_routing_bit_for_bit_and_another_routing_differs() {
    check("qwen3moe");
}

#[test]
fn qwen2moe_replays_its_own_routing_bit_for_bit_and_another_routing_differs() {
    check("qwen2moe");
}
