//! Byte-level BPE (GPT-2 style): every byte of a pre-tokenized word maps to a printable
//! character, then merges apply lowest rank first (leftmost first on ties), as in llama.cpp's
//! llm_tokenizer_bpe. Merge parts and results that are not vocabulary entries still take part
//! in merging (they are interned as extra symbols); a final symbol that is not a vocabulary
//! entry is emitted as its byte tokens.

use super::word_cache::WordCache;
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// GPT-2's byte -> char table.
pub static BYTE_TO_CHAR: Lazy<[char; 256]> = Lazy::new(|| {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        table[b as usize] = if printable {
            char::from_u32(b).expect("latin-1 char")
        } else {
            n += 1;
            char::from_u32(255 + n).expect("bmp char")
        };
    }
    table
});

static CHAR_TO_BYTE: Lazy<HashMap<char, u8>> = Lazy::new(|| BYTE_TO_CHAR.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect());

/// The vocabulary spelling of raw bytes.
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

/// (rank, left position, right position, left symbol, right symbol) of a candidate merge.
type QueuedPair = (u32, usize, usize, u32, u32);

pub struct Bpe {
    n_vocab: u32,
    /// (left symbol, right symbol) -> (rank, merged symbol). Symbols below `n_vocab` are token
    /// ids; the others stand for merge-only texts.
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Symbol of each byte's single character (always defined: interned when not a token).
    byte_symbols: [u32; 256],
    /// Token id of each byte's single character, when the vocabulary has one.
    byte_tokens: [Option<u32>; 256],
    ignore_merges: bool,
    cache: Mutex<WordCache>,
}

struct Interner<'a> {
    ids: &'a HashMap<String, u32>,
    n_vocab: u32,
    extra: HashMap<String, u32>,
}

impl Interner<'_> {
    fn symbol(&mut self, text: &str) -> u32 {
        if let Some(&id) = self.ids.get(text) {
            return id;
        }
        if let Some(&s) = self.extra.get(text) {
            return s;
        }
        let s = self.n_vocab + self.extra.len() as u32;
        self.extra.insert(text.to_string(), s);
        s
    }
}

impl Bpe {
    /// `ids` maps vocabulary text to id; `merges` are "left right" in rank order.
    pub fn new(n_vocab: usize, merges: &[String], ids: &HashMap<String, u32>, ignore_merges: bool) -> Bpe {
        let n_vocab = n_vocab as u32;
        let mut interner = Interner { ids, n_vocab, extra: HashMap::new() };
        let mut byte_symbols = [0u32; 256];
        let mut byte_tokens = [None; 256];
        for b in 0..256usize {
            let text = BYTE_TO_CHAR[b].to_string();
            byte_tokens[b] = ids.get(&text).copied();
            byte_symbols[b] = interner.symbol(&text);
        }
        let mut table = HashMap::with_capacity(merges.len());
        let mut malformed = 0usize;
        for (rank, m) in merges.iter().enumerate() {
            // Like llama.cpp: the separator is the first space after the first byte, so a
            // left part may itself start with a space.
            let Some(pos) = m.as_bytes().iter().skip(1).position(|&b| b == b' ').map(|p| p + 1) else {
                malformed += 1;
                continue;
            };
            let (a, b) = (&m[..pos], &m[pos + 1..]);
            let (sa, sb) = (interner.symbol(a), interner.symbol(b));
            let merged = interner.symbol(&format!("{a}{b}"));
            // The first occurrence of a pair keeps its rank.
            table.entry((sa, sb)).or_insert((rank as u32, merged));
        }
        if malformed > 0 {
            tracing::warn!(malformed, "BPE merges without a separating space were ignored");
        }
        Bpe { n_vocab, merges: table, byte_symbols, byte_tokens, ignore_merges, cache: Mutex::new(WordCache::default()) }
    }

    /// Whether every byte has a token (then no input byte is dropped).
    pub fn every_byte_has_a_token(&self) -> bool {
        self.byte_tokens.iter().all(Option::is_some)
    }

    /// Appends the ids of one pre-tokenized word.
    pub fn encode_word(&self, word: &str, ids: &HashMap<String, u32>, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if let Some(cached) = self.cache.lock().get(word) {
            out.extend_from_slice(cached);
            return;
        }
        let mut result = Vec::new();
        match ids.get(&bytes_to_token_text(word.as_bytes())) {
            Some(&id) if self.ignore_merges => result.push(id),
            _ => self.merge_word(word.as_bytes(), &mut result),
        }
        out.extend_from_slice(&result);
        self.cache.lock().insert(word, &result);
    }

    fn merge_word(&self, bytes: &[u8], out: &mut Vec<u32>) {
        let n = bytes.len();
        // Symbol k covers bytes k..k+len[k] of the word (a linked list; merged-away ones have len 0).
        let mut sym: Vec<u32> = bytes.iter().map(|&b| self.byte_symbols[b as usize]).collect();
        let mut len = vec![1usize; n];
        let mut prev: Vec<Option<usize>> = (0..n).map(|i| i.checked_sub(1)).collect();
        let mut next: Vec<Option<usize>> = (0..n).map(|i| if i + 1 < n { Some(i + 1) } else { None }).collect();
        // Min-heap on (rank, left position); entries remember the symbols they were made for.
        let mut queue: BinaryHeap<Reverse<QueuedPair>> = BinaryHeap::new();
        let push = |queue: &mut BinaryHeap<_>, sym: &[u32], l: usize, r: usize| {
            if let Some(&(rank, _)) = self.merges.get(&(sym[l], sym[r])) {
                queue.push(Reverse((rank, l, r, sym[l], sym[r])));
            }
        };
        for i in 1..n {
            push(&mut queue, &sym, i - 1, i);
        }
        while let Some(Reverse((_, l, r, sl, sr))) = queue.pop() {
            // Stale: one side was merged away or has grown since this pair was queued.
            if len[l] == 0 || len[r] == 0 || next[l] != Some(r) || sym[l] != sl || sym[r] != sr {
                continue;
            }
            sym[l] = self.merges[&(sl, sr)].1;
            len[l] += len[r];
            len[r] = 0;
            next[l] = next[r];
            if let Some(nr) = next[r] {
                prev[nr] = Some(l);
            }
            if let Some(p) = prev[l] {
                push(&mut queue, &sym, p, l);
            }
            if let Some(nx) = next[l] {
                push(&mut queue, &sym, l, nx);
            }
        }
        let mut i = Some(0);
        while let Some(k) = i {
            if sym[k] < self.n_vocab {
                out.push(sym[k]);
            } else {
                // Not a vocabulary entry: fall back to byte tokens (bytes without one are dropped,
                // as llama.cpp does).
                out.extend(bytes[k..k + len[k]].iter().filter_map(|&b| self.byte_tokens[b as usize]));
            }
            i = next[k];
        }
    }
}
