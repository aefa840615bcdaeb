use super::*;
use std::collections::HashMap;

fn trained_parts(vocab: usize) -> TokenizerParts {
    let (mut tokens, merges) = train::train_byte_level_bpe(train::CORPUS, vocab);
    let mut types = vec![token_type::NORMAL; tokens.len()];
    for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(s.into());
        types.push(token_type::CONTROL);
    }
    let n = tokens.len() as u32;
    TokenizerParts {
        kind: Some(TokenizerKind::Bpe),
        tokens,
        token_types: types,
        merges,
        pre: "qwen2".into(),
        bos: Some(n - 3),
        eos: Some(n - 1),
        chat_template: Some(CHATML.into()),
        ..Default::default()
    }
}

fn trained(vocab: usize) -> Tokenizer {
    Tokenizer::from_parts(trained_parts(vocab)).unwrap()
}

const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Strings that stress pre-tokenization and byte handling.
const SAMPLES: &[&str] = &[
    "The capital of France is Paris.",
    "fn main() {\n    println!(\"hi\");\n}\n",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\n\n \n\t\t\n",
    "                 a long run of spaces, then \t\t\t\t tabs",
    "emoji 🦉🌊 and CJK 日本語 中文, 한국어",
    "family emoji 👨‍👩‍👧‍👦 and flags 🇮🇹🇯🇵",
    "combining e\u{301} and A\u{30A} vs Å, Z\u{335}\u{31b}a\u{336}",
    "numbers 1234567 3.14159 -42 1,000,000 ١٢٣ ⅷ",
    "",
    "a",
    " ",
    "\n",
    "unseen wörds like Zyxwvq and ÆØÅ",
    "replacement char \u{FFFD}, nul \0, bell \u{7}, del \u{7f}, bom \u{feff}, zwsp \u{200b}",
    "right-to-left: שלום עולם and مرحبا بالعالم",
    "contractions: I'm, you're, they've, we'd, it'll, IT'S, 'RE, ''",
    "<|im_start|>not parsed unless asked<|im_end|>",
    "mixed\u{2028}line\u{2029}separators\u{85}and\u{a0}nbsp",
];

/// An independent reference BPE: HF's classic loop on strings (merge the lowest-ranked pair
/// everywhere, repeat), on the same pre-tokenized words.
fn reference_encode(tk: &Tokenizer, merges: &[String], text: &str) -> Vec<u32> {
    let ranks: HashMap<(String, String), usize> = merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let (a, b) = m.split_once(' ').unwrap();
            ((a.to_string(), b.to_string()), i)
        })
        .collect();
    let mut out = Vec::new();
    for word in tk.pre_splitter.split(text) {
        let mut syms: Vec<String> = bpe::bytes_to_token_text(word.as_bytes()).chars().map(String::from).collect();
        loop {
            let best =
                syms.windows(2).filter_map(|p| ranks.get(&(p[0].clone(), p[1].clone())).map(|&r| (r, p[0].clone(), p[1].clone()))).min();
            let Some((_, a, b)) = best else { break };
            let mut merged = Vec::with_capacity(syms.len());
            let mut i = 0;
            while i < syms.len() {
                if i + 1 < syms.len() && syms[i] == a && syms[i + 1] == b {
                    merged.push(format!("{a}{b}"));
                    i += 2;
                } else {
                    merged.push(syms[i].clone());
                    i += 1;
                }
            }
            syms = merged;
        }
        out.extend(syms.iter().map(|s| tk.token_id(s).expect("trained merges only build vocabulary entries")));
    }
    out
}

#[test]
fn training_is_deterministic_and_well_formed() {
    let (vocab, merges) = train::train_byte_level_bpe(train::CORPUS, 700);
    assert_eq!((vocab.clone(), merges.clone()), train::train_byte_level_bpe(train::CORPUS, 700));
    assert_eq!(vocab.len(), 700);
    for b in 0..=255u8 {
        assert_eq!(vocab[b as usize], bpe::bytes_to_token_text(&[b]));
    }
    let unique: std::collections::HashSet<&String> = vocab.iter().collect();
    assert_eq!(unique.len(), vocab.len(), "duplicate vocabulary entries");
    for m in &merges {
        let (a, b) = m.split_once(' ').unwrap();
        assert!(vocab.contains(&format!("{a}{b}")), "merge {m:?} builds no token");
    }
    // The first merge is the corpus's most frequent pair: "Ġ" + "t" (as in " the").
    assert_eq!(merges[0], "Ġ t");
    // Small vocabularies still hold every byte.
    assert_eq!(train::train_byte_level_bpe("abc", 10).0.len(), 256);
}

#[test]
fn bpe_round_trips_and_matches_the_reference_loop() {
    let parts = trained_parts(800);
    let merges = parts.merges.clone();
    let tk = Tokenizer::from_parts(parts).unwrap();
    for s in SAMPLES {
        let ids = tk.encode(s, false, false);
        assert_eq!(tk.decode(&ids), *s, "round trip of {s:?}");
        assert_eq!(ids, reference_encode(&tk, &merges, s), "merges of {s:?}");
    }
    // Corpus lines too (many distinct words).
    for line in train::CORPUS.lines().take(200) {
        assert_eq!(tk.encode(line, false, false), reference_encode(&tk, &merges, line), "{line:?}");
    }
}

#[test]
fn trained_vocabulary_compresses_its_corpus() {
    let ratio = |vocab: usize| {
        let tk = trained(vocab);
        let ids = tk.encode(train::CORPUS, false, false);
        assert_eq!(tk.decode(&ids), train::CORPUS);
        ids.len() as f64 / train::CORPUS.len() as f64
    };
    let (small, large) = (ratio(512), ratio(1024));
    // More merges, fewer tokens; 768 merges on this corpus give well under half a token per byte.
    assert!(large < small && small < 0.6 && large < 0.45, "tokens per byte: {small} at 512, {large} at 1024");
}

#[test]
fn merges_through_non_vocabulary_symbols_still_apply() {
    // "a b" builds "ab", which is not in the vocabulary, then "ab c" builds "abc", which is.
    let tokens: Vec<String> = ["a", "b", "c", "abc"].iter().map(|s| s.to_string()).collect();
    let tk = Tokenizer::from_parts(TokenizerParts {
        kind: Some(TokenizerKind::Bpe),
        tokens,
        merges: vec!["a b".into(), "ab c".into()],
        pre: "gpt-2".into(),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(tk.encode("abc", false, false), vec![3]);
    // A word that stops at "ab" falls back to byte tokens.
    assert_eq!(tk.encode("ab", false, false), vec![0, 1]);
    // Bytes without a token are dropped rather than panicking.
    assert_eq!(tk.encode("abz", false, false), vec![0, 1]);
}

#[test]
fn specials_are_parsed_only_when_asked() {
    let tk = trained(400);
    let im_start = tk.token_id("<|im_start|>").unwrap();
    let im_end = tk.token_id("<|im_end|>").unwrap();
    let with = tk.encode("<|im_start|>user\nhi<|im_end|>", false, true);
    let mut expected = vec![im_start];
    expected.extend(tk.encode("user\nhi", false, false));
    expected.push(im_end);
    assert_eq!(with, expected);
    let without = tk.encode("<|im_start|>user", false, false);
    assert!(!without.contains(&im_start));
    assert_eq!(tk.decode(&without), "<|im_start|>user");
    // Control tokens contribute no text.
    assert_eq!(tk.decode(&with), "user\nhi");
    assert!(tk.token_bytes(im_start).is_empty());
    assert!(tk.is_control(im_start) && !tk.is_control(0));
    assert!(tk.is_eog(im_end));
    assert!(tk.is_eog(tk.eos_id().unwrap()));
    assert!(tk.is_eog(tk.token_id("<|endoftext|>").unwrap()));
    assert!(!tk.is_eog(im_start));
}

/// gpt-oss's harmony tokens: <|return|> and <|call|> end generation, <|end|> (which closes
/// the analysis message too) does not; without <|return|>/<|call|> <|end|> stays an end (Phi-3).
#[test]
fn harmony_ends_on_return_and_call_not_end() {
    let mut parts = trained_parts(300);
    for t in ["<|start|>", "<|end|>", "<|return|>", "<|call|>"] {
        parts.tokens.push(t.into());
        parts.token_types.push(token_type::CONTROL);
    }
    let tk = Tokenizer::from_parts(parts).unwrap();
    let id = |t: &str| tk.token_id(t).unwrap();
    assert!(tk.is_eog(id("<|return|>")) && tk.is_eog(id("<|call|>")));
    assert!(!tk.is_eog(id("<|end|>")) && !tk.is_eog(id("<|start|>")));

    let mut phi = trained_parts(300);
    phi.tokens.push("<|end|>".into());
    phi.token_types.push(token_type::CONTROL);
    let tk = Tokenizer::from_parts(phi).unwrap();
    assert!(tk.is_eog(tk.token_id("<|end|>").unwrap()));
}

#[test]
fn user_defined_tokens_are_always_split_out() {
    let mut parts = trained_parts(300);
    parts.tokens.push("<tool>".into());
    parts.token_types.push(token_type::USER_DEFINED);
    let tk = Tokenizer::from_parts(parts).unwrap();
    let tool = tk.token_id("<tool>").unwrap();
    let ids = tk.encode("x<tool>y", false, false);
    assert!(ids.contains(&tool));
    // User-defined tokens are text: they decode to themselves.
    assert_eq!(tk.decode(&ids), "x<tool>y");
}

#[test]
fn longest_special_wins() {
    let mut parts = trained_parts(300);
    for t in ["<|a|>", "<|a|><|b|>"] {
        parts.tokens.push(t.into());
        parts.token_types.push(token_type::CONTROL);
    }
    let tk = Tokenizer::from_parts(parts).unwrap();
    let (a, ab) = (tk.token_id("<|a|>").unwrap(), tk.token_id("<|a|><|b|>").unwrap());
    assert_eq!(tk.encode("<|a|><|b|><|a|>", false, true), vec![ab, a]);
}

#[test]
fn bos_and_defaults() {
    let tk = trained(300);
    let ids = tk.encode("hi", true, false);
    assert_eq!(ids[0], tk.bos_id().unwrap());
    assert_eq!(&ids[1..], tk.encode("hi", false, false).as_slice());
    assert_eq!(tk.kind(), TokenizerKind::Bpe);
    assert_eq!(tk.pre_tokenizer(), "qwen2");
    assert!(!tk.add_bos_default());
    let mut llama = trained_parts(300);
    llama.pre = "llama-bpe".into();
    assert!(Tokenizer::from_parts(llama).unwrap().add_bos_default(), "llama.cpp adds BOS for Llama 3 vocabularies");
}

#[test]
fn bad_parts_are_errors() {
    let mut p = trained_parts(300);
    p.bos = Some(1_000_000);
    assert!(Tokenizer::from_parts(p).unwrap_err().to_string().contains("outside the vocabulary"));
    let mut p = trained_parts(300);
    p.token_types.pop();
    assert!(Tokenizer::from_parts(p).is_err());
    assert!(Tokenizer::from_parts(TokenizerParts { kind: Some(TokenizerKind::Bpe), ..Default::default() }).is_err());
    assert!(Tokenizer::from_parts(TokenizerParts { tokens: vec!["a".into()], ..Default::default() }).is_err());
}

#[test]
fn chatml_template_renders() {
    let tk = trained(300);
    let msgs = vec![
        ChatMessage { role: "system".into(), content: "Be brief.".into() },
        ChatMessage { role: "user".into(), content: "Hi!".into() },
        ChatMessage { role: "assistant".into(), content: "Hello.".into() },
        ChatMessage { role: "user".into(), content: "Bye.".into() },
    ];
    let s = tk.apply_chat_template(&msgs, true).unwrap();
    assert_eq!(
        s,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye.<|im_end|>\n<|im_start|>assistant\n"
    );
    let no_prompt = tk.apply_chat_template(&msgs[..2], false).unwrap();
    assert_eq!(no_prompt, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n");
}

/// The shape of Qwen2.5's template (multi-line, whitespace-controlled): a default system
/// prompt when none is given, loop variables, a namespace and `tojson`.
#[test]
fn qwen_style_template_features() {
    let tpl = r#"{%- set ns = namespace(turns=0) %}
{%- if messages[0]['role'] != 'system' %}
    {{- '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- set ns.turns = ns.turns + 1 %}
    {{- '<|im_start|>' + message.role + '\n' + message.content | trim + '<|im_end|>' }}
    {%- if not loop.last %}{{- '\n' }}{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '\n<|im_start|>assistant\n' }}
{%- endif %}
{{- ns.turns }}{{ {'k': [1, 'x']} | tojson }}"#;
    let msgs = [
        ChatMessage { role: "user".into(), content: " What is 2+2? ".into() },
        ChatMessage { role: "assistant".into(), content: "4".into() },
    ];
    let out = chat::render(tpl, &msgs, true, "", "<|im_end|>").unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>assistant\n2{\"k\": [1, \"x\"]}"
    );
}

#[test]
fn llama3_style_template_with_pycompat_methods() {
    let tpl = r#"{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + strftime_now("%d %b %Y") + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'].strip() + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"#;
    let msgs = [
        ChatMessage { role: "system".into(), content: "Answer in French. ".into() },
        ChatMessage { role: "user".into(), content: "  Hello  ".into() },
        ChatMessage { role: "assistant".into(), content: "Bonjour".into() },
        ChatMessage { role: "user".into(), content: "Thanks".into() },
    ];
    let out = chat::render(tpl, &msgs, true, "<|begin_of_text|>", "<|eot_id|>").unwrap();
    let date = chat::today("%d %b %Y");
    assert_eq!(
        out,
        format!(
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: {date}\n\nAnswer in French.<|eot_id|>\
<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nBonjour<|eot_id|>\
<|start_header_id|>user<|end_header_id|>\n\nThanks<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        )
    );
    let py = "{{ messages[0]['content'].strip().upper() }}|{{ 'a,b'.split(',') | join('-') }}|{% if 'Hi'.startswith('H') %}yes{% endif %}";
    assert_eq!(chat::render(py, &[ChatMessage { role: "user".into(), content: " x ".into() }], false, "", "").unwrap(), "X|a-b|yes");
    let err = chat::render("{{ raise_exception('no system role') }}", &[], false, "", "").unwrap_err();
    assert!(format!("{err:#}").contains("no system role"));
}

/// gpt-oss's harmony template (the real files' tokenizer.chat_template) renders through
/// minijinja exactly as through jinja2 in HF transformers' setup: tests/fixtures/chat/
/// gpt-oss-harmony.json, made by scripts/harmony_template_reference.py (the date is the
/// fixture's fixed one there, today's here).
#[test]
fn gpt_oss_harmony_template_renders_as_jinja2() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat/gpt-oss-harmony.json");
    let f: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let tpl = f["template"].as_str().unwrap();
    let today = chat::today("%Y-%m-%d");
    let cases = f["cases"].as_array().unwrap();
    assert!(cases.len() >= 3);
    for (i, case) in cases.iter().enumerate() {
        let msgs: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let add = case["add_generation_prompt"].as_bool().unwrap();
        let expected = case["expected"].as_str().unwrap().replace(f["fixed_date"].as_str().unwrap(), &today);
        let out = chat::render(tpl, &msgs, add, "<|startoftext|>", "<|return|>").unwrap();
        assert_eq!(out, expected, "case {i}");
    }
}

#[test]
fn missing_or_broken_template_is_an_error() {
    let (tokens, merges) = train::train_byte_level_bpe("abc abc", 260);
    let tk = Tokenizer::from_parts(TokenizerParts { kind: Some(TokenizerKind::Bpe), tokens, merges, ..Default::default() }).unwrap();
    assert!(tk.apply_chat_template(&[], true).unwrap_err().to_string().contains("no chat template"));
    assert!(chat::render("{% for %}", &[], true, "", "").is_err());
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
    assert_eq!(d.finish(), "");
}

#[test]
fn stream_decoder_reassembles_tokens_split_mid_character() {
    // A small vocabulary has no multi-byte merges for these, so characters span tokens.
    let tk = trained(300);
    let text = "owl 🦉, 日本語 and e\u{301}!";
    let ids = tk.encode(text, false, false);
    let split_somewhere = ids.iter().any(|&i| std::str::from_utf8(tk.token_bytes(i)).is_err());
    assert!(split_somewhere, "the test needs a token that is not valid UTF-8 alone");
    let mut d = StreamDecoder::new();
    let mut out = String::new();
    for &i in &ids {
        let piece = d.push(tk.token_bytes(i));
        assert!(!piece.contains('\u{FFFD}'), "partial character emitted after {:?}", tk.piece(i));
        out.push_str(&piece);
    }
    out.push_str(&d.finish());
    assert_eq!(out, text);
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
    assert_eq!(g.split("I'm here  now\t\tx"), vec!["I", "'m", " here", " ", " now", "\t", "\t", "x"]);
    // Unknown names fall back to GPT-2.
    let u = pretokenize::PreTokenizer::for_name("no-such-pre");
    assert_eq!(u.split("I'm 12"), vec!["I", "'m", " 12"]);
    for pre in ["default", "falcon", "deepseek-llm", "deepseek-coder", "qwen35", "starcoder"] {
        let p = pretokenize::PreTokenizer::for_name(pre);
        for sample in SAMPLES {
            assert_eq!(p.split(sample).concat(), *sample, "{pre} lost text of {sample:?}");
        }
    }
}

fn spm_vocab(add_space_prefix: Option<bool>) -> Tokenizer {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![token_type::UNKNOWN, token_type::CONTROL, token_type::CONTROL];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(token_type::BYTE);
        scores.push(0.0);
    }
    for (p, s) in [
        ("\u{2581}", -1.0),
        ("h", -2.0),
        ("e", -2.0),
        ("l", -2.0),
        ("o", -2.0),
        ("he", -1.5),
        ("ll", -1.4),
        ("hell", -1.0),
        ("\u{2581}hello", -0.5),
        ("hello", -0.8),
        ("\u{2581}\u{2581}", -3.0),
    ] {
        tokens.push(p.into());
        types.push(token_type::NORMAL);
        scores.push(s);
    }
    Tokenizer::from_parts(TokenizerParts {
        kind: Some(TokenizerKind::Spm),
        tokens,
        scores,
        token_types: types,
        bos: Some(1),
        eos: Some(2),
        add_space_prefix,
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn spm_merges_by_score_and_falls_back_to_bytes() {
    let tk = spm_vocab(None);
    assert!(tk.add_bos_default());
    let pieces = |ids: &[u32]| ids.iter().map(|&i| tk.piece(i).to_string()).collect::<Vec<_>>();
    let ids = tk.encode("hello", true, false);
    assert_eq!(pieces(&ids), ["<s>", "\u{2581}hello"]);
    // Best-scoring pair first: "ll" (-1.4), then "he" (-1.5), then "he"+"ll" = "hell".
    assert_eq!(pieces(&tk.encode("hell", false, false)), ["\u{2581}", "hell"]);
    // 'z' has no piece: byte fallback.
    assert_eq!(pieces(&tk.encode("hez", false, false)), ["\u{2581}", "he", "<0x7A>"]);
    // Multi-byte characters fall back byte by byte and decode back.
    let ids = tk.encode("hé", false, false);
    assert_eq!(pieces(&ids), ["\u{2581}", "h", "<0xC3>", "<0xA9>"]);
    for s in ["hello hez", "  hello", "hé 🦉", ""] {
        assert_eq!(tk.decode(&tk.encode(s, true, false)), s);
    }
}

#[test]
fn spm_space_prefix_follows_special_tokens() {
    let tk = spm_vocab(None);
    // Text after a special token gets the dummy prefix again, as in llama.cpp.
    let ids = tk.encode("hello</s>hello", false, true);
    let mut expected = tk.encode("hello", false, false);
    expected.push(2);
    expected.extend(tk.encode("hello", false, false));
    assert_eq!(ids, expected);
    let no_prefix = spm_vocab(Some(false));
    assert_eq!(no_prefix.piece(no_prefix.encode("hello", false, false)[0]), "hello");
    assert_eq!(no_prefix.decode(&no_prefix.encode(" hello", false, false)), " hello");
}

proptest::proptest! {
    #[test]
    fn bpe_round_trips_any_text(s in "\\PC{0,40}|[ \\t\\n\\r]{0,12}|[a-z' ]{0,30}") {
        let tk = TRAINED.with(|t| t.clone());
        let ids = tk.encode(&s, false, false);
        proptest::prop_assert_eq!(tk.decode(&ids), s);
    }
}

thread_local! {
    static TRAINED: std::rc::Rc<Tokenizer> = std::rc::Rc::new(trained(500));
}
