//! llama.cpp's tokenizer test vectors: real vocabularies (models/ggml-vocab-*.gguf) with
//! inputs (.inp, cases separated by "\n__ggml_vocab_test__\n") and the token ids llama.cpp
//! produces (.out, one line of space-separated ids per case). Like llama.cpp's
//! tests/test-tokenizer-0.cpp, cases are tokenized with add_special=false, parse_special=false.
//!
//! The files come from scripts/fetch-vocab-tests.sh (directory: $CIVETTA_VOCAB_DIR or
//! build/vocab-tests). Without them these tests fail unless CIVETTA_SKIP_VOCAB_TESTS=1.

use civetta::gguf::GgufFile;
use civetta::tokenizer::Tokenizer;
use std::path::PathBuf;

fn vocab_dir() -> PathBuf {
    match std::env::var_os("CIVETTA_VOCAB_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("build/vocab-tests"),
    }
}

struct Case {
    text: String,
    expected: Vec<u32>,
}

fn read_cases(name: &str) -> Option<(Tokenizer, Vec<Case>)> {
    let dir = vocab_dir();
    let gguf = dir.join(format!("ggml-vocab-{name}.gguf"));
    if !gguf.exists() {
        if std::env::var("CIVETTA_SKIP_VOCAB_TESTS").as_deref() == Ok("1") {
            eprintln!("skipping {name}: CIVETTA_SKIP_VOCAB_TESTS=1");
            return None;
        }
        panic!("{} is missing: run scripts/fetch-vocab-tests.sh (or set CIVETTA_SKIP_VOCAB_TESTS=1)", gguf.display());
    }
    let file = GgufFile::open(&gguf).unwrap_or_else(|e| panic!("{}: {e}", gguf.display()));
    let tk = Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{}: {e:#}", gguf.display()));
    let inp = std::fs::read_to_string(gguf.with_extension("gguf.inp")).expect("reading .inp");
    let out = std::fs::read_to_string(gguf.with_extension("gguf.out")).expect("reading .out");
    // Same splitting as test-tokenizer-0.cpp: the text after the last separator is a case
    // only when it is not empty.
    let sep = "\n__ggml_vocab_test__\n";
    let mut inputs: Vec<&str> = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(sep) {
            Some(i) => {
                inputs.push(&rest[..i]);
                rest = &rest[i + sep.len()..];
            }
            None => {
                inputs.push(rest);
                rest = "";
            }
        }
    }
    let outputs: Vec<Vec<u32>> =
        out.lines().map(|l| l.split_whitespace().map(|t| t.parse().expect("token id in .out")).collect()).collect();
    assert_eq!(inputs.len(), outputs.len(), "{name}: .inp and .out disagree on the number of cases");
    assert!(inputs.len() > 10, "{name}: only {} cases", inputs.len());
    let cases = inputs.into_iter().zip(outputs).map(|(t, e)| Case { text: t.to_string(), expected: e }).collect();
    Some((tk, cases))
}

fn check_vocab(name: &str) {
    let Some((tk, cases)) = read_cases(name) else { return };
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let got = tk.encode(&c.text, false, false);
        if got != c.expected {
            failures.push(format!(
                "  case {i} {:?}\n    expected {:?}\n    got      {:?}\n    pieces   {:?}",
                c.text,
                c.expected,
                got,
                got.iter().map(|&t| tk.piece(t)).collect::<Vec<_>>()
            ));
        }
        // Byte-level BPE and SentencePiece with byte fallback lose nothing.
        assert_eq!(tk.decode(&got), c.text, "{name} case {i}: decode(encode(s)) != s");
    }
    eprintln!("{name}: {}/{} cases match llama.cpp", cases.len() - failures.len(), cases.len());
    assert!(failures.is_empty(), "{name}: {} of {} cases differ from llama.cpp:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

macro_rules! vocab_tests {
    ($($test:ident => $name:literal),* $(,)?) => {
        $(#[test] fn $test() { check_vocab($name); })*
    };
}

vocab_tests! {
    qwen2 => "qwen2",
    qwen35 => "qwen35",
    llama_bpe => "llama-bpe",
    gpt_2 => "gpt-2",
    llama_spm => "llama-spm",
    phi_3 => "phi-3",
    command_r => "command-r",
    deepseek_coder => "deepseek-coder",
    deepseek_llm => "deepseek-llm",
    falcon => "falcon",
    mpt => "mpt",
    refact => "refact",
    starcoder => "starcoder",
}

/// Vocabularies of tokenizer models civetta does not implement are refused with a clear error.
#[test]
fn unsupported_models_are_refused() {
    for name in ["bert-bge", "gemma-4"] {
        let path = vocab_dir().join(format!("ggml-vocab-{name}.gguf"));
        if !path.exists() {
            if std::env::var("CIVETTA_SKIP_VOCAB_TESTS").as_deref() == Ok("1") {
                return;
            }
            panic!("{} is missing: run scripts/fetch-vocab-tests.sh (or set CIVETTA_SKIP_VOCAB_TESTS=1)", path.display());
        }
        let file = GgufFile::open(&path).unwrap();
        let err = Tokenizer::from_gguf(&file).expect_err("unsupported model accepted");
        assert!(err.to_string().contains("unsupported tokenizer model"), "{name}: {err}");
    }
}

/// The GPT-4o split (`tokenizer.ggml.pre` = "gpt-4o": gpt-oss, Llama 4) against llama.cpp:
/// the Qwen2 test vocabulary with its pre name rewritten (so the merges are Qwen2's and the
/// split is GPT-4o's), ids from tests/fixtures/tokenizer/gpt4o-on-qwen2-vocab.json, which
/// scripts/gpt4o_tokenizer_reference.py made with llama-tokenize on the same rewrite.
#[test]
fn gpt4o_split_on_the_qwen2_vocabulary() {
    let gguf = vocab_dir().join("ggml-vocab-qwen2.gguf");
    if !gguf.exists() {
        if std::env::var("CIVETTA_SKIP_VOCAB_TESTS").as_deref() == Ok("1") {
            return;
        }
        panic!("{} is missing: run scripts/fetch-vocab-tests.sh (or set CIVETTA_SKIP_VOCAB_TESTS=1)", gguf.display());
    }
    let mut file = GgufFile::open(&gguf).unwrap();
    file.metadata.insert("tokenizer.ggml.pre".into(), civetta::gguf::MetadataValue::String("gpt-4o".into()));
    let tk = Tokenizer::from_gguf(&file).unwrap();
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tokenizer/gpt4o-on-qwen2-vocab.json");
    let f: serde_json::Value = serde_json::from_slice(&std::fs::read(fixture).unwrap()).unwrap();
    let cases = f["cases"].as_array().unwrap();
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let text = c["text"].as_str().unwrap();
        let want: Vec<u32> = c["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let got = tk.encode(text, false, false);
        if got != want {
            failures.push(format!("  case {i} {text:?}\n    expected {want:?}\n    got      {got:?}"));
        }
    }
    eprintln!("gpt-4o split: {}/{} cases match llama.cpp", cases.len() - failures.len(), cases.len());
    assert!(failures.is_empty(), "{} of {} cases differ from llama.cpp:\n{}", failures.len(), cases.len(), failures.join("\n"));
    // And it differs from the Qwen2 split somewhere (the fixture tests the GPT-4o expression).
    let qwen2 = Tokenizer::from_gguf(&GgufFile::open(&gguf).unwrap()).unwrap();
    assert!(cases
        .iter()
        .any(|c| qwen2.encode(c["text"].as_str().unwrap(), false, false) != tk.encode(c["text"].as_str().unwrap(), false, false)));
}
