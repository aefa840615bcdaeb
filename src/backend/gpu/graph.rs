//! Decode steps as device graphs: the launches of a step are recorded on a tape instead of
//! being queued one by one; when the host next needs the stream (a download, an upload, a
//! synchronisation) the tape is either queued eagerly or, when the same tape was seen before,
//! captured once into a graph (`cuStreamBeginCapture` / `hipStreamBeginCapture`) and replayed
//! with one `cuGraphLaunch` from then on.
//!
//! A graph is only replayed for a tape equal to the one it was captured from: the same
//! kernels, grids and every argument value (device pointers included). Replaying it is
//! therefore the same work as queueing the tape. What makes decode tapes repeat from token to
//! token is that nothing in them depends on the position: RoPE, the KV store and decode
//! attention read the positions from a device buffer at a fixed address, and the pooled
//! scratch buffers come back at the same addresses in every step of the same shape.

use super::api::{DevicePtr, EventHandle, FunctionHandle, GraphHandle};
use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// One queued kernel launch.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LaunchOp {
    pub kernel: &'static str,
    pub shape: &'static str,
    pub f: FunctionHandle,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Kernel arguments, one 8-byte slot each.
    pub slots: Vec<u64>,
    /// Launched to overlap the previous kernel's tail (`GpuApi::launch`'s `overlap_previous`).
    pub overlap: bool,
}

/// Whether op j of a tape may be launched to overlap the op before it (`GpuApi::launch`'s
/// `overlap_previous`): both are kernel launches and this kernel waits for its predecessor
/// itself (`LaunchOp::overlap`). Never the first op of a tape (the stream work before it may be
/// an upload, which a kernel's wait does not cover) nor one after a copy, for the same reason.
pub fn overlap_allowed(ops: &[Op], j: usize) -> bool {
    matches!(&ops[j], Op::Launch(l) if l.overlap) && j > 0 && matches!(ops[j - 1], Op::Launch(_))
}

/// One piece of stream work on the tape.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Op {
    Launch(LaunchOp),
    /// Device-to-device copy.
    Copy {
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    },
}

/// Tapes shorter than this run eagerly: a graph saves nothing worth its capture.
pub const MIN_GRAPH_OPS: usize = 16;
/// Graphs kept (one per decode batch shape in practice); the oldest is dropped beyond this.
pub const MAX_GRAPHS: usize = 16;
/// Tape hashes remembered as seen once (capture happens on the second sighting).
const MAX_SEEN: usize = 32;

/// A captured tape: the plain graph and, once asked for, a timed one (its events or stamp buffer belong to the
/// entry, so the graph stays valid).
pub struct GraphEntry {
    pub hash: u64,
    pub ops: Vec<Op>,
    pub plain: GraphHandle,
    pub timed: Option<TimedGraph>,
    /// Replays so far (timed replays are every `sample_every`-th).
    pub replays: u64,
    /// Launches per (kernel, shape class), counted into the registry once per replay.
    pub calls: Vec<(&'static str, &'static str, u64)>,
}

/// The tape captured with a clock reading before its first op and one after every op: op j
/// runs between readings j and j + 1. One reading between two launches instead of a pair
/// around each halves them; a launch's time is then measured from the previous op's end, so it
/// includes the gap between the two launches (which a graph keeps to the device's launch latency).
pub struct TimedGraph {
    pub graph: GraphHandle,
    pub clock: TimedClock,
}

/// How a timed graph reads the time between its ops.
pub enum TimedClock {
    /// An event node after every op. Each costs ~4 us of a replay on an H100 (docs/GPU.md,
    /// "Issue #17, session 18"), and the launches around it cannot overlap.
    Events(Vec<EventHandle>),
    /// A one-thread `civetta_time_stamp` launch after every op writing the device's steady
    /// clock to `buf[j]` (u64 ticks at `hz`; kernels/timestamp.hip). It overlaps like the
    /// kernels around it, so the timed replay keeps the untimed one's launch overlap.
    Stamps {
        buf: DevicePtr,
        hz: u64,
        /// (slot of the reading before the launch, kernel, shape class) of every launch op.
        launches: Arc<[(usize, &'static str, &'static str)]>,
    },
}

/// Launches per (kernel, shape class) of a tape, in first-seen order.
pub fn launch_counts(ops: &[Op]) -> Vec<(&'static str, &'static str, u64)> {
    let mut counts: Vec<(&'static str, &'static str, u64)> = Vec::new();
    for op in ops {
        if let Op::Launch(l) = op {
            match counts.iter_mut().find(|(k, s, _)| *k == l.kernel && *s == l.shape) {
                Some(c) => c.2 += 1,
                None => counts.push((l.kernel, l.shape, 1)),
            }
        }
    }
    counts
}

#[derive(Default)]
pub struct GraphCache {
    pub entries: Vec<GraphEntry>,
    seen: VecDeque<u64>,
    /// Set when capture failed once: graphs are off for this backend from then on.
    pub disabled: bool,
    pub captures: u64,
    pub replays: u64,
}

/// What to do with a tape.
pub enum Decision {
    Replay(usize),
    Capture,
    Eager,
}

/// Whether a graph's next replay (after `replays` earlier ones) runs its timed twin, with one
/// replay in `every` timed: the n-th, 2n-th, ... replay, not the first. A graph that lives
/// fewer than n replays (a batch composition that soon changes, a request's graph before its
/// caches move) then never pays for capturing the twin, which costs about as much as the
/// capture of the graph itself; the timed fraction of its launches stays at most the rate.
pub fn replay_is_timed(replays: u64, every: Option<u64>) -> bool {
    every.is_some_and(|n| (replays + 1).is_multiple_of(n))
}

pub fn tape_hash(ops: &[Op]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ops.hash(&mut h);
    h.finish()
}

impl GraphCache {
    pub fn decide(&mut self, ops: &[Op], hash: u64) -> Decision {
        if self.disabled || ops.len() < MIN_GRAPH_OPS {
            return Decision::Eager;
        }
        if let Some(i) = self.entries.iter().position(|e| e.hash == hash && e.ops == ops) {
            return Decision::Replay(i);
        }
        if let Some(i) = self.seen.iter().position(|&h| h == hash) {
            self.seen.remove(i);
            return Decision::Capture;
        }
        if self.seen.len() == MAX_SEEN {
            self.seen.pop_front();
        }
        self.seen.push_back(hash);
        Decision::Eager
    }

    /// Adds an entry; returns the one evicted to make room, whose graphs the caller destroys
    /// (after the stream is idle).
    pub fn insert(&mut self, entry: GraphEntry) -> Option<GraphEntry> {
        let evicted = if self.entries.len() == MAX_GRAPHS { Some(self.entries.remove(0)) } else { None };
        self.entries.push(entry);
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tape(n: usize, arg: u64) -> Vec<Op> {
        (0..n)
            .map(|i| {
                Op::Launch(LaunchOp {
                    kernel: "k",
                    shape: "m1",
                    f: FunctionHandle(1),
                    grid: [i as u32, 1, 1],
                    block: [128, 1, 1],
                    slots: vec![arg],
                    overlap: false,
                })
            })
            .collect()
    }

    #[test]
    fn the_nth_replay_is_timed_not_the_first() {
        let timed: Vec<u64> = (0..60).filter(|&r| replay_is_timed(r, Some(20))).collect();
        assert_eq!(timed, [19, 39, 59]);
        assert!((0..5).all(|r| replay_is_timed(r, Some(1))), "a rate of 1 times every replay");
        assert!(!(0..100).any(|r| replay_is_timed(r, None)), "timing off or nothing sampled");
    }

    #[test]
    fn only_a_waiting_kernel_right_after_another_kernel_overlaps_it() {
        let launch = |overlap| {
            Op::Launch(LaunchOp {
                kernel: "k",
                shape: "m1",
                f: FunctionHandle(1),
                grid: [1; 3],
                block: [128, 1, 1],
                slots: vec![],
                overlap,
            })
        };
        let copy = Op::Copy { dst: 1, src: 2, bytes: 4 };
        let ops = [launch(true), launch(true), launch(false), copy, launch(true), launch(true)];
        let allowed: Vec<bool> = (0..ops.len()).map(|j| overlap_allowed(&ops, j)).collect();
        // First op: no; after a kernel: yes; a kernel that does not wait: no; the copy: no;
        // right after the copy: no; after that kernel: yes.
        assert_eq!(allowed, [false, true, false, false, false, true]);
    }

    #[test]
    fn a_tape_is_captured_on_its_second_sighting_and_replayed_after() {
        let mut c = GraphCache::default();
        let t = tape(MIN_GRAPH_OPS, 7);
        let h = tape_hash(&t);
        assert!(matches!(c.decide(&t, h), Decision::Eager));
        assert!(matches!(c.decide(&t, h), Decision::Capture));
        c.insert(GraphEntry { hash: h, ops: t.clone(), plain: GraphHandle(9), timed: None, replays: 0, calls: vec![] });
        assert!(matches!(c.decide(&t, h), Decision::Replay(0)));
        // Any argument differing (a position, a pointer) is another tape.
        let other = tape(MIN_GRAPH_OPS, 8);
        assert!(matches!(c.decide(&other, tape_hash(&other)), Decision::Eager));
    }

    #[test]
    fn short_tapes_and_disabled_caches_run_eagerly() {
        let mut c = GraphCache::default();
        let t = tape(MIN_GRAPH_OPS - 1, 0);
        let h = tape_hash(&t);
        for _ in 0..3 {
            assert!(matches!(c.decide(&t, h), Decision::Eager));
        }
        c.disabled = true;
        let t = tape(MIN_GRAPH_OPS, 0);
        let h = tape_hash(&t);
        for _ in 0..3 {
            assert!(matches!(c.decide(&t, h), Decision::Eager));
        }
    }

    #[test]
    fn the_oldest_graph_is_evicted() {
        let mut c = GraphCache::default();
        for i in 0..MAX_GRAPHS as u64 {
            assert!(c.insert(GraphEntry { hash: i, ops: vec![], plain: GraphHandle(i), timed: None, replays: 0, calls: vec![] }).is_none());
        }
        let ev = c.insert(GraphEntry { hash: 99, ops: vec![], plain: GraphHandle(99), timed: None, replays: 0, calls: vec![] }).unwrap();
        assert_eq!(ev.plain, GraphHandle(0));
        assert_eq!(c.entries.len(), MAX_GRAPHS);
    }
}
