//! Bit-compatibility of `civetta::quant` with an independent implementation of the ggml
//! block formats: PyPI `gguf` (gguf-py's numpy code), driven by tests/python/quant_crosscheck.py.
//!
//! (a) every supported type: our quantize_row bytes, dequantised by python, equal our
//!     dequantize_row bit for bit;
//! (b) types python can quantise (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1): python's bytes,
//!     dequantised by us, equal python's dequantisation bit for bit;
//! (c) for those types python's quantised bytes equal ours byte for byte (same reference
//!     algorithms as ggml's quantize_row_*_ref).
//!
//! Needs python3 with numpy and gguf 0.19.0 (scripts/test-deps.sh puts them in build/venv); set
//! CIVETTA_SKIP_PYTHON=1 to skip when they are missing.

use civetta::quant::{self, GgmlType};
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::Command;

const SUPPORTED: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

const PYTHON_QUANTIZES: [GgmlType; 8] =
    [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1];

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/quant_crosscheck.py")
}

/// Whether python3 with numpy and gguf is usable; panics with instructions unless skipping
/// is allowed.
fn python_ready() -> bool {
    let probe = Command::new("python3").args(["-c", "import numpy, gguf.quants"]).output();
    let problem = match probe {
        Ok(o) if o.status.success() => return true,
        Ok(o) => format!("python3 cannot import numpy/gguf: {}", String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => format!("cannot run python3: {e}"),
    };
    if std::env::var("CIVETTA_SKIP_PYTHON").as_deref() == Ok("1") {
        eprintln!("skipping the python cross-check (CIVETTA_SKIP_PYTHON=1): {problem}");
        return false;
    }
    panic!("{problem}\nRun `make test` (scripts/test-deps.sh installs them into build/venv; `make test` puts build/venv/bin first on PATH), or set CIVETTA_SKIP_PYTHON=1 to skip this test.");
}

/// One row with the awkward cases: normal data with outliers at three magnitudes, zero and
/// constant blocks, one-sided blocks, a lone spike, and values near f16 limits.
fn test_row() -> Vec<f32> {
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(2024);
    let mut x = Vec::new();
    for scale in [1.0f32, 1e-4, 300.0] {
        for _ in 0..256 * 3 {
            let g: f32 = (0..4).map(|_| r.gen::<f32>() - 0.5).sum::<f32>() * scale;
            x.push(if r.gen::<f32>() < 0.01 { g * 10.0 } else { g });
        }
    }
    x.extend([0.0f32; 256]);
    x.extend([0.75f32; 256]);
    x.extend((0..256).map(|i| 1.0 + i as f32 / 64.0)); // positive only
    x.extend((0..256).map(|i| -0.5 - (i % 7) as f32)); // negative only
    x.extend((0..256).map(|i| if i % 97 == 3 { 40.0 } else { 0.001 * (i % 5) as f32 }));
    x.extend((0..256).map(|i| if i % 2 == 0 { 60000.0 } else { -1e-7 }));
    assert_eq!(x.len() % 256, 0);
    x
}

fn write_f32(path: &Path, x: &[f32]) {
    std::fs::write(path, x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
}

fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn py_type(t: GgmlType) -> String {
    t.name().to_ascii_uppercase()
}

/// Compares bit patterns (so -0.0 vs 0.0 and NaN payloads count), reporting the first misses.
fn assert_bits_equal(what: &str, ours: &[f32], theirs: &[f32]) {
    assert_eq!(ours.len(), theirs.len(), "{what}: lengths");
    let bad: Vec<String> = ours
        .iter()
        .zip(theirs)
        .enumerate()
        .filter(|(_, (a, b))| a.to_bits() != b.to_bits())
        .take(5)
        .map(|(i, (a, b))| format!("[{i}] ours {a:e} python {b:e}"))
        .collect();
    assert!(bad.is_empty(), "{what}: differs at {}", bad.join(", "));
}

#[test]
fn quant_formats_match_python_gguf_bit_for_bit() {
    if !python_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let x = test_row();
    let n = x.len();
    let input = dir.path().join("input.f32");
    write_f32(&input, &x);

    let mut jobs = Vec::new();
    let mut ours = Vec::new();
    for t in SUPPORTED {
        let mut q = vec![0u8; t.row_bytes(n).unwrap()];
        quant::quantize_row(t, &x, &mut q).unwrap();
        let qpath = dir.path().join(format!("ours_{t}.bin"));
        std::fs::write(&qpath, &q).unwrap();
        let deq = dir.path().join(format!("ours_{t}_py.f32"));
        jobs.push(serde_json::json!({"op": "dequantize", "type": py_type(t), "input": qpath, "output": deq, "n": n}));
        ours.push((t, q, deq));
    }
    let mut theirs = Vec::new();
    for t in PYTHON_QUANTIZES {
        let qpath = dir.path().join(format!("py_{t}.bin"));
        let deq = dir.path().join(format!("py_{t}_py.f32"));
        jobs.push(serde_json::json!({"op": "quantize", "type": py_type(t), "input": input, "output": qpath, "n": n}));
        jobs.push(serde_json::json!({"op": "dequantize", "type": py_type(t), "input": qpath, "output": deq, "n": n}));
        theirs.push((t, qpath, deq));
    }
    let jobs_path = dir.path().join("jobs.json");
    std::fs::write(&jobs_path, serde_json::to_vec(&jobs).unwrap()).unwrap();
    let out = Command::new("python3").arg(script()).arg(&jobs_path).output().expect("run python3");
    assert!(out.status.success(), "quant_crosscheck.py failed: {}", String::from_utf8_lossy(&out.stderr));

    // (a) our bytes decode identically in python.
    for (t, q, deq) in &ours {
        let mut mine = vec![0f32; n];
        quant::dequantize_row(*t, q, &mut mine).unwrap();
        assert_bits_equal(&format!("{t}: our quantisation, dequantised"), &mine, &read_f32(deq));
    }
    // (b) python's bytes decode identically here, and (c) they are our bytes.
    for (t, qpath, deq) in &theirs {
        let q = std::fs::read(qpath).unwrap();
        assert_eq!(q.len(), t.row_bytes(n).unwrap(), "{t}: python row size");
        let mut mine = vec![0f32; n];
        quant::dequantize_row(*t, &q, &mut mine).unwrap();
        assert_bits_equal(&format!("{t}: python's quantisation, dequantised"), &mine, &read_f32(deq));
        let (_, our_bytes, _) = ours.iter().find(|(o, _, _)| o == t).unwrap();
        let first_diff = our_bytes.iter().zip(&q).position(|(a, b)| a != b);
        assert_eq!(first_diff, None, "{t}: quantised bytes differ from python's (block {:?})", first_diff.map(|i| i / t.type_size()));
    }
}
