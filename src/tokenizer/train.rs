//! Deterministic byte-level BPE training (for synthetic test models and tests).

use super::bpe::bytes_to_token_text;
use super::pretokenize::PreTokenizer;
use std::collections::{BTreeMap, HashMap};

/// The built-in training corpus (original prose and code written for civetta).
pub const CORPUS: &str = include_str!("corpus.txt");

/// Trains on `corpus` (pre-tokenized with the GPT-2 regex, bytes spelled with GPT-2's
/// byte-to-unicode table) until the vocabulary has `vocab_size` entries or no pair occurs
/// twice. Returns the vocabulary (the 256 byte tokens in byte order first, then merged tokens)
/// and the merges "left right" in rank order. A `vocab_size` under 256 still yields the 256
/// byte tokens. The most frequent pair merges first; ties go to the lexicographically smallest
/// pair, so the result is a pure function of the input.
pub fn train_byte_level_bpe(corpus: &str, vocab_size: usize) -> (Vec<String>, Vec<String>) {
    let mut vocab: Vec<String> = (0..=255u8).map(|b| bytes_to_token_text(&[b])).collect();
    let mut index: HashMap<String, u32> = vocab.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    // Unique words with their counts, as symbol-id sequences (BTreeMap: a fixed order).
    let mut word_counts: BTreeMap<&str, usize> = BTreeMap::new();
    for w in PreTokenizer::for_name("gpt-2").split(corpus) {
        *word_counts.entry(w).or_default() += 1;
    }
    let mut words: Vec<(Vec<u32>, usize)> = word_counts.into_iter().map(|(w, c)| (w.bytes().map(u32::from).collect(), c)).collect();
    let mut merges = Vec::new();
    while vocab.len() < vocab_size {
        let mut counts: HashMap<(u32, u32), usize> = HashMap::new();
        for (syms, c) in &words {
            for p in syms.windows(2) {
                *counts.entry((p[0], p[1])).or_default() += c;
            }
        }
        let best = counts.into_iter().filter(|&(_, c)| c >= 2).max_by(|(pa, ca), (pb, cb)| {
            let key = |p: &(u32, u32)| (vocab[p.0 as usize].clone(), vocab[p.1 as usize].clone());
            ca.cmp(cb).then_with(|| key(pb).cmp(&key(pa)))
        });
        let Some(((a, b), _)) = best else { break };
        let merged_text = format!("{}{}", vocab[a as usize], vocab[b as usize]);
        merges.push(format!("{} {}", vocab[a as usize], vocab[b as usize]));
        // Two different merges can spell the same token; it is listed once.
        let merged = *index.entry(merged_text.clone()).or_insert_with(|| {
            vocab.push(merged_text);
            (vocab.len() - 1) as u32
        });
        for (syms, _) in words.iter_mut() {
            let mut out = Vec::with_capacity(syms.len());
            let mut i = 0;
            while i < syms.len() {
                if i + 1 < syms.len() && syms[i] == a && syms[i + 1] == b {
                    out.push(merged);
                    i += 2;
                } else {
                    out.push(syms[i]);
                    i += 1;
                }
            }
            *syms = out;
        }
    }
    (vocab, merges)
}
