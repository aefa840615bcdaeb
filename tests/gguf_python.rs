//! Cross-checks against the independent Python implementation (PyPI `gguf`, llama.cpp's
//! gguf-py): files civetta writes must read back identically with gguf.GGUFReader, and files
//! gguf.GGUFWriter writes must parse identically in civetta.
//!
//! Needs `python3` with gguf 0.19.0 and numpy (scripts/test-deps.sh puts them in build/venv); without them the tests fail unless
//! CIVETTA_SKIP_PYTHON=1.

use civetta::gguf::{GgmlType, GgufFile, GgufWriter, MetadataValue as V};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

/// Whether to run: true when python3 with gguf and numpy is usable; false (skip) only when
/// CIVETTA_SKIP_PYTHON=1; panics with instructions otherwise.
fn python_available() -> bool {
    if std::env::var("CIVETTA_SKIP_PYTHON").as_deref() == Ok("1") {
        eprintln!("CIVETTA_SKIP_PYTHON=1: skipping the Python gguf cross-check");
        return false;
    }
    let probe = Command::new("python3").args(["-c", "import gguf, numpy"]).output();
    match probe {
        Ok(out) if out.status.success() => true,
        Ok(out) => panic!(
            "python3 cannot import gguf/numpy ({}): run `make test` (scripts/test-deps.sh installs them into build/venv; `make test` puts build/venv/bin first on PATH), or set CIVETTA_SKIP_PYTHON=1 to skip",
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("").trim()
        ),
        Err(e) => panic!("python3 not found ({e}): run `make test` (scripts/test-deps.sh installs them into build/venv; `make test` puts build/venv/bin first on PATH), or set CIVETTA_SKIP_PYTHON=1 to skip"),
    }
}

fn run_python(args: &[&str]) -> Value {
    let out = Command::new("python3").args(args).output().expect("running python3");
    assert!(out.status.success(), "python3 failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("python printed JSON")
}

/// Reads a GGUF with gguf.GGUFReader and prints keys (with their type-id chain and flattened
/// contents, as GGUFReader reports nested arrays) and tensor infos plus data hashes.
const PY_READ: &str = r#"
import hashlib, json, sys
from gguf import GGUFReader
r = GGUFReader(sys.argv[1])
kv = [[name, [int(t) for t in f.types], f.contents()] for name, f in r.fields.items() if not name.startswith("GGUF.")]
ts = [{"name": t.name, "type": int(t.tensor_type), "dims": [int(d) for d in t.shape], "n_bytes": int(t.n_bytes),
       "data_offset": int(t.data_offset), "sha256": hashlib.sha256(t.data.tobytes()).hexdigest()} for t in r.tensors]
print(json.dumps({"alignment": int(r.alignment), "kv": kv, "tensors": ts}))
"#;

fn scalar_json(v: &V) -> Value {
    match v {
        V::U8(x) => json!(x),
        V::I8(x) => json!(x),
        V::U16(x) => json!(x),
        V::I16(x) => json!(x),
        V::U32(x) => json!(x),
        V::I32(x) => json!(x),
        V::F32(x) => json!(f64::from(*x)),
        V::Bool(x) => json!(x),
        V::String(x) => json!(x),
        V::U64(x) => json!(x),
        V::I64(x) => json!(x),
        V::F64(x) => json!(x),
        V::Array(_) => unreachable!("arrays are flattened first"),
    }
}

/// The type-id chain GGUFReader reports: the value's type, then its first element's, down.
fn type_chain(v: &V) -> Vec<u32> {
    let mut chain = vec![v.type_id()];
    if let V::Array(items) = v {
        if let Some(first) = items.first() {
            chain.extend(type_chain(first));
        }
    }
    chain
}

fn leaves<'a>(v: &'a V, out: &mut Vec<&'a V>) {
    match v {
        V::Array(items) => items.iter().for_each(|i| leaves(i, out)),
        leaf => out.push(leaf),
    }
}

/// How GGUFReader's contents() presents a value: scalars as themselves, arrays flattened.
fn python_view(v: &V) -> Value {
    match v {
        V::Array(_) => {
            let mut l = Vec::new();
            leaves(v, &mut l);
            Value::Array(l.into_iter().map(scalar_json).collect())
        }
        scalar => scalar_json(scalar),
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn gguf_py_reads_what_civetta_writes() {
    if !python_available() {
        return;
    }
    let mut w = GgufWriter::new();
    w.set_alignment(128).unwrap();
    let meta = [
        ("general.architecture", V::String("llama".into())),
        ("u8", V::U8(200)),
        ("i8", V::I8(-100)),
        ("u16", V::U16(60000)),
        ("i16", V::I16(-30000)),
        ("u32", V::U32(u32::MAX)),
        ("i32", V::I32(i32::MIN)),
        ("f32", V::F32(0.1)),
        ("bool", V::Bool(false)),
        ("string", V::String("ünïcødé ✓\n<|im_start|>".into())),
        ("u64", V::U64(u64::MAX)),
        ("i64", V::I64(i64::MIN)),
        ("f64", V::F64(-1e-300)),
        ("tokens", V::Array(vec![V::String("<s>".into()), V::String("Ġa".into()), V::String(String::new())])),
        ("token_type", V::Array(vec![V::I32(3), V::I32(1), V::I32(-1)])),
        ("scores", V::Array(vec![V::F32(-0.5), V::F32(1e-3)])),
        ("u64s", V::Array(vec![V::U64(u64::MAX), V::U64(0)])),
        ("bools", V::Array(vec![V::Bool(true), V::Bool(false)])),
        ("nested", V::Array(vec![V::Array(vec![V::I16(1), V::I16(2)]), V::Array(vec![V::I16(-3)])])),
        ("nested_strings", V::Array(vec![V::Array(vec![V::String("x".into())]), V::Array(vec![V::String("yz".into())])])),
    ];
    for (k, v) in &meta {
        w.add_metadata(k, v.clone());
    }
    let floats: Vec<f32> = (0..48).map(|i| i as f32 * 0.25 - 3.0).collect();
    let mut q8 = vec![0u8; GgmlType::Q8_0.row_bytes(64).unwrap() * 2];
    civetta::quant::quantize_row(GgmlType::Q8_0, &(0..128).map(|i| (i as f32).sin()).collect::<Vec<_>>(), &mut q8).unwrap();
    let tensors: Vec<(&str, Vec<u64>, GgmlType, Vec<u8>)> = vec![
        ("token_embd.weight", vec![16, 3], GgmlType::F32, f32_bytes(&floats)),
        ("blk.0.ffn_up.weight", vec![64, 2], GgmlType::Q8_0, q8),
        ("blk.0.attn_q.weight", vec![8, 2, 2], GgmlType::F16, (0..64).collect()),
        ("blk.0.ffn_down.weight", vec![256], GgmlType::Q4_K, (0..144).map(|i| (i * 7) as u8).collect()),
    ];
    for (name, dims, t, data) in &tensors {
        w.add_tensor(name, dims, *t, data.clone()).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ours.gguf");
    w.write_file(&path).unwrap();
    let ours = GgufFile::open(&path).unwrap();

    let py = run_python(&["-c", PY_READ, path.to_str().unwrap()]);
    assert_eq!(py["alignment"], 128);

    let py_kv = py["kv"].as_array().unwrap();
    let expected_kv: Vec<Value> = ours.metadata.iter().map(|(k, v)| json!([k, type_chain(v), python_view(v)])).collect();
    assert_eq!(ours.metadata.len(), meta.len() + 1, "our reader sees general.alignment too");
    assert_eq!(py_kv.len(), expected_kv.len());
    for (p, e) in py_kv.iter().zip(&expected_kv) {
        assert_eq!(p, e, "metadata differs between gguf-py and civetta");
    }

    let py_tensors = py["tensors"].as_array().unwrap();
    assert_eq!(py_tensors.len(), tensors.len());
    for (p, (t, (name, dims, ty, data))) in py_tensors.iter().zip(ours.tensors.iter().zip(&tensors)) {
        use sha2::Digest;
        assert_eq!(p["name"], *name);
        assert_eq!(p["type"], ty.id());
        assert_eq!(p["dims"], json!(dims));
        assert_eq!(p["n_bytes"], data.len());
        assert_eq!(p["data_offset"], ours.data_offset + t.offset);
        assert_eq!(p["sha256"], hex::encode(sha2::Sha256::digest(data)), "{name} data as gguf-py reads it");
    }
}

#[test]
fn civetta_reads_what_gguf_py_writes() {
    if !python_available() {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/write_gguf_sample.py");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("theirs.gguf");
    let expected = run_python(&[script.to_str().unwrap(), path.to_str().unwrap()]);
    let f = GgufFile::open(&path).unwrap();

    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 64);
    assert_eq!(f.architecture(), Some("civetta-test"));
    let ours: Vec<Value> = f.metadata.iter().map(|(k, v)| json!([k, canonical(v)])).collect();
    let theirs = expected["metadata"].as_array().unwrap();
    assert_eq!(ours.len(), theirs.len(), "keys: {:?}", f.metadata.keys().collect::<Vec<_>>());
    for (o, t) in ours.iter().zip(theirs) {
        assert_eq!(o, t, "metadata written by gguf-py reads back differently");
    }
    assert_eq!(f.get_str_array("tokenizer.ggml.tokens"), Some(vec!["<s>", "</s>", "Ġthe", "▁ok", ""]));
    assert_eq!(f.get_i32_array("tokenizer.ggml.token_type"), Some(vec![3, 3, 1, 1, 6]));
    assert_eq!(f.get_f32_array("tokenizer.ggml.scores"), Some(vec![0.0, -1.5, 2.25]));

    let theirs = expected["tensors"].as_array().unwrap();
    assert_eq!(f.tensors.len(), theirs.len());
    for (t, e) in f.tensors.iter().zip(theirs) {
        use sha2::Digest;
        let name = &t.name;
        assert_eq!(e["name"], *name);
        assert_eq!(e["type"], t.ggml_type.id(), "{name}");
        assert_eq!(e["dims"], json!(t.dims), "{name}");
        assert_eq!(t.offset % 64, 0);
        let data = f.tensor_data(t);
        assert_eq!(e["sha256"], hex::encode(sha2::Sha256::digest(data)), "{name} bytes");

        // Dequantised by civetta's quant module vs gguf.quants.dequantize.
        let want: Vec<f64> = e["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        let row_len = t.dims[0] as usize;
        let row_bytes = t.ggml_type.row_bytes(row_len).unwrap();
        let mut got = vec![0f32; want.len()];
        for (row, out) in data.chunks(row_bytes).zip(got.chunks_mut(row_len)) {
            civetta::quant::dequantize_row(t.ggml_type, row, out).unwrap();
        }
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((f64::from(*g) - w).abs() <= 1e-6 * w.abs().max(1.0), "{name}[{i}]: civetta {g}, gguf-py {w}");
        }
    }
}

/// civetta's MetadataValue in the canonical form write_gguf_sample.py prints.
fn canonical(v: &V) -> Value {
    match v {
        V::Array(items) => json!({ "t": "array", "v": items.iter().map(canonical).collect::<Vec<_>>() }),
        scalar => json!({ "t": scalar.type_name(), "v": scalar_json(scalar) }),
    }
}
