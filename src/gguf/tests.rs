//! Round trips through GgufWriter and GgufFile, typed getters and info rendering.

use super::info::{info_json, render_info};
use super::{GgmlType, GgufError, GgufFile, GgufWriter, MetadataValue as V};
use rand::{Rng, SeedableRng};

fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen()).collect()
}

/// Every value type, at the edges of its range, plus arrays and nested arrays.
fn all_metadata() -> Vec<(&'static str, V)> {
    vec![
        ("general.architecture", V::String("llama".into())),
        ("t.u8", V::U8(u8::MAX)),
        ("t.i8", V::I8(i8::MIN)),
        ("t.u16", V::U16(u16::MAX)),
        ("t.i16", V::I16(i16::MIN)),
        ("t.u32", V::U32(u32::MAX)),
        ("t.i32", V::I32(i32::MIN)),
        ("t.f32", V::F32(-1.5e-7)),
        ("t.bool_true", V::Bool(true)),
        ("t.bool_false", V::Bool(false)),
        ("t.string", V::String("héllo\nwörld ✓ {{ '<|im_start|>' }}".into())),
        ("t.empty_string", V::String(String::new())),
        ("t.u64", V::U64(u64::MAX)),
        ("t.i64", V::I64(i64::MIN)),
        ("t.f64", V::F64(std::f64::consts::PI)),
        ("t.strings", V::Array(vec![V::String("a".into()), V::String(String::new()), V::String("Ġthe".into())])),
        ("t.i32s", V::Array(vec![V::I32(1), V::I32(-2), V::I32(3)])),
        ("t.u8s", V::Array((0..=255).map(V::U8).collect())),
        ("t.f32s", V::Array(vec![V::F32(0.5), V::F32(-0.0), V::F32(f32::MAX)])),
        ("t.f64s", V::Array(vec![V::F64(1e300), V::F64(-2.25)])),
        ("t.bools", V::Array(vec![V::Bool(true), V::Bool(false)])),
        ("t.u64s", V::Array(vec![V::U64(0), V::U64(1 << 63)])),
        ("t.empty_u32s", V::Array(vec![])),
        ("t.nested", V::Array(vec![V::Array(vec![V::I32(1), V::I32(2)]), V::Array(vec![]), V::Array(vec![V::I32(3)])])),
        ("t.nested_strings", V::Array(vec![V::Array(vec![V::Array(vec![V::String("deep".into())])])])),
    ]
}

fn writer_with(metadata: &[(&str, V)]) -> GgufWriter {
    let mut w = GgufWriter::new();
    for (k, v) in metadata {
        w.add_metadata(k, v.clone());
    }
    w
}

fn parse(w: &GgufWriter) -> GgufFile {
    GgufFile::parse_bytes(w.to_bytes().unwrap(), "test.gguf").unwrap()
}

#[test]
fn metadata_round_trips_every_type_in_order() {
    let meta = all_metadata();
    let f = parse(&writer_with(&meta));
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 32);
    let got: Vec<(&str, &V)> = f.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let want: Vec<(&str, &V)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    assert_eq!(got, want);
}

#[test]
fn nan_floats_round_trip_bit_exactly() {
    let nan = f32::from_bits(0x7fc0_1234);
    let f = parse(&writer_with(&[("x", V::F32(nan)), ("y", V::F64(f64::NEG_INFINITY))]));
    match f.get("x") {
        Some(V::F32(x)) => assert_eq!(x.to_bits(), 0x7fc0_1234),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(f.get("y"), Some(&V::F64(f64::NEG_INFINITY)));
}

#[test]
fn typed_getters_convert_only_when_the_value_fits() {
    let f = parse(&writer_with(&[
        ("general.architecture", V::String("qwen3".into())),
        ("small", V::U8(7)),
        ("big", V::U64(u64::MAX)),
        ("neg", V::I32(-1)),
        ("i64_fits", V::I64(1 << 40)),
        ("f64", V::F64(0.25)),
        ("flag", V::Bool(true)),
        ("words", V::Array(vec![V::String("x".into()), V::String("y".into())])),
        ("mixed_nested", V::Array(vec![V::Array(vec![V::String("x".into())])])),
        ("types", V::Array(vec![V::I32(1), V::I32(-6)])),
        ("too_big_for_i32", V::Array(vec![V::U32(u32::MAX)])),
        ("floats", V::Array(vec![V::F32(1.5), V::F32(-2.5)])),
    ]));
    assert_eq!(f.architecture(), Some("qwen3"));
    assert_eq!(f.get_u32("small"), Some(7));
    assert_eq!(f.get_u64("small"), Some(7));
    assert_eq!(f.get_u64("big"), Some(u64::MAX));
    assert_eq!(f.get_u32("big"), None, "u64::MAX does not fit a u32");
    assert_eq!(f.get_u32("neg"), None, "negative values are not unsigned");
    assert_eq!(f.get_u64("i64_fits"), Some(1 << 40));
    assert_eq!(f.get_u32("i64_fits"), None);
    assert_eq!(f.get_f32("f64"), Some(0.25));
    assert_eq!(f.get_u32("f64"), None, "floats are not integers");
    assert_eq!(f.get_bool("flag"), Some(true));
    assert_eq!(f.get_bool("small"), None);
    assert_eq!(f.get_str("general.architecture"), Some("qwen3"));
    assert_eq!(f.get_str("small"), None);
    assert_eq!(f.get_str_array("words"), Some(vec!["x", "y"]));
    assert_eq!(f.get_str_array("mixed_nested"), None);
    assert_eq!(f.get_str_array("general.architecture"), None);
    assert_eq!(f.get_i32_array("types"), Some(vec![1, -6]));
    assert_eq!(f.get_i32_array("too_big_for_i32"), None);
    assert_eq!(f.get_f32_array("floats"), Some(vec![1.5, -2.5]));
    assert_eq!(f.get_f32_array("types"), Some(vec![1.0, -6.0]));
    assert_eq!(f.get("missing"), None);
    assert_eq!(f.get_u32("missing"), None);
}

/// (name, ggml dims, type) covering float and block-quantised layouts.
fn sample_tensors() -> Vec<(&'static str, Vec<u64>, GgmlType)> {
    vec![
        ("token_embd.weight", vec![64, 3], GgmlType::F32),
        ("blk.0.attn_q.weight", vec![64, 2, 1], GgmlType::F16),
        ("blk.0.ffn_up.weight", vec![96, 5], GgmlType::Q8_0),
        ("blk.0.ffn_down.weight", vec![256, 2], GgmlType::Q4_K),
        ("blk.0.attn_v.weight", vec![512, 1, 1, 1], GgmlType::Q6_K),
        ("output_norm.weight", vec![7], GgmlType::BF16),
        ("blk.0.attn_k.weight", vec![32, 3], GgmlType::Q4_0),
    ]
}

fn expected_bytes(dims: &[u64], t: GgmlType) -> usize {
    t.row_bytes(dims[0] as usize).unwrap() * dims[1..].iter().product::<u64>() as usize
}

fn writer_with_tensors(alignment: Option<u32>) -> (GgufWriter, Vec<Vec<u8>>) {
    let mut w = GgufWriter::new();
    if let Some(a) = alignment {
        w.set_alignment(a).unwrap();
    }
    w.add_metadata("general.architecture", V::String("llama".into()));
    let mut datas = Vec::new();
    for (i, (name, dims, t)) in sample_tensors().into_iter().enumerate() {
        let data = random_bytes(i as u64, expected_bytes(&dims, t));
        w.add_tensor(name, &dims, t, data.clone()).unwrap();
        datas.push(data);
    }
    (w, datas)
}

fn check_tensors(f: &GgufFile, datas: &[Vec<u8>]) {
    let samples = sample_tensors();
    assert_eq!(f.tensors.len(), samples.len());
    for ((t, (name, dims, ty)), data) in f.tensors.iter().zip(&samples).zip(datas) {
        assert_eq!(t.name, *name);
        assert_eq!(&t.dims, dims);
        assert_eq!(t.ggml_type, *ty);
        assert_eq!(t.size_bytes as usize, data.len());
        assert_eq!(t.offset % f.alignment, 0, "{name} offset {} unaligned", t.offset);
        assert_eq!((f.data_offset + t.offset) % f.alignment, 0);
        assert_eq!(f.tensor_data(t), &data[..], "{name} data");
        assert_eq!(f.tensor(name).map(|x| &x.name), Some(&t.name));
    }
    assert!(f.tensor("missing").is_none());
}

#[test]
fn tensors_of_several_types_round_trip() {
    let (w, datas) = writer_with_tensors(None);
    let f = parse(&w);
    assert_eq!(f.alignment, 32);
    check_tensors(&f, &datas);
    assert_eq!(f.tensor_index("blk.0.ffn_up.weight"), Some(2));
    assert_eq!(f.tensor("blk.0.attn_q.weight").unwrap().n_elements(), 128);
}

#[test]
fn non_default_alignments_round_trip() {
    for alignment in [1u32, 8, 64, 4096] {
        let (w, datas) = writer_with_tensors(Some(alignment));
        let f = parse(&w);
        assert_eq!(f.alignment, alignment as u64);
        assert_eq!(f.data_offset % alignment as u64, 0);
        assert_eq!(f.get_u32("general.alignment"), Some(alignment));
        check_tensors(&f, &datas);
    }
}

#[test]
fn version_2_files_are_accepted() {
    let (w, datas) = writer_with_tensors(None);
    let mut bytes = w.to_bytes().unwrap();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let f = GgufFile::parse_bytes(bytes, "v2.gguf").unwrap();
    assert_eq!(f.version, 2);
    check_tensors(&f, &datas);
}

#[test]
fn writer_rejects_inconsistent_tensors_and_metadata() {
    let mut w = GgufWriter::new();
    let err = |r: anyhow::Result<()>| r.unwrap_err().to_string();
    assert!(err(w.add_tensor("a", &[4, 2], GgmlType::F32, vec![0; 31])).contains("expected 32"));
    assert!(err(w.add_tensor("a", &[], GgmlType::F32, vec![])).contains("0 dimensions"));
    assert!(err(w.add_tensor("a", &[1, 1, 1, 1, 1], GgmlType::F32, vec![0; 4])).contains("5 dimensions"));
    assert!(err(w.add_tensor("a", &[33], GgmlType::Q8_0, vec![0; 34])).contains("block size 32"));
    assert!(err(w.add_tensor("a", &[32, u64::MAX], GgmlType::Q8_0, vec![])).contains("overflow"));
    w.add_tensor("a", &[4], GgmlType::F32, vec![0; 16]).unwrap();
    assert!(err(w.add_tensor("a", &[4], GgmlType::F32, vec![0; 16])).contains("already added"));
    assert!(err(w.set_alignment(48)).contains("not a power of two"));

    w.add_metadata("mixed", V::Array(vec![V::U8(1), V::I8(1)]));
    let e = w.to_bytes().unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("mixes u8 and i8"), "{e}");

    w.add_metadata("mixed", V::Array(vec![V::Array(vec![V::Array(vec![V::Array(vec![V::Array(vec![])])])])]));
    assert!(w.to_bytes().unwrap_err().to_string().contains("nested deeper"));

    w.add_metadata("mixed", V::U8(0));
    w.add_metadata("general.alignment", V::U32(12));
    assert!(w.to_bytes().unwrap_err().to_string().contains("general.alignment"));
}

#[test]
fn replacing_a_key_keeps_one_entry() {
    let mut w = GgufWriter::new();
    w.add_metadata("k", V::U32(1));
    w.add_metadata("other", V::U32(2));
    w.add_metadata("k", V::String("two".into()));
    let f = parse(&w);
    assert_eq!(f.metadata.len(), 2);
    assert_eq!(f.get_str("k"), Some("two"));
}

#[test]
fn open_maps_a_file_and_hashes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    let (w, datas) = writer_with_tensors(Some(64));
    w.write_file(&path).unwrap();
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers, vec![std::ffi::OsString::from("model.gguf")], "temporary file left behind");

    let f = GgufFile::open(&path).unwrap();
    check_tensors(&f, &datas);
    // The huge-page copy (engine.weights_memory = "huge_pages") reads the same file.
    let copied = GgufFile::open_with(&path, crate::gguf::WeightsMemory::HugePages).unwrap();
    check_tensors(&copied, &datas);
    assert_eq!(copied.sha256_hex(), f.sha256_hex());
    assert!(GgufFile::open_in_huge_pages(dir.path()).unwrap_err().to_string().contains("not a regular file"));
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(f.file_bytes(), bytes.len() as u64);
    use sha2::Digest;
    assert_eq!(f.sha256_hex(), hex::encode(sha2::Sha256::digest(&bytes)));
    assert_eq!(f.sha256_hex().len(), 64);

    let missing = GgufFile::open(dir.path().join("nope.gguf")).unwrap_err();
    assert!(matches!(missing, GgufError::Io { .. }));
    assert!(missing.to_string().contains("nope.gguf"), "{missing}");

    let not_a_file = GgufFile::open(dir.path()).unwrap_err().to_string();
    assert!(not_a_file.contains("not a regular file"), "{not_a_file}");

    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let e = GgufFile::open(&empty).unwrap_err().to_string();
    assert!(e.contains("empty.gguf: at byte offset 0: truncated while reading the magic"), "{e}");
}

#[test]
fn info_abbreviates_long_values_unless_asked_for_all() {
    let mut w = writer_with(&[
        ("general.architecture", V::String("llama".into())),
        ("tokenizer.ggml.tokens", V::Array((0..100).map(|i| V::String(format!("tok{i}"))).collect())),
        ("tokenizer.chat_template", V::String("x".repeat(500))),
    ]);
    w.add_tensor("a.weight", &[32, 2], GgmlType::Q8_0, vec![0; 68]).unwrap();
    w.add_tensor("b.weight", &[8], GgmlType::F32, vec![0; 32]).unwrap();
    w.add_tensor("c.weight", &[4, 4], GgmlType::F32, vec![0; 64]).unwrap();
    let f = parse(&w);

    let short = render_info(&f, false);
    assert!(short.contains("[string; 100] [\"tok0\", \"tok1\", \"tok2\", \"tok3\", …]"), "{short}");
    assert!(!short.contains("tok99"));
    assert!(short.contains("(500 bytes)"));
    assert!(short.contains("a.weight") && short.contains("q8_0") && short.contains("[32, 2]"));
    assert!(short.contains("total: 3 tensors, 88 parameters"), "{short}");
    assert!(short.contains("GGUF v3, alignment 32"));

    let full = render_info(&f, true);
    assert!(full.contains("\"tok99\"]"));
    assert!(full.contains(&"x".repeat(500)));

    let j = info_json(&f);
    assert_eq!(j["version"], 3);
    assert_eq!(j["architecture"], "llama");
    assert_eq!(j["metadata"]["tokenizer.ggml.tokens"]["value"]["len"], 100);
    assert_eq!(j["metadata"]["tokenizer.ggml.tokens"]["value"]["head"][1], "tok1");
    assert_eq!(j["tensors"][0]["dims"], serde_json::json!([32, 2]));
    // 68 bytes of q8_0 padded to 96, then 32 bytes of f32.
    assert_eq!(j["tensors"][1]["offset"], 96);
    assert_eq!(j["tensors"][2]["offset"], 128);
    assert_eq!(j["tensor_types"]["f32"]["tensors"], 2);
    assert_eq!(j["tensor_types"]["f32"]["parameters"], 24);
    assert_eq!(j["total_parameters"], 88);
}

#[test]
fn releasing_a_tensors_pages_keeps_its_bytes() {
    // 64 KiB of data: whole pages inside the tensor, which release_tensor_pages drops from a
    // file map (they fault back in from the file) and leaves alone in the huge-page copy.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.gguf");
    let data: Vec<u8> = (0..65536u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let mut w = GgufWriter::new();
    w.add_tensor("head", &[64], GgmlType::F32, vec![7u8; 256]).unwrap();
    w.add_tensor("big", &[16384], GgmlType::F32, data.clone()).unwrap();
    w.write_file(&path).unwrap();
    for memory in [crate::gguf::WeightsMemory::Mmap, crate::gguf::WeightsMemory::HugePages] {
        let f = GgufFile::open_with(&path, memory).unwrap();
        let big = f.tensors.iter().find(|t| t.name == "big").unwrap().clone();
        assert_eq!(f.tensor_data(&big), &data[..]);
        f.release_tensor_pages(&big);
        assert_eq!(f.tensor_data(&big), &data[..], "{memory:?}: bytes after the release");
        let head = f.tensors.iter().find(|t| t.name == "head").unwrap();
        assert_eq!(f.tensor_data(head), &[7u8; 256][..]);
    }
}
