use super::*;

fn trained(vocab: usize) -> Tokenizer {
    let (mut tokens, merges) = train::train_byte_level_bpe(train::CORPUS, vocab);
    let mut types = vec![token_type::NORMAL; tokens.len()];
    for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(s.into());
        types.push(token_type::CONTROL);
    }
    let n = tokens.len() as u32;
    Tokenizer::from_parts(TokenizerParts {
        kind: Some(TokenizerKind::Bpe),
        tokens,
        token_types: types,
        merges,
        pre: "qwen2".into(),
        bos: Some(n - 3),
        eos: Some(n - 1),
        chat_template: Some(CHATML.into()),
        ..Default::default()
    })
    .unwrap()
}

const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const SAMPLES: [&str; 10] = [
    "The capital of France is Paris.",
    "fn main() {\n    println!(\"hi\");\n}\n",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\n\n",
    "emoji 🦉🌊 and CJK 日本語 中文",
    "combining e\u{301} and Å",
    "numbers 1234567 3.14159 -42",
    "",
    "a",
    "unseen wörds like Zyxwvq and ÆØÅ",
];

#[test]
fn bpe_round_trips_and_compresses() {
    let tk = trained(600);
    for s in SAMPLES {
        let ids = tk.encode(s, false, false);
        assert_eq!(tk.decode(&ids), s, "round trip of {s:?}");
    }
    // Trained merges must make common text shorter than its bytes.
    let text = "The capital of France is Paris.";
    assert!(tk.encode(text, false, false).len() < text.len() / 2);
}

#[test]
fn specials_are_parsed_only_when_asked() {
    let tk = trained(400);
    let im_start = tk.token_id("<|im_start|>").unwrap();
    let with = tk.encode("<|im_start|>user", false, true);
    assert_eq!(with[0], im_start);
    let without = tk.encode("<|im_start|>user", false, false);
    assert!(!without.contains(&im_start));
    assert_eq!(tk.decode(&without), "<|im_start|>user");
    // Control tokens decode to nothing.
    assert_eq!(tk.decode(&with), "user");
    assert!(tk.is_eog(tk.token_id("<|im_end|>").unwrap()));
    assert!(tk.is_eog(tk.eos_id().unwrap()));
}

#[test]
fn bos_is_prepended_on_request() {
    let tk = trained(300);
    let ids = tk.encode("hi", true, false);
    assert_eq!(ids[0], tk.bos_id().unwrap());
}

#[test]
fn chatml_template_renders() {
    let tk = trained(300);
    let msgs = vec![
        ChatMessage { role: "system".into(), content: "Be brief.".into() },
        ChatMessage { role: "user".into(), content: "Hi!".into() },
    ];
    let s = tk.apply_chat_template(&msgs, true).unwrap();
    assert_eq!(s, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
}

#[test]
fn llama3_style_template_with_pycompat_methods() {
    let tpl = "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
    let out = chat::render(tpl, &[ChatMessage { role: "user".into(), content: "  Hello  ".into() }], true, "<|begin_of_text|>", "<|eot_id|>").unwrap();
    assert_eq!(out, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    let py = "{{ messages[0]['content'].strip().upper() }}";
    assert_eq!(chat::render(py, &[ChatMessage { role: "user".into(), content: " x ".into() }], false, "", "").unwrap(), "X");
    let err = chat::render("{{ raise_exception('no system role') }}", &[], false, "", "").unwrap_err();
    assert!(format!("{err:#}").contains("no system role"));
}

#[test]
fn missing_template_is_an_error() {
    let (tokens, merges) = train::train_byte_level_bpe("abc abc", 260);
    let tk = Tokenizer::from_parts(TokenizerParts { kind: Some(TokenizerKind::Bpe), tokens, merges, ..Default::default() }).unwrap();
    assert!(tk.apply_chat_template(&[], true).unwrap_err().to_string().contains("no chat template"));
}

#[test]
fn stream_decoder_holds_split_characters() {
    let mut d = StreamDecoder::new();
    let owl = "🦉".as_bytes();
    assert_eq!(d.push(&owl[..1]), "");
    assert_eq!(d.push(&owl[1..3]), "");
    assert_eq!(d.push(&owl[3..]), "🦉");
    assert_eq!(d.push(b"a\xffb"), "a\u{FFFD}b");
    assert_eq!(d.push(&[0xE6]), "");
    assert_eq!(d.finish(), "\u{FFFD}");
}

#[test]
fn pretokenizers_split_like_their_regexes() {
    let q = pretokenize::PreTokenizer::for_name("qwen2");
    assert_eq!(q.split("Hello world 123!!\n\n  x"), vec!["Hello", " world", " ", "1", "2", "3", "!!\n\n", " ", " x"]);
    let l = pretokenize::PreTokenizer::for_name("llama-bpe");
    assert_eq!(l.split("abc 12345"), vec!["abc", " ", "123", "45"]);
    let s = pretokenize::PreTokenizer::for_name("smollm");
    assert_eq!(s.split("a 12"), vec!["a", " ", "1", "2"]);
    let g = pretokenize::PreTokenizer::for_name("gpt-2");
    assert_eq!(g.split("I'm here  now"), vec!["I", "'m", " here", " ", " now"]);
}

#[test]
fn spm_merges_by_score_and_falls_back_to_bytes() {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![token_type::UNKNOWN, token_type::CONTROL, token_type::CONTROL];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(token_type::BYTE);
        scores.push(0.0);
    }
    for (p, s) in [("\u{2581}", -1.0), ("h", -2.0), ("e", -2.0), ("l", -2.0), ("o", -2.0), ("he", -1.5), ("ll", -1.4), ("hell", -1.0), ("\u{2581}hello", -0.5), ("hello", -0.8)] {
        tokens.push(p.into());
        types.push(token_type::NORMAL);
        scores.push(s);
    }
    let tk = Tokenizer::from_parts(TokenizerParts {
        kind: Some(TokenizerKind::Spm),
        tokens,
        scores,
        token_types: types,
        bos: Some(1),
        eos: Some(2),
        ..Default::default()
    })
    .unwrap();
    let ids = tk.encode("hello", true, false);
    assert_eq!(ids[0], 1);
    assert_eq!(tk.piece(ids[1]), "\u{2581}hello");
    assert_eq!(ids.len(), 2);
    // 'z' has no piece: byte fallback.
    let ids = tk.encode("hez", false, false);
    assert!(ids.iter().any(|&i| tk.piece(i) == "<0x7A>"), "{:?}", ids.iter().map(|&i| tk.piece(i)).collect::<Vec<_>>());
    assert_eq!(tk.decode(&tk.encode("hello hez", true, false)), "hello hez");
}
