//! Deterministic byte-level BPE training (for synthetic test models).

use super::bpe::bytes_to_token_text;
use super::pretokenize::PreTokenizer;
use std::collections::{BTreeMap, HashMap};

/// The built-in training corpus (original prose and code written for civetta).
pub const CORPUS: &str = include_str!("corpus.txt");

/// Trains merges until the vocabulary has `vocab_size` entries (256 byte tokens first).
/// Ties between equally frequent pairs break lexicographically, so the result is a pure
/// function of the corpus.
pub fn train_byte_level_bpe(corpus: &str, vocab_size: usize) -> (Vec<String>, Vec<String>) {
    let mut vocab: Vec<String> = (0..=255u8).map(|b| bytes_to_token_text(&[b])).collect();
    let mut words: BTreeMap<String, usize> = BTreeMap::new();
    for w in PreTokenizer::for_name("gpt-2").split(corpus) {
        *words.entry(bytes_to_token_text(w.as_bytes())).or_default() += 1;
    }
    let mut seqs: Vec<(Vec<String>, usize)> = words.into_iter().map(|(w, c)| (w.chars().map(|ch| ch.to_string()).collect(), c)).collect();
    let mut merges = Vec::new();
    while vocab.len() < vocab_size {
        let mut counts: HashMap<(&str, &str), usize> = HashMap::new();
        for (s, c) in &seqs {
            for p in s.windows(2) {
                *counts.entry((p[0].as_str(), p[1].as_str())).or_default() += c;
            }
        }
        let Some(((a, b), _)) = counts.into_iter().max_by(|x, y| x.1.cmp(&y.1).then_with(|| y.0.cmp(&x.0))) else {
            break;
        };
        let (a, b) = (a.to_string(), b.to_string());
        let merged = format!("{a}{b}");
        for (s, _) in seqs.iter_mut() {
            let mut i = 0;
            while i + 1 < s.len() {
                if s[i] == a && s[i + 1] == b {
                    s[i] = merged.clone();
                    s.remove(i + 1);
                }
                i += 1;
            }
        }
        merges.push(format!("{a} {b}"));
        vocab.push(merged);
    }
    (vocab, merges)
}
