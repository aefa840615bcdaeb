//! Cross-check of civetta's byte-level BPE against HF `tokenizers` (an independent
//! implementation, driven by tests/python/tokenizer_hf_crosscheck.py) on thousands of
//! generated strings: a vocabulary trained on the built-in corpus under three pre-tokenizers,
//! and the real GPT-2, Qwen2 and Llama 3 vocabularies from llama.cpp's test files when
//! present (scripts/fetch-vocab-tests.sh).
//!
//! Needs python3 with `tokenizers` (pip install tokenizers); skipped with
//! CIVETTA_SKIP_PYTHON=1.

use civetta::gguf::GgufFile;
use civetta::tokenizer::{train, Tokenizer, TokenizerKind, TokenizerParts};
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::Command;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/tokenizer_hf_crosscheck.py");

fn python_or_skip() -> bool {
    if std::env::var("CIVETTA_SKIP_PYTHON").as_deref() == Ok("1") {
        eprintln!("skipping the HF tokenizers cross-check: CIVETTA_SKIP_PYTHON=1");
        return false;
    }
    let ok = Command::new("python3").args(["-c", "import tokenizers"]).status().map(|s| s.success()).unwrap_or(false);
    assert!(ok, "the HF cross-check needs python3 with tokenizers (run `make test`: scripts/test-deps.sh installs them into build/venv; `make test` puts build/venv/bin first on PATH), or set CIVETTA_SKIP_PYTHON=1");
    true
}

/// Strings mixing corpus words, whitespace runs, digits, punctuation, contractions and
/// characters from many scripts (including combining marks and emoji).
fn generated_texts(n: usize, seed: u64) -> Vec<String> {
    let words: Vec<&str> = train::CORPUS.split_whitespace().collect();
    let ranges: &[(u32, u32)] = &[
        (0x20, 0x7E),       // ASCII
        (0xA0, 0xFF),       // Latin-1
        (0x100, 0x17F),     // Latin Extended-A
        (0x300, 0x36F),     // combining marks
        (0x391, 0x3C9),     // Greek
        (0x410, 0x44F),     // Cyrillic
        (0x5D0, 0x5EA),     // Hebrew
        (0x620, 0x64A),     // Arabic
        (0x660, 0x669),     // Arabic-Indic digits
        (0x905, 0x939),     // Devanagari
        (0x93E, 0x94D),     // Devanagari vowel signs
        (0x2000, 0x206F),   // general punctuation, odd spaces
        (0x2150, 0x218B),   // number forms
        (0x2200, 0x22FF),   // math
        (0x3000, 0x303F),   // CJK punctuation
        (0x3041, 0x3096),   // Hiragana
        (0x4E00, 0x4FFF),   // CJK
        (0xAC00, 0xAD00),   // Hangul
        (0xFF01, 0xFF5E),   // fullwidth
        (0x1F300, 0x1F64F), // emoji
    ];
    let specials = [
        "'s",
        "'T",
        "'re",
        "'VE",
        "'m",
        "'ll",
        "'D",
        "''",
        "\r\n",
        "\n\n\n",
        "    ",
        "\t",
        " \n ",
        "\u{200d}",
        "123456789",
        "3.14",
        "--",
        "===",
    ];
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let mut s = String::new();
            for _ in 0..rng.gen_range(1..12) {
                match rng.gen_range(0..10) {
                    0..=3 => s.push_str(words[rng.gen_range(0..words.len())]),
                    4 => s.push_str(specials[rng.gen_range(0..specials.len())]),
                    5 => s.push_str(&" ".repeat(rng.gen_range(1..5))),
                    _ => {
                        let (lo, hi) = ranges[rng.gen_range(0..ranges.len())];
                        for _ in 0..rng.gen_range(1..5) {
                            if let Some(c) = char::from_u32(rng.gen_range(lo..=hi)) {
                                s.push(c);
                            }
                        }
                    }
                }
                if rng.gen_bool(0.5) {
                    s.push(' ');
                }
            }
            s
        })
        .collect()
}

fn hf_encode(vocab: serde_json::Value, pre: &str, texts: &[String]) -> Vec<Vec<u32>> {
    let dir = tempfile::tempdir().unwrap();
    let req = dir.path().join("request.json");
    std::fs::write(&req, serde_json::to_vec(&serde_json::json!({ "vocab": vocab, "pre": pre, "texts": texts })).unwrap()).unwrap();
    let out = Command::new("python3").arg(SCRIPT).arg(&req).output().expect("running python3");
    assert!(out.status.success(), "{SCRIPT} failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON from the script");
    serde_json::from_value(v["ids"].clone()).unwrap()
}

fn compare(what: &str, tk: &Tokenizer, theirs: &[Vec<u32>], texts: &[String]) {
    let mut failures = Vec::new();
    for (text, hf) in texts.iter().zip(theirs) {
        let ours = tk.encode(text, false, false);
        if &ours != hf {
            failures.push(format!("  {text:?}\n    hf    {hf:?}\n    ours  {ours:?}"));
        }
        assert_eq!(tk.decode(&ours), *text, "{what}: round trip");
    }
    eprintln!("{what}: {}/{} strings identical to HF tokenizers", texts.len() - failures.len(), texts.len());
    assert!(
        failures.is_empty(),
        "{what}: {} strings differ from HF:\n{}",
        failures.len(),
        failures.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn trained_vocabulary_matches_hf_tokenizers() {
    if !python_or_skip() {
        return;
    }
    let (tokens, merges) = train::train_byte_level_bpe(train::CORPUS, 1000);
    let mut texts = generated_texts(1500, 7);
    texts.extend(train::CORPUS.lines().map(str::to_string));
    for pre in ["gpt-2", "qwen2", "llama-bpe"] {
        let tk = Tokenizer::from_parts(TokenizerParts {
            kind: Some(TokenizerKind::Bpe),
            tokens: tokens.clone(),
            merges: merges.clone(),
            pre: pre.into(),
            ..Default::default()
        })
        .unwrap();
        let theirs = hf_encode(serde_json::json!({ "tokens": tokens, "merges": merges }), pre, &texts);
        compare(&format!("trained vocabulary, {pre} pre-tokenizer"), &tk, &theirs, &texts);
    }
}

fn vocab_file(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("CIVETTA_VOCAB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("build/vocab-tests"));
    let p = dir.join(format!("ggml-vocab-{name}.gguf"));
    if p.exists() {
        return Some(p);
    }
    if std::env::var("CIVETTA_SKIP_VOCAB_TESTS").as_deref() == Ok("1") {
        eprintln!("skipping {name}: CIVETTA_SKIP_VOCAB_TESTS=1");
        return None;
    }
    panic!("{} is missing: run scripts/fetch-vocab-tests.sh (or set CIVETTA_SKIP_VOCAB_TESTS=1)", p.display());
}

#[test]
fn real_vocabularies_match_hf_tokenizers() {
    if !python_or_skip() {
        return;
    }
    let texts = generated_texts(2000, 11);
    for (name, pre) in [("gpt-2", "gpt-2"), ("qwen2", "qwen2"), ("llama-bpe", "llama-bpe")] {
        let Some(path) = vocab_file(name) else { continue };
        let file = GgufFile::open(&path).unwrap();
        let tk = Tokenizer::from_gguf(&file).unwrap();
        assert_eq!(tk.pre_tokenizer(), pre);
        // Passed as JSON: gguf's Python reader takes tens of seconds on these files.
        let tokens = file.get_str_array("tokenizer.ggml.tokens").unwrap();
        let merges = file.get_str_array("tokenizer.ggml.merges").unwrap();
        let theirs = hf_encode(serde_json::json!({ "tokens": tokens, "merges": merges }), pre, &texts);
        compare(&format!("{name} vocabulary"), &tk, &theirs, &texts);
    }
}
