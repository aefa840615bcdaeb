//! Malformed GGUF input: every truncation, targeted corruptions and random byte flips must
//! give an error (with a message naming the problem), never a panic or a huge allocation.

use civetta::gguf::info::{info_json, render_info};
use civetta::gguf::{GgmlType, GgufFile, GgufWriter, MetadataValue as V};
use proptest::prelude::*;

/// A small valid file exercising every structure the parser has: scalars, strings, arrays,
/// nested arrays, several tensor types. The last tensor's size is a multiple of the
/// alignment, so there is no trailing padding and every proper prefix is truncated.
fn small_valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", V::String("llama".into()));
    w.add_metadata("llama.block_count", V::U32(1));
    w.add_metadata("llama.rope.freq_base", V::F32(10000.0));
    w.add_metadata("flag", V::Bool(true));
    w.add_metadata("big", V::I64(-5));
    w.add_metadata("tokenizer.ggml.tokens", V::Array(vec![V::String("a".into()), V::String("bc".into())]));
    w.add_metadata("tokenizer.ggml.token_type", V::Array(vec![V::I32(1), V::I32(3)]));
    w.add_metadata("nested", V::Array(vec![V::Array(vec![V::U16(1)]), V::Array(vec![])]));
    w.add_tensor("blk.0.ffn_up.weight", &[32, 2], GgmlType::Q8_0, (0..68).collect()).unwrap();
    w.add_tensor("blk.0.attn_q.weight", &[4, 2], GgmlType::F16, vec![7; 16]).unwrap();
    w.add_tensor("output_norm.weight", &[16], GgmlType::F32, vec![9; 64]).unwrap();
    w.to_bytes().unwrap()
}

/// Parses and, on success, touches everything a caller would (tensor bytes, info rendering).
fn parse_and_touch(bytes: Vec<u8>) -> Result<usize, String> {
    let f = GgufFile::parse_bytes(bytes, "fuzz.gguf").map_err(|e| e.to_string())?;
    let data: usize = f.tensors.iter().map(|t| f.tensor_data(t).len()).sum();
    let text = render_info(&f, true);
    let json = info_json(&f);
    Ok(data + text.len() + json.to_string().len())
}

#[test]
fn the_small_file_is_valid() {
    let bytes = small_valid_file();
    let f = GgufFile::parse_bytes(bytes.clone(), "small.gguf").unwrap();
    assert_eq!(f.tensors.len(), 3);
    let last = f.tensors.last().unwrap();
    assert_eq!(f.data_offset + last.offset + last.size_bytes, bytes.len() as u64, "no trailing padding");
}

#[test]
fn truncation_at_every_offset_is_an_error() {
    let bytes = small_valid_file();
    for n in 0..bytes.len() {
        let err = match GgufFile::parse_bytes(bytes[..n].to_vec(), "small.gguf") {
            Ok(_) => panic!("a prefix of {n} of {} bytes parsed", bytes.len()),
            Err(e) => e.to_string(),
        };
        assert!(err.starts_with("small.gguf: "), "{err}");
        assert!(
            ["truncated", "exceeds the", "cannot fit", "past the end of the file"].iter().any(|p| err.contains(p)),
            "prefix {n}: {err}"
        );
    }
}

/// Builds GGUF bytes by hand, independently of GgufWriter, to place corruptions exactly.
#[derive(Clone, Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        Raw::default().bytes(b"GGUF").u32(version).u64(n_tensors).u64(n_kv)
    }
    fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }
    fn u8(self, v: u8) -> Raw {
        self.bytes(&[v])
    }
    fn u32(self, v: u32) -> Raw {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(self, v: u64) -> Raw {
        self.bytes(&v.to_le_bytes())
    }
    fn str(self, s: &[u8]) -> Raw {
        self.u64(s.len() as u64).bytes(s)
    }
    fn kv_u32(self, key: &str, v: u32) -> Raw {
        self.str(key.as_bytes()).u32(4).u32(v)
    }
    fn kv_str(self, key: &str, v: &[u8]) -> Raw {
        self.str(key.as_bytes()).u32(8).str(v)
    }
    fn tensor(self, name: &[u8], dims: &[u64], type_id: u32, offset: u64) -> Raw {
        let mut r = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(type_id).u64(offset)
    }
    fn pad(self, alignment: usize) -> Raw {
        let n = self.0.len().next_multiple_of(alignment) - self.0.len();
        self.bytes(&vec![0; n])
    }
    fn parse_err(self) -> String {
        match GgufFile::parse_bytes(self.0, "model.gguf") {
            Ok(f) => panic!("parsed: {f:?}"),
            Err(e) => e.to_string(),
        }
    }
}

/// One f32 tensor "w" of 8 elements at offset 0 with its 32 data bytes.
fn valid_raw() -> Raw {
    Raw::header(3, 1, 1).kv_str("general.architecture", b"llama").tensor(b"w", &[8], 0, 0).pad(32).bytes(&[1; 32])
}

#[track_caller]
fn assert_err(raw: Raw, expected: &str) {
    let err = raw.parse_err();
    assert!(err.starts_with("model.gguf: "), "{err}");
    assert!(err.contains(expected), "expected {expected:?} in: {err}");
}

#[test]
fn the_hand_built_base_file_is_valid() {
    let f = GgufFile::parse_bytes(valid_raw().0, "model.gguf").unwrap();
    assert_eq!(f.tensor_data(&f.tensors[0]), &[1; 32]);
}

#[test]
fn header_corruptions() {
    let mut bad_magic = valid_raw();
    bad_magic.0[..4].copy_from_slice(b"GGML");
    assert_err(bad_magic, "at byte offset 0: not a GGUF file: magic is \"GGML\"");
    assert_err(Raw::header(1, 0, 0), "at byte offset 4: GGUF version 1 is not supported");
    assert_err(Raw::header(4, 0, 0), "unsupported GGUF version 4 (supported: 2, 3)");
    assert_err(Raw::header(3u32.swap_bytes(), 0, 0), "big-endian GGUF (version 3) is not supported");
    assert_err(Raw::header(3, 1 << 60, 0), "at byte offset 8: tensor count 1152921504606846976 cannot fit");
    assert_err(Raw::header(3, 0, u64::MAX), "at byte offset 16: metadata key/value count 18446744073709551615 cannot fit");
}

#[test]
fn metadata_corruptions() {
    let h = || Raw::header(3, 0, 1);
    assert_err(
        h().u64(u64::MAX).bytes(&[0; 8]),
        "at byte offset 24: string length 18446744073709551615 of metadata key 0 exceeds the 8 bytes left",
    );
    assert_err(h().str(b"k").u32(13).u32(0), "metadata \"k\": unknown value type 13");
    assert_err(h().str(b"k").u32(7).u8(2), "metadata \"k\": bool byte 2 is neither 0 nor 1");
    // 2^60 strings: must be refused before anything is allocated for them.
    assert_err(h().str(b"k").u32(9).u32(8).u64(1 << 60).u64(0), "metadata \"k\": array of 1152921504606846976 elements cannot fit");
    assert_err(h().str(b"k").u32(9).u32(99).u64(0), "metadata \"k\": unknown array element type 99");
    assert_err(h().str(b"k").u32(9).u32(8).u64(2).str(b"ok").u64(1 << 40), "string length 1099511627776 of metadata \"k\"[1] exceeds");
    // Five arrays deep (the limit is four).
    let mut deep = h().str(b"k").u32(9);
    for _ in 0..5 {
        deep = deep.u32(9).u64(1);
    }
    assert_err(deep.u32(4).u64(0), "arrays nested deeper than 4 levels");

    assert_err(h().bytes(&[2, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xfe]).u32(4).u32(0), "metadata key 0 is not valid UTF-8");
    assert_err(h().kv_str("k", b"ab\xc3"), "metadata \"k\" is not valid UTF-8");
    assert_err(Raw::header(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2), "duplicate metadata key \"k\"");
}

#[test]
fn alignment_corruptions() {
    let with_alignment = |a: u32| Raw::header(3, 0, 1).kv_u32("general.alignment", a);
    assert_err(with_alignment(48), "general.alignment 48 is not a power of two");
    assert_err(with_alignment(0), "general.alignment 0 is not a power of two");
    assert_err(Raw::header(3, 0, 1).kv_str("general.alignment", b"32"), "general.alignment is String(\"32\") of type string");
    // A valid non-default alignment moves the data section.
    let f = GgufFile::parse_bytes(
        Raw::header(3, 1, 1).kv_u32("general.alignment", 256).tensor(b"w", &[8], 0, 0).pad(256).bytes(&[1; 32]).0,
        "model.gguf",
    )
    .unwrap();
    assert_eq!((f.alignment, f.data_offset), (256, 256));
}

#[test]
fn tensor_info_corruptions() {
    let t = |name: &[u8], dims: &[u64], type_id: u32, offset: u64| {
        Raw::header(3, 1, 0).tensor(name, dims, type_id, offset).pad(32).bytes(&[0; 64])
    };
    assert_err(t(b"w", &[8], 99, 0), "tensor \"w\" (tensor info 0) has unknown or unsupported ggml type id 99");
    assert_err(t(b"w", &[8], 0, 3), "tensor \"w\": data offset 3 is not aligned to 32");
    assert_err(t(b"w", &[8], 0, 64), "tensor \"w\" data (32 bytes at file offset 128) extends past the end of the file (128 bytes)");
    assert_err(t(b"w", &[33], 8, 0), "tensor \"w\": row length 33 is not a multiple of the q8_0 block size 32");
    assert_err(t(b"w", &[1 << 40, 1 << 40], 0, 0), "dims [1099511627776, 1099511627776] overflow the element count");
    assert_err(t(b"w", &[0, 1 << 40, 1 << 40], 0, 0), "overflow the element count");
    assert_err(t(b"w", &[1 << 62], 0, 0), "overflow the byte size");
    assert_err(t(b"w\xff", &[8], 0, 0), "the name of tensor info 0 is not valid UTF-8");
    assert_err(Raw::header(3, 1, 0).str(b"w").u32(9).bytes(&[0; 64]), "tensor info 0 (\"w\") n_dims: 9 dimensions, expected 1 to 4");
    assert_err(Raw::header(3, 1, 0).str(b"w").u32(0).bytes(&[0; 64]), "0 dimensions, expected 1 to 4");

    let two =
        |second: &[u8], offset: u64| Raw::header(3, 2, 0).tensor(b"a", &[8], 0, 0).tensor(second, &[8], 0, offset).pad(32).bytes(&[0; 64]);
    assert_err(two(b"a", 32), "duplicate tensor name \"a\"");
    assert_err(two(b"b", 0), "tensor data overlap: \"a\" (file bytes 96..128) and \"b\" (file bytes 96..128)");
    GgufFile::parse_bytes(two(b"b", 32).0, "model.gguf").expect("adjacent tensors are fine");
}

#[test]
fn truncation_error_names_offset_tensor_and_field() {
    let before = Raw::header(3, 2, 0).tensor(b"a", &[8], 0, 0).str(b"blk.0.attn_q.weight").u32(2).u64(4);
    let offset = before.0.len();
    let err = before.bytes(&[1, 0, 0]).parse_err();
    assert_eq!(
        err,
        format!(
            "model.gguf: at byte offset {offset}: truncated while reading tensor info 1 (\"blk.0.attn_q.weight\") dims: need 8 bytes, 3 left"
        )
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_byte_flips_never_panic(flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let mut bytes = small_valid_file();
        for (at, x) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= x.max(1);
        }
        let _ = parse_and_touch(bytes);
    }

    #[test]
    fn random_header_flips_and_cuts_never_panic(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = small_valid_file();
        let header_len = GgufFile::parse_bytes(bytes.clone(), "x").unwrap().data_offset as usize;
        for (at, x) in flips {
            let i = at.index(header_len);
            bytes[i] ^= x.max(1);
        }
        bytes.truncate(cut.index(bytes.len() + 1));
        let _ = parse_and_touch(bytes);
    }

    #[test]
    fn arbitrary_bytes_after_a_valid_preamble_never_panic(tail in prop::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = b"GGUF\x03\x00\x00\x00".to_vec();
        bytes.extend(tail);
        let _ = parse_and_touch(bytes);
    }
}

/// Writes the fuzz seed corpus (run by hand: `cargo test --test gguf_malformed -- --ignored`).
#[test]
#[ignore]
fn write_fuzz_seed_corpus() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/gguf_parse");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("small_mixed.gguf"), small_valid_file()).unwrap();
    std::fs::write(dir.join("hand_built_f32.gguf"), valid_raw().0).unwrap();
    let mut w = GgufWriter::new();
    w.set_alignment(64).unwrap();
    w.add_metadata("general.architecture", V::String("qwen3".into()));
    w.add_metadata("x", V::Array(vec![V::F64(1.0), V::F64(2.0)]));
    w.add_tensor("q4k", &[256], GgmlType::Q4_K, vec![3; 144]).unwrap();
    w.add_tensor("bf16", &[3, 2], GgmlType::BF16, vec![5; 12]).unwrap();
    std::fs::write(dir.join("aligned64_q4k_bf16.gguf"), w.to_bytes().unwrap()).unwrap();
    std::fs::write(dir.join("empty_v2.gguf"), Raw::header(2, 0, 0).0).unwrap();
}
