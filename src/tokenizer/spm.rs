//! SentencePiece (llama.cpp's llm_tokenizer_spm): spaces become "▁", the highest-scoring
//! adjacent pair merges first, unknown pieces fall back to <0xXX> byte tokens.

use super::token_type;
use std::collections::{BinaryHeap, HashMap};

pub struct Spm {
    scores: Vec<f32>,
    byte_tokens: [Option<u32>; 256],
    unk: Option<u32>,
}

/// Bytes of a piece: "▁" is a space, "<0xAB>" is one byte.
pub fn piece_to_bytes(p: &str) -> Vec<u8> {
    if p.len() == 6 && p.starts_with("<0x") && p.ends_with('>') {
        if let Ok(b) = u8::from_str_radix(&p[3..5], 16) {
            return vec![b];
        }
    }
    p.replace('\u{2581}', " ").into_bytes()
}

impl Spm {
    pub fn new(tokens: &[String], scores: &[f32], types: &[i32]) -> Spm {
        let mut byte_tokens = [None; 256];
        for b in 0..256usize {
            let name = format!("<0x{b:02X}>");
            byte_tokens[b] = tokens.iter().position(|t| *t == name).map(|i| i as u32);
        }
        let scores = if scores.len() == tokens.len() { scores.to_vec() } else { vec![0.0; tokens.len()] };
        let unk = types.iter().position(|&t| t == token_type::UNKNOWN).map(|i| i as u32);
        Spm { scores, byte_tokens, unk }
    }

    pub fn encode(&self, text: &str, space_prefix: bool, ids: &HashMap<String, u32>, out: &mut Vec<u32>) {
        let mut s = String::with_capacity(text.len() + 3);
        if space_prefix {
            s.push('\u{2581}');
        }
        s.push_str(&text.replace(' ', "\u{2581}"));
        // Symbols are byte ranges of s (one UTF-8 character each at first), in a linked list.
        let mut syms: Vec<(usize, usize)> = s.char_indices().map(|(i, c)| (i, i + c.len_utf8())).collect();
        let n = syms.len();
        let mut prev: Vec<isize> = (0..n as isize).map(|i| i - 1).collect();
        let mut next: Vec<isize> = (1..=n as isize).map(|i| if i as usize == n { -1 } else { i }).collect();
        let mut alive = vec![true; n];
        // Max-heap on (score, -left index) so ties merge leftmost first.
        let mut heap = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<(OrdF32, isize, usize, usize)>, syms: &[(usize, usize)], l: usize, r: usize| {
            let text = &s[syms[l].0..syms[r].1];
            if let Some(&id) = ids.get(text) {
                heap.push((OrdF32(self.scores[id as usize]), -(l as isize), l, text.len()));
            }
        };
        for i in 0..n.saturating_sub(1) {
            push(&mut heap, &syms, i, i + 1);
        }
        while let Some((_, _, l, len)) = heap.pop() {
            let r = next[l];
            if !alive[l] || r < 0 {
                continue;
            }
            let r = r as usize;
            // Stale entry: the pair changed since it was queued.
            if syms[r].1 - syms[l].0 != len {
                continue;
            }
            syms[l].1 = syms[r].1;
            alive[r] = false;
            next[l] = next[r];
            if next[r] >= 0 {
                prev[next[r] as usize] = l as isize;
            }
            if prev[l] >= 0 {
                push(&mut heap, &syms, prev[l] as usize, l);
            }
            if next[l] >= 0 {
                push(&mut heap, &syms, l, next[l] as usize);
            }
        }
        let mut i = if n > 0 { 0isize } else { -1 };
        while i >= 0 {
            let (a, b) = syms[i as usize];
            let piece = &s[a..b];
            match ids.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &byte in piece.as_bytes() {
                        match self.byte_tokens[byte as usize].or(self.unk) {
                            Some(id) => out.push(id),
                            None => {}
                        }
                    }
                }
            }
            i = next[i as usize];
        }
    }
}

#[derive(PartialEq, PartialOrd, Clone, Copy)]
struct OrdF32(f32);
impl Eq for OrdF32 {}
impl Ord for OrdF32 {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}
