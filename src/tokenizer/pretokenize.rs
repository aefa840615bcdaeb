//! Pre-tokenizer regexes by `tokenizer.ggml.pre` (as llama.cpp's llama-vocab.cpp chooses them).
//! Each stage splits every current piece into its matches and the text between them.

use fancy_regex::Regex;

pub const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
pub const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const DIGITS: &str = r"\p{N}";
const SMOLLM: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

pub struct PreTokenizer {
    stages: Vec<Regex>,
}

impl PreTokenizer {
    pub fn for_name(pre: &str) -> PreTokenizer {
        let exprs: &[&str] = match pre {
            "llama-bpe" | "llama3" | "llama-v3" | "falcon3" | "pixtral" => &[LLAMA3],
            "qwen2" | "qwen3" | "deepseek-r1-qwen" | "megrez" => &[QWEN2],
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => &[DIGITS, SMOLLM],
            "gpt-2" | "gpt2" | "default" | "phi-2" | "jina-es" | "jina-de" | "olmo" | "jais" => &[GPT2],
            other => {
                tracing::warn!(pre = other, "unknown pre-tokenizer, using the GPT-2 regex");
                &[GPT2]
            }
        };
        PreTokenizer { stages: exprs.iter().map(|e| Regex::new(e).expect("static pre-tokenizer regex")).collect() }
    }

    pub fn split<'a>(&self, text: &'a str) -> Vec<&'a str> {
        let mut pieces = vec![text];
        for re in &self.stages {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for p in pieces {
                let mut last = 0;
                for m in re.find_iter(p) {
                    let Ok(m) = m else { break };
                    if m.start() > last {
                        next.push(&p[last..m.start()]);
                    }
                    if m.end() > m.start() {
                        next.push(m.as_str());
                    }
                    last = m.end();
                }
                if last < p.len() {
                    next.push(&p[last..]);
                }
            }
            pieces = next;
        }
        pieces
    }
}
