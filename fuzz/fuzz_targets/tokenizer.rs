//! Arbitrary bytes through the tokenizers the daemon serves with: the byte-level BPE
//! vocabularies of `civetta model synth` (trained by the project on its built-in corpus;
//! Llama 3 and Qwen2 pre-tokenizers, their special tokens) and a SentencePiece vocabulary
//! built from the same trained pieces with byte fallback.
//!
//! Input: the first byte picks the tokenizer (bits 0-1) and the mode (bit 2: text or token
//! ids); the rest is the payload. Checked:
//! - encoding never panics and yields ids inside the vocabulary (with and without special-token
//!   parsing, the way the engine and the Tokenize RPC call it);
//! - `decode(encode(s)) == s` for valid UTF-8 without special-token parsing (SentencePiece:
//!   for text without U+2581, which it uses as its space);
//! - decoding arbitrary ids (in and out of range) never panics, and the streaming decoder the
//!   engine uses gives exactly the text of a one-shot lossy decode of the same bytes.
//!
//! Run: `cargo fuzz run tokenizer` from the repository root (nightly, or RUSTC_BOOTSTRAP=1).
#![no_main]

use civetta::gguf::{GgmlType, GgufFile};
use civetta::synth::{synth_model, SynthSpec};
use civetta::tokenizer::{token_type, ChatMessage, StreamDecoder, Tokenizer, TokenizerKind, TokenizerParts};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

/// The tokenizer of a tiny synthetic model, read back from the GGUF file synth writes.
fn synth_tokenizer(arch: &str) -> Tokenizer {
    let dir = std::env::temp_dir().join(format!("civetta-fuzz-tokenizer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{arch}.gguf"));
    let spec = SynthSpec::preset(arch, GgmlType::Q8_0, "tiny").unwrap();
    synth_model(&spec, &path).unwrap();
    let tk = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    tk
}

/// SentencePiece: <unk>, <s>, </s>, the 256 byte pieces, then the synth BPE pieces spelled
/// with "▁" for spaces, scored by rank (earlier merges score higher).
fn spm_tokenizer(bpe: &Tokenizer) -> Tokenizer {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![token_type::UNKNOWN, token_type::CONTROL, token_type::CONTROL];
    tokens.extend((0..256).map(|b| format!("<0x{b:02X}>")));
    types.extend((0..256).map(|_| token_type::BYTE));
    for id in 0..bpe.vocab_size() as u32 {
        if bpe.is_control(id) {
            continue;
        }
        let Ok(text) = std::str::from_utf8(bpe.token_bytes(id)) else { continue };
        let piece = text.replace(' ', "\u{2581}");
        if !piece.is_empty() && !tokens.contains(&piece) {
            tokens.push(piece);
            types.push(token_type::NORMAL);
        }
    }
    let scores = (0..tokens.len()).map(|i| -(i as f32)).collect();
    Tokenizer::from_parts(TokenizerParts {
        kind: Some(TokenizerKind::Spm),
        tokens,
        scores,
        token_types: types,
        bos: Some(1),
        eos: Some(2),
        unk: Some(0),
        ..Default::default()
    })
    .unwrap()
}

fn tokenizers() -> &'static [Tokenizer; 3] {
    static T: OnceLock<[Tokenizer; 3]> = OnceLock::new();
    T.get_or_init(|| {
        let llama = synth_tokenizer("llama");
        let qwen = synth_tokenizer("qwen2");
        let spm = spm_tokenizer(&qwen);
        [llama, qwen, spm]
    })
}

/// The streaming decoder over the tokens' bytes must agree with a one-shot lossy decode.
fn check_stream(tk: &Tokenizer, ids: &[u32]) {
    let mut dec = StreamDecoder::new();
    let mut streamed = String::new();
    let mut all = Vec::new();
    for &id in ids {
        let b = tk.token_bytes(id);
        all.extend_from_slice(b);
        streamed += &dec.push(b);
    }
    streamed += &dec.finish();
    assert_eq!(streamed, String::from_utf8_lossy(&all), "stream decoder disagrees for {ids:?}");
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, payload)) = data.split_first() else { return };
    let tk = &tokenizers()[(sel & 3) as usize % 3];
    let vocab = tk.vocab_size();
    if sel & 4 == 0 {
        let text = String::from_utf8_lossy(payload);
        let valid = std::str::from_utf8(payload).is_ok();
        // As the engine encodes prompts: special tokens parsed.
        let ids = tk.encode(&text, sel & 8 != 0, true);
        assert!(ids.iter().all(|&i| (i as usize) < vocab));
        check_stream(tk, &ids);
        std::hint::black_box(tk.decode(&ids));
        let plain = tk.encode(&text, false, false);
        assert!(plain.iter().all(|&i| (i as usize) < vocab));
        let back = tk.decode(&plain);
        let round_trips = match tk.kind() {
            TokenizerKind::Bpe => true,
            TokenizerKind::Spm => !text.contains('\u{2581}'),
        };
        if valid && round_trips {
            assert_eq!(back, text, "decode(encode(s)) != s; ids {plain:?}");
        }
        if sel & 16 != 0 {
            let messages = vec![ChatMessage { role: "user".into(), content: text.to_string() }];
            // Templates may reject or trim content; they must not panic.
            if let Ok(rendered) = tk.apply_chat_template(&messages, true) {
                assert!(tk.encode(&rendered, false, true).iter().all(|&i| (i as usize) < vocab));
            }
        }
    } else {
        // Token ids, some past the end of the vocabulary.
        let ids: Vec<u32> =
            payload.chunks(2).map(|c| u16::from_le_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32 % (vocab as u32 + 8)).collect();
        let text = tk.decode(&ids);
        check_stream(tk, &ids);
        for &i in &ids {
            std::hint::black_box(tk.piece(i));
            std::hint::black_box(tk.is_eog(i));
        }
        // What a decode gives is valid UTF-8 and must survive its own round trip.
        if tk.kind() == TokenizerKind::Bpe {
            assert_eq!(tk.decode(&tk.encode(&text, false, false)), text);
        }
    }
});
