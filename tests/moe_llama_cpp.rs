//! civetta's mixture-of-experts forward pass (qwen3moe, qwen2moe; CPU backend) against
//! llama.cpp on the same synthetic files.
//!
//! tests/fixtures/moe/<arch>-<quant>.json hold llama.cpp's last-position logits of a 16-token
//! prompt and its 32 greedy ids from there, written by scripts/moe_llama_cpp_reference.py. The
//! synthetic models are a pure function of `civetta model synth`'s arguments, so the test
//! regenerates each model (checking the sha256 the fixture recorded) and compares:
//! - the prompt's last-position logits: relative L2 error (|ours - theirs| / |theirs|) below
//!   MAX_REL_L2;
//! - the 32 greedy ids, teacher-forced through `civetta logits` and free-running through
//!   `civetta generate`, except that a near tie (llama.cpp's top-1/top-2 margin below NEAR_TIE
//!   of max |logit|) may go to llama.cpp's runner-up.
//!
//! Plus: changing the router weights of one layer changes the logits (routing matters), and
//! gpt-oss's YaRN RoPE scaling matters: the same file without its scaling keys is far from
//! llama.cpp's logits (so the fixtures would catch a missing or wrong YaRN).

mod common;

use common::{civetta, run_json};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/moe");
/// Bound on the relative L2 error of the prompt logits. The dense synthetic models stay within
/// 5e-2 (max-abs relative) of a reference that quantises activations like ggml
/// (tests/reference_logits.rs); the MoE models measured against llama.cpp are in docs/REFERENCE.md.
const MAX_REL_L2: f64 = 5e-2;
const NEAR_TIE: f64 = 1e-2;

fn numbers(v: &serde_json::Value) -> Vec<f64> {
    v.as_array().expect("JSON array").iter().map(|x| x.as_f64().expect("number")).collect()
}

fn ids(v: &serde_json::Value) -> Vec<usize> {
    numbers(v).into_iter().map(|x| x as usize).collect()
}

fn synth(dir: &Path, arch: &str, quant: &str, extra: &[&str]) -> PathBuf {
    let path = dir.join(format!("{arch}-{quant}{}.gguf", extra.join("")));
    let out = civetta()
        .args(["model", "synth", "--arch", arch, "--quant", quant, "--seed", "1"])
        .args(extra)
        .arg("-o")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "synth {arch} {quant} failed: {}", String::from_utf8_lossy(&out.stderr));
    path
}

fn logits(model: &Path, tokens: &[usize]) -> Vec<Vec<f64>> {
    let list = tokens.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(",");
    let v = run_json(civetta().args(["logits", "--model"]).arg(model).args(["--tokens", &list]));
    v["logits"].as_array().expect("\"logits\" array").iter().map(numbers).collect()
}

fn argmax(r: &[f64]) -> usize {
    (0..r.len()).fold(0, |best, i| if r[i] > r[best] { i } else { best })
}

fn rel_l2(ours: &[f64], theirs: &[f64]) -> f64 {
    assert_eq!(ours.len(), theirs.len(), "vocabulary size");
    let diff: f64 = ours.iter().zip(theirs).map(|(a, b)| (a - b) * (a - b)).sum();
    let norm: f64 = theirs.iter().map(|b| b * b).sum();
    (diff / norm).sqrt()
}

fn fixtures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(FIXTURES)
        .expect("tests/fixtures/moe")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    assert!(v.len() >= 4, "expected the qwen3moe/qwen2moe x q8_0/q4_k fixtures in {FIXTURES}");
    v
}

/// The extra `civetta model synth` arguments a fixture was made with (none for older ones).
fn synth_args(f: &serde_json::Value) -> Vec<&str> {
    f["synth"]["args"].as_array().map(|a| a.iter().map(|v| v.as_str().expect("string argument")).collect()).unwrap_or_default()
}

fn fixture(name: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(Path::new(FIXTURES).join(name)).unwrap()).unwrap()
}

fn check_against_llama_cpp(dir: &Path, fixture: &Path) {
    let f: serde_json::Value = serde_json::from_slice(&std::fs::read(fixture).unwrap()).unwrap();
    let (arch, quant) = (f["synth"]["arch"].as_str().unwrap(), f["synth"]["quant"].as_str().unwrap());
    let m = synth(dir, arch, quant, &synth_args(&f));
    let sha = hex::encode(Sha256::digest(std::fs::read(&m).unwrap()));
    assert_eq!(
        sha,
        f["synth"]["sha256"].as_str().unwrap(),
        "{arch} {quant}: `civetta model synth` no longer writes the file the fixture was made from; rerun scripts/moe_llama_cpp_reference.py"
    );
    let prompt = ids(&f["prompt"]);
    let expected = ids(&f["tokens"]);
    let runner_up = ids(&f["runner_up"]);
    let rel_margins = numbers(&f["rel_margins"]);
    let n = prompt.len();

    let all: Vec<usize> = prompt.iter().chain(&expected).copied().collect();
    let ours = logits(&m, &all);
    let err = rel_l2(&ours[n - 1], &numbers(&f["prompt_logits"]));
    eprintln!("{arch} {quant}: prompt logits relative L2 error vs llama.cpp {err:.2e}");
    assert!(err < MAX_REL_L2, "{arch} {quant}: prompt logits relative L2 error {err:.2e} >= {MAX_REL_L2}");

    let mut first_tie_break = None;
    for (step, &want) in expected.iter().enumerate() {
        let got = argmax(&ours[n - 1 + step]);
        if got == want {
            continue;
        }
        assert!(
            rel_margins[step] < NEAR_TIE && got == runner_up[step],
            "{arch} {quant}, greedy step {step}: civetta picks {got}, llama.cpp {want} (runner-up {}, margin {:.2e} of max |logit|)",
            runner_up[step],
            rel_margins[step]
        );
        eprintln!("{arch} {quant}, step {step}: near tie ({:.1e}) broken toward llama.cpp's runner-up", rel_margins[step]);
        first_tie_break = first_tie_break.or(Some(step));
    }

    let list = prompt.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(",");
    let out = run_json(civetta().args(["generate", "--model"]).arg(&m).args([
        "--prompt-tokens",
        &list,
        "-n",
        &expected.len().to_string(),
        "--ignore-eos",
        "--json",
    ]));
    let generated = ids(&out["token_ids"]);
    let same = first_tie_break.unwrap_or(expected.len());
    assert_eq!(generated[..same], expected[..same], "{arch} {quant}: `civetta generate` differs from llama.cpp's greedy ids");
}

#[test]
fn moe_models_match_llama_cpp() {
    let dir = tempfile::tempdir().unwrap();
    let queue = std::sync::Mutex::new(fixtures());
    // Two cases at a time: each is a few independent processes.
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let Some(f) = queue.lock().unwrap().pop() else { break };
                check_against_llama_cpp(dir.path(), &f);
            });
        }
    });
}

/// Negating layer 0's router (F32) makes every token pick its least favoured experts; the
/// logits at every position must move.
fn check_router_change(arch: &str, quant: &str, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), arch, quant, extra);
    let tokens = [299, 407, 280, 461, 114, 501, 293, 574];
    let before = logits(&m, &tokens);

    let file = civetta::gguf::GgufFile::open(&m).unwrap();
    let t = file.tensor("blk.0.ffn_gate_inp.weight").expect("router tensor");
    assert_eq!(t.ggml_type, civetta::gguf::GgmlType::F32);
    let (start, len) = ((file.data_offset + t.offset) as usize, t.size_bytes as usize);
    drop(file);
    let mut bytes = std::fs::read(&m).unwrap();
    for c in bytes[start..start + len].chunks_exact_mut(4) {
        let v = -f32::from_le_bytes(c.try_into().unwrap());
        c.copy_from_slice(&v.to_le_bytes());
    }
    let changed = dir.path().join("router-negated.gguf");
    std::fs::write(&changed, bytes).unwrap();
    let after = logits(&changed, &tokens);

    for (pos, (a, b)) in before.iter().zip(&after).enumerate() {
        let err = rel_l2(b, a);
        assert!(err > 1e-2, "{arch} {quant}, position {pos}: negating the router moved the logits by only {err:.2e} (relative L2)");
    }
}

#[test]
fn changing_the_router_changes_the_output() {
    check_router_change("qwen3moe", "q8_0", &[]);
}

/// gpt-oss routes by the top-k raw logits (plus the router bias) and a softmax over the k.
#[test]
fn changing_the_gpt_oss_router_changes_the_output() {
    check_router_change("gpt-oss", "mxfp4", &["--context", "1024"]);
}

/// The gpt-oss fixtures are made with YaRN (factor 32, original context 32 of 1024): the same
/// weights without the scaling keys must be far outside the bound from llama.cpp's logits,
/// so that a civetta that ignored or botched YaRN would fail the comparison above.
#[test]
fn gpt_oss_without_yarn_is_far_from_llama_cpp() {
    let f = fixture("gpt-oss-mxfp4.json");
    let args = synth_args(&f);
    assert!(args.contains(&"--context"), "the gpt-oss fixture is expected to use a short context (YaRN past the original one)");
    let dir = tempfile::tempdir().unwrap();
    let mut plain = args.clone();
    plain.extend(["--yarn-factor", "0"]);
    let m = synth(dir.path(), "gpt-oss", "mxfp4", &plain);
    let prompt = ids(&f["prompt"]);
    let ours = logits(&m, &prompt);
    let err = rel_l2(&ours[prompt.len() - 1], &numbers(&f["prompt_logits"]));
    eprintln!("gpt-oss mxfp4 without YaRN: prompt logits relative L2 error vs llama.cpp (with YaRN) {err:.2e}");
    assert!(err > 2.0 * MAX_REL_L2, "without YaRN the logits are only {err:.2e} from llama.cpp's: the fixture does not test YaRN");
}
