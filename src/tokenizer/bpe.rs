//! Byte-level BPE (GPT-2 style): bytes map to printable unicode characters, then merges
//! apply by rank within each pre-tokenized word.

use anyhow::bail;
use once_cell::sync::Lazy;
use std::collections::HashMap;

/// GPT-2's byte -> char table and its inverse.
pub static BYTE_TO_CHAR: Lazy<[char; 256]> = Lazy::new(|| {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        table[b as usize] = if printable {
            char::from_u32(b).unwrap()
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap()
        };
    }
    table
});

static CHAR_TO_BYTE: Lazy<HashMap<char, u8>> = Lazy::new(|| BYTE_TO_CHAR.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect());

pub fn bytes_to_token_text(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| BYTE_TO_CHAR[b as usize]).collect()
}

/// Bytes of a vocabulary entry; characters outside the byte table keep their UTF-8.
pub fn token_to_bytes(t: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(t.len());
    for c in t.chars() {
        match CHAR_TO_BYTE.get(&c) {
            Some(&b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out
}

pub struct Bpe {
    /// (left id, right id) -> (rank, merged id)
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Id of each byte's single-character token.
    byte_ids: [Option<u32>; 256],
    cache: parking_lot::Mutex<HashMap<String, Vec<u32>>>,
}

impl Bpe {
    pub fn new(merges: &[String], ids: &HashMap<String, u32>) -> anyhow::Result<Bpe> {
        let mut table = HashMap::with_capacity(merges.len());
        for (rank, m) in merges.iter().enumerate() {
            let Some((a, b)) = m.split_once(' ') else {
                bail!("merge {rank} \"{m}\" is not two tokens separated by a space");
            };
            let (Some(&ia), Some(&ib), Some(&im)) = (ids.get(a), ids.get(b), ids.get(&format!("{a}{b}"))) else {
                // llama.cpp tolerates merges whose parts are missing; they can never apply.
                continue;
            };
            table.entry((ia, ib)).or_insert((rank as u32, im));
        }
        let mut byte_ids = [None; 256];
        for b in 0..256usize {
            byte_ids[b] = ids.get(&BYTE_TO_CHAR[b].to_string()).copied();
        }
        Ok(Bpe { merges: table, byte_ids, cache: parking_lot::Mutex::new(HashMap::new()) })
    }

    /// Appends the ids of one pre-tokenized word.
    pub fn encode_word(&self, word: &str, ids: &HashMap<String, u32>, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if let Some(v) = self.cache.lock().get(word) {
            out.extend_from_slice(v);
            return;
        }
        let text = bytes_to_token_text(word.as_bytes());
        let result = if let Some(&id) = ids.get(&text) {
            vec![id]
        } else {
            self.merge(word.as_bytes())
        };
        out.extend_from_slice(&result);
        let mut cache = self.cache.lock();
        if cache.len() > 50_000 {
            cache.clear();
        }
        cache.insert(word.to_string(), result);
    }

    fn merge(&self, bytes: &[u8]) -> Vec<u32> {
        // Symbols start as byte tokens; bytes without a token are dropped (a broken vocab).
        let mut syms: Vec<u32> = bytes.iter().filter_map(|&b| self.byte_ids[b as usize]).collect();
        loop {
            let mut best: Option<(u32, usize, u32)> = None;
            for i in 0..syms.len().saturating_sub(1) {
                if let Some(&(rank, merged)) = self.merges.get(&(syms[i], syms[i + 1])) {
                    if best.map_or(true, |(r, _, _)| rank < r) {
                        best = Some((rank, i, merged));
                    }
                }
            }
            let Some((rank, _, merged)) = best else { break };
            // Apply this merge to every occurrence, left to right.
            let left = syms.clone();
            syms.clear();
            let mut i = 0;
            while i < left.len() {
                if i + 1 < left.len() && self.merges.get(&(left[i], left[i + 1])).map(|m| m.0) == Some(rank) {
                    syms.push(merged);
                    i += 2;
                } else {
                    syms.push(left[i]);
                    i += 1;
                }
            }
        }
        syms
    }
}
