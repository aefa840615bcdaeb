//! Pre-tokenizers for byte-level BPE, chosen by `tokenizer.ggml.pre` the way llama.cpp's
//! llama-vocab.cpp chooses them. A pre-tokenizer is a list of regex stages: each stage splits
//! every current piece into its matches and the unmatched text between them (which stays as
//! pieces of its own), so concatenating the pieces always gives back the input.

use regex_automata::meta::Regex;
use regex_automata::{Anchored, Input, Match};

/// GPT-2's expression as llama.cpp writes it (no trailing `|\s+`: whitespace that no branch
/// matches is left between matches, which yields the same pieces).
pub const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3 (tokenizer.json's `(?i:...)` contractions spelled out as llama.cpp does).
pub const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2: like Llama 3 but single digits.
pub const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-4o (o200k; gpt-oss, Llama 4) as llama.cpp's LLAMA_VOCAB_PRE_TYPE_GPT4O writes it:
/// `(?=[\p{L}])([^a-z])` (a letter other than a-z) is `[^\P{L}a-z]` here, so a word is
/// "capitals then lower-case" or "capitals" with the contractions, and the punctuation run may
/// take trailing newlines and slashes.
pub const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[^\P{L}a-z]*[^\P{L}A-Z]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[^\P{L}a-z]+[^\P{L}A-Z]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
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
const STAGES_GPT4O: &[&str] = &[GPT4O];
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
        "gpt-4o" | "llama4" | "kanana2" | "talkie" => spec(STAGES_GPT4O, false, false),
        _ => PreTokenizerSpec { stages: STAGES_GPT2, ignore_merges: false, add_bos: false, known: false },
    }
}

pub struct PreTokenizer {
    stages: Vec<Stage>,
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
        PreTokenizer { stages: stages.iter().map(|e| Stage::new(e)).collect() }
    }

    /// Splits `text` into words; their concatenation is `text`. Linear time and no
    /// recursion, so any input length splits exactly as the stage regexes would.
    pub fn split<'a>(&self, text: &'a str) -> Vec<&'a str> {
        let mut pieces = vec![text];
        for stage in &self.stages {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in pieces {
                stage.split_piece(piece, &mut next);
            }
            pieces = next;
        }
        pieces
    }
}

/// The one look-around the pre-tokenizer expressions use: whitespace not followed by
/// non-whitespace (a run of spaces gives its last space to the next word).
const WHITESPACE_LOOKAHEAD: &str = r"\s+(?!\S)";

/// One regex stage, matched with the `regex` crate (finite automata: linear time, no
/// backtracking stack). A backtracking engine (fancy_regex) overflowed its stack on runs of
/// about a million characters and then kept the rest of the text whole, which tokenized
/// everything after the run wrongly.
///
/// The look-ahead branch `\s+(?!\S)` is resolved by hand: the search expression has `\s+`
/// in its place, and when that branch wins at position p over the whitespace run p..q,
/// the backtracking semantics are: the whole run if it ends the text, else the run minus
/// its last character, else (a single whitespace character before non-whitespace) the
/// branch fails and the branches after it are tried at p; if none matches, no match starts
/// at p. `tests::regex_stages_match_fancy_regex` checks this against fancy_regex.
struct Stage {
    /// The expression with `\s+(?!\S)` replaced by `\s+`.
    search: Regex,
    lookahead: Option<Lookahead>,
}

struct Lookahead {
    /// `\s`: whether the look-ahead branch can match at a position (searched anchored).
    whitespace: Regex,
    /// The alternatives before the look-ahead branch (searched anchored).
    before: Option<Regex>,
    /// The alternatives after it (searched anchored).
    after: Option<Regex>,
}

/// An anchored search of `re` in `piece` at `at`.
fn anchored_at<'h>(piece: &'h str, at: usize) -> Input<'h> {
    Input::new(piece).range(at..).anchored(Anchored::Yes)
}

impl Stage {
    fn new(expr: &str) -> Stage {
        let compile = |e: &str| Regex::new(e).unwrap_or_else(|err| panic!("pre-tokenizer regex {e:?}: {err}"));
        let alternatives = top_level_alternatives(expr);
        let Some(at) = alternatives.iter().position(|a| *a == WHITESPACE_LOOKAHEAD) else {
            return Stage { search: compile(expr), lookahead: None };
        };
        let alternation = |alts: &[&str]| (!alts.is_empty()).then(|| compile(&alts.join("|")));
        let mut search = alternatives.clone();
        search[at] = r"\s+";
        Stage {
            search: compile(&search.join("|")),
            lookahead: Some(Lookahead {
                whitespace: compile(r"\s"),
                before: alternation(&alternatives[..at]),
                after: alternation(&alternatives[at + 1..]),
            }),
        }
    }

    /// The match the original expression has at `m.start()`, or None when it has none there.
    fn resolve(&self, piece: &str, m: Match) -> Option<(usize, usize)> {
        let Some(la) = &self.lookahead else { return Some((m.start(), m.end())) };
        let (p, q) = (m.start(), m.end());
        let from_lookahead =
            la.whitespace.is_match(anchored_at(piece, p)) && !la.before.as_ref().is_some_and(|b| b.is_match(anchored_at(piece, p)));
        if !from_lookahead {
            return Some((p, q));
        }
        // `\s+` took the whole whitespace run p..q (greedy, maximal).
        if q == piece.len() {
            return Some((p, q));
        }
        let last = piece[p..q].char_indices().next_back().map(|(i, _)| p + i).unwrap_or(p);
        if last > p {
            return Some((p, last));
        }
        la.after.as_ref().and_then(|a| a.find(anchored_at(piece, p))).map(|a| (p, a.end()))
    }

    fn split_piece<'a>(&self, piece: &'a str, out: &mut Vec<&'a str>) {
        let (mut last, mut at) = (0, 0);
        while at <= piece.len() {
            let Some(m) = self.search.find(Input::new(piece).range(at..)) else { break };
            let Some((s, e)) = self.resolve(piece, m) else {
                // No match starts at m.start(): search again from the next character.
                at = m.start() + piece[m.start()..].chars().next().map_or(1, char::len_utf8);
                continue;
            };
            if s > last {
                out.push(&piece[last..s]);
            }
            if e > s {
                out.push(&piece[s..e]);
                at = e;
            } else {
                at = e + piece[e..].chars().next().map_or(1, char::len_utf8);
            }
            last = e;
        }
        if last < piece.len() {
            out.push(&piece[last..]);
        }
    }
}

/// Splits an expression at its top-level `|` (not inside groups or classes).
fn top_level_alternatives(expr: &str) -> Vec<&str> {
    let (mut out, mut depth, mut class, mut escaped, mut start) = (Vec::new(), 0i32, false, false, 0);
    for (i, c) in expr.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '[' if !class => class = true,
            ']' if class => class = false,
            '(' if !class => depth += 1,
            ')' if !class => depth -= 1,
            '|' if !class && depth == 0 => {
                out.push(&expr[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&expr[start..]);
    out
}

#[cfg(test)]
mod regex_tests {
    use super::*;

    /// The pre-tokenizer as a backtracking engine runs the expressions (the oracle).
    fn fancy_split<'a>(stages: &[fancy_regex::Regex], text: &'a str) -> Vec<&'a str> {
        let mut pieces = vec![text];
        for re in stages {
            let mut next = Vec::new();
            for piece in pieces {
                let mut last = 0;
                for m in re.find_iter(piece) {
                    let m = m.expect("short inputs stay within fancy_regex's limits");
                    if m.start() > last {
                        next.push(&piece[last..m.start()]);
                    }
                    if m.end() > m.start() {
                        next.push(m.as_str());
                    }
                    last = m.end();
                }
                if last < piece.len() {
                    next.push(&piece[last..]);
                }
            }
            pieces = next;
        }
        pieces
    }

    fn fancy(stages: &[&str]) -> Vec<fancy_regex::Regex> {
        stages.iter().map(|e| fancy_regex::Regex::new(e).unwrap()).collect()
    }

    const ALL_STAGES: &[&[&str]] = &[
        STAGES_GPT2,
        STAGES_LLAMA3,
        STAGES_QWEN2,
        STAGES_QWEN35,
        STAGES_GPT4O,
        STAGES_STARCODER,
        STAGES_FALCON,
        STAGES_DEEPSEEK_LLM,
        STAGES_DEEPSEEK_CODER,
        STAGES_DEFAULT,
    ];

    /// Characters from every class the expressions distinguish.
    const ALPHABET: &[&str] = &[
        "a", "Z", "é", "日", "ß", "1", "٣", "ⅷ", " ", " ", " ", "\t", "\n", "\r", "\u{a0}", "\u{2028}", "\u{85}", "'", "s", "t", "re",
        "ll", "D", "!", ".", ",", "$", "+", "<", "=", "|", "`", "~", "^", "-", "🦉", "\u{301}", "\u{200b}", "\0", "０", "，", "「", "가",
    ];

    #[test]
    fn regex_stages_match_fancy_regex() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(13);
        for stages in ALL_STAGES {
            let (pre, oracle) = (PreTokenizer::from_stages(stages), fancy(stages));
            for _ in 0..400 {
                let n = rng.gen_range(0..40);
                // Runs make whitespace and letter sequences of every length likely.
                let text: String = (0..n).map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())].repeat(rng.gen_range(1..4))).collect();
                assert_eq!(pre.split(&text), fancy_split(&oracle, &text), "{stages:?} on {text:?}");
            }
        }
    }

    /// fancy_regex itself fails on these inputs (StackOverflow for every stage list with
    /// `\s+(?!\S)`, checked 2026-12-04), which is why the oracle only sees the short run.
    #[test]
    fn long_runs_split_like_short_ones() {
        let tail = "\n and then,  two   spaces.\n\n  Done!  ";
        for stages in ALL_STAGES {
            let (pre, oracle) = (PreTokenizer::from_stages(stages), fancy(stages));
            for run in ["x", " ", "\t", "7", "!"] {
                let long = format!("{}{tail}", run.repeat(1_000_000));
                let short = format!("{}{tail}", run.repeat(12));
                let (got, want) = (pre.split(&long), fancy_split(&oracle, &short));
                assert_eq!(got.concat(), long);
                // Everything after the run is split as it is after a short run.
                let tail_of = |pieces: &[&str]| {
                    pieces
                        .iter()
                        .rev()
                        .scan(0, |n, p| {
                            *n += p.len();
                            (*n <= tail.len()).then(|| p.to_string())
                        })
                        .collect::<Vec<_>>()
                };
                assert_eq!(tail_of(&got), tail_of(&want), "{stages:?} after a run of {run:?}");
            }
        }
    }
}
