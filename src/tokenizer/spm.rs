//! SentencePiece BPE as llama.cpp's llm_tokenizer_spm runs it: spaces become "▁", then the
//! adjacent pair whose concatenation is the highest-scoring vocabulary entry merges first
//! (leftmost on ties); characters left without a piece fall back to <0xXX> byte tokens.

use std::collections::{BinaryHeap, HashMap};

/// The SentencePiece word-boundary character.
pub const SPACE: char = '\u{2581}';

/// Bytes of a piece: "▁" is a space, "<0xAB>" is one byte.
pub fn piece_to_bytes(p: &str) -> Vec<u8> {
    if let Some(b) = byte_piece_value(p) {
        return vec![b];
    }
    p.replace(SPACE, " ").into_bytes()
}

/// The byte a "<0xAB>" piece stands for.
pub fn byte_piece_value(p: &str) -> Option<u8> {
    let hex = p.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

pub struct Spm {
    scores: Vec<f32>,
    /// Token for each byte: "<0xXX>", else the byte as a one-character piece, else unknown.
    byte_tokens: [Option<u32>; 256],
}

impl Spm {
    pub fn new(tokens: &[String], scores: &[f32], ids: &HashMap<String, u32>, unk: Option<u32>) -> Spm {
        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            let as_char = if b < 128 { ids.get(&(b as u8 as char).to_string()).copied() } else { None };
            *slot = ids.get(&format!("<0x{b:02X}>")).copied().or(as_char).or(unk);
        }
        let scores = if scores.len() == tokens.len() { scores.to_vec() } else { vec![0.0; tokens.len()] };
        Spm { scores, byte_tokens }
    }

    /// Whether every byte has a token (byte piece, character piece or unknown).
    pub fn every_byte_has_a_token(&self) -> bool {
        self.byte_tokens.iter().all(Option::is_some)
    }

    /// Appends the ids of `text` (spaces not yet escaped); `space_prefix` adds the dummy "▁".
    pub fn encode(&self, text: &str, space_prefix: bool, ids: &HashMap<String, u32>, out: &mut Vec<u32>) {
        let mut s = String::with_capacity(text.len() + 3);
        if space_prefix {
            s.push(SPACE);
        }
        s.extend(text.chars().map(|c| if c == ' ' { SPACE } else { c }));
        // Symbol k covers s[start[k]..start[k]+len[k]]; merged-away symbols have len 0.
        let start: Vec<usize> = s.char_indices().map(|(i, _)| i).collect();
        let n = start.len();
        let mut len: Vec<usize> = s.chars().map(char::len_utf8).collect();
        let mut prev: Vec<Option<usize>> = (0..n).map(|i| i.checked_sub(1)).collect();
        let mut next: Vec<Option<usize>> = (0..n).map(|i| if i + 1 < n { Some(i + 1) } else { None }).collect();
        // Max-heap on (score, earlier left first); entries remember the merged length.
        let mut queue: BinaryHeap<(OrdF32, std::cmp::Reverse<usize>, usize, usize)> = BinaryHeap::new();
        let push = |queue: &mut BinaryHeap<_>, len: &[usize], l: usize, r: usize| {
            let size = len[l] + len[r];
            if let Some(&id) = ids.get(&s[start[l]..start[l] + size]) {
                queue.push((OrdF32(self.scores[id as usize]), std::cmp::Reverse(l), r, size));
            }
        };
        for i in 1..n {
            push(&mut queue, &len, i - 1, i);
        }
        while let Some((_, std::cmp::Reverse(l), r, size)) = queue.pop() {
            if len[l] == 0 || len[r] == 0 || len[l] + len[r] != size {
                continue;
            }
            len[l] = size;
            len[r] = 0;
            next[l] = next[r];
            if let Some(nr) = next[r] {
                prev[nr] = Some(l);
            }
            if let Some(p) = prev[l] {
                push(&mut queue, &len, p, l);
            }
            if let Some(nx) = next[l] {
                push(&mut queue, &len, l, nx);
            }
        }
        let mut i = if n > 0 { Some(0) } else { None };
        while let Some(k) = i {
            let piece = &s[start[k]..start[k] + len[k]];
            match ids.get(piece) {
                Some(&id) => out.push(id),
                // Merges only build vocabulary entries, so this is a single unknown character.
                None => out.extend(piece.bytes().filter_map(|b| self.byte_tokens[b as usize])),
            }
            i = next[k];
        }
    }
}

/// A score with a total order, for the heap.
#[derive(Clone, Copy)]
struct OrdF32(f32);
impl PartialEq for OrdF32 {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o).is_eq()
    }
}
impl Eq for OrdF32 {}
impl PartialOrd for OrdF32 {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for OrdF32 {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}
