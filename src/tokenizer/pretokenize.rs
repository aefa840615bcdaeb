//! Pre-tokenizers for byte-level BPE, chosen by `tokenizer.ggml.pre` the way llama.cpp's
//! llama-vocab.cpp chooses them. A pre-tokenizer is a list of regex stages: each stage splits
//! every current piece into its matches and the unmatched text between them (which stays as
//! pieces of its own), so concatenating the pieces always gives back the input.

use fancy_regex::Regex;

/// GPT-2's expression as llama.cpp writes it (no trailing `|\s+`: whitespace that no branch
/// matches is left between matches, which yields the same pieces).
pub const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3 (tokenizer.json's `(?i:...)` contractions spelled out as llama.cpp does).
pub const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2: like Llama 3 but single digits.
pub const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5: Qwen2 with combining marks kept inside words.
pub const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// DeepSeek LLM letters. Written with escapes: several code points here (U+1FD3, U+2126,
/// U+212A, ...) change under Unicode normalization, which editors may apply to literals.
const DEEPSEEK_LLM_LETTERS: &str = r"\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+";

/// The stage lists, by llama.cpp pre-tokenizer type.
const STAGES_GPT2: &[&str] = &[GPT2];
const STAGES_LLAMA3: &[&str] = &[LLAMA3];
const STAGES_QWEN2: &[&str] = &[QWEN2];
const STAGES_QWEN35: &[&str] = &[QWEN35];
/// StarCoder, Refact, Command-R, SmolLM, ...: every digit alone, then GPT-2.
const STAGES_STARCODER: &[&str] = &[r"\p{N}", GPT2];
const STAGES_FALCON: &[&str] = &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"];
const STAGES_DEEPSEEK_LLM: &[&str] = &[
    r"[\r\n]",
    DEEPSEEK_LLM_LETTERS,
    r"\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+",
    r"\s+$",
    r"[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
    r"\p{N}+",
];
const STAGES_DEEPSEEK_CODER: &[&str] =
    &[r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+", r"\p{N}"];
/// llama.cpp's fallback for `default` or a missing name.
const STAGES_DEFAULT: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"];

/// How a `tokenizer.ggml.pre` name tokenizes.
pub struct PreTokenizerSpec {
    pub stages: &'static [&'static str],
    /// A pre-tokenized word that is itself a vocabulary entry becomes that token without
    /// running merges (llama.cpp's ignore_merges, set for Llama 3).
    pub ignore_merges: bool,
    /// llama.cpp's add_bos default for this pre-tokenizer (true for Llama 3).
    pub add_bos: bool,
    /// Whether llama.cpp knows the name.
    pub known: bool,
}

pub fn spec_for(pre: &str) -> PreTokenizerSpec {
    let spec = |stages, ignore_merges, add_bos| PreTokenizerSpec { stages, ignore_merges, add_bos, known: true };
    match pre {
        "" | "default" => spec(STAGES_DEFAULT, false, false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" | "jina-v5-nano" => {
            spec(STAGES_LLAMA3, true, true)
        }
        "dbrx" | "smaug-bpe" => spec(STAGES_LLAMA3, false, false),
        "deepseek-llm" => spec(STAGES_DEEPSEEK_LLM, false, false),
        "deepseek-coder" => spec(STAGES_DEEPSEEK_CODER, false, false),
        "falcon" => spec(STAGES_FALCON, false, false),
        "gpt-2" | "gpt2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum"
        | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "exaone4" | "mpt" | "olmo" | "jais" | "trillion"
        | "granite-docling" => spec(STAGES_GPT2, false, false),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            spec(STAGES_STARCODER, false, false)
        }
        // "qwen3" is not a llama.cpp name (Qwen3 GGUFs say "qwen2"); accepted as an alias.
        "qwen2" | "qwen3" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2" | "hunyuan" | "solar-open" => {
            spec(STAGES_QWEN2, false, false)
        }
        "qwen35" => spec(STAGES_QWEN35, false, false),
        _ => PreTokenizerSpec { stages: STAGES_GPT2, ignore_merges: false, add_bos: false, known: false },
    }
}

pub struct PreTokenizer {
    stages: Vec<Regex>,
}

impl PreTokenizer {
    /// The pre-tokenizer for a `tokenizer.ggml.pre` name; unknown names get GPT-2's with a warning.
    pub fn for_name(pre: &str) -> PreTokenizer {
        let spec = spec_for(pre);
        if !spec.known {
            tracing::warn!(pre, "unknown pre-tokenizer, using the GPT-2 regex");
        }
        PreTokenizer::from_stages(spec.stages)
    }

    fn from_stages(stages: &[&str]) -> PreTokenizer {
        let stages = stages
            .iter()
            .map(|e| {
                // Large inputs (long whitespace runs) must not hit the default backtrack limit.
                fancy_regex::RegexBuilder::new(e).backtrack_limit(10_000_000).build().expect("static pre-tokenizer regex")
            })
            .collect();
        PreTokenizer { stages }
    }

    /// Splits `text` into words; their concatenation is `text`.
    pub fn split<'a>(&self, text: &'a str) -> Vec<&'a str> {
        let mut pieces = vec![text];
        for re in &self.stages {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in pieces {
                split_piece(re, piece, &mut next);
            }
            pieces = next;
        }
        pieces
    }
}

fn split_piece<'a>(re: &Regex, piece: &'a str, out: &mut Vec<&'a str>) {
    let mut last = 0;
    for m in re.find_iter(piece) {
        let m = match m {
            Ok(m) => m,
            Err(e) => {
                // Only a backtracking limit can fail here; keep the rest as one piece.
                tracing::warn!(error = %e, "pre-tokenizer regex failed; keeping the rest of the text whole");
                break;
            }
        };
        if m.start() > last {
            out.push(&piece[last..m.start()]);
        }
        if m.end() > m.start() {
            out.push(m.as_str());
        }
        last = m.end();
    }
    if last < piece.len() {
        out.push(&piece[last..]);
    }
}
