//! Arbitrary bytes through the GGUF parser; whatever parses must also be safe to use.
//! Run: `cargo fuzz run gguf_parse` from the repository root (nightly, or RUSTC_BOOTSTRAP=1).
#![no_main]

use civetta::gguf::{info, GgufFile};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::parse_bytes(data.to_vec(), "fuzz.gguf") else {
        return;
    };
    let mut checksum = 0u64;
    for t in &f.tensors {
        let bytes = f.tensor_data(t);
        assert_eq!(bytes.len() as u64, t.size_bytes);
        checksum = bytes.iter().fold(checksum, |acc, &b| acc.wrapping_mul(31).wrapping_add(b.into()));
        assert!(std::ptr::eq(f.tensor(&t.name).unwrap(), t));
    }
    std::hint::black_box(checksum);
    std::hint::black_box(info::render_info(&f, false));
    std::hint::black_box(info::render_info(&f, true));
    std::hint::black_box(info::info_json(&f));
});
