//! The mixed scenario of #14 (`civetta bench --remote ... --mixed`): a few streams decode, then
//! one long prompt arrives; the streams' inter-token latency while it prefills is compared with
//! theirs before it arrived. A server that prefills the long prompt in one piece stalls the
//! streams for the whole prefill; chunked prefill keeps their gaps near one step.
//!
//! The streams' own gaps also grow while the long prompt prefills, without it: every token
//! they add lengthens the KV their next token attends to (on a CPU, a 135M model's row at
//! position 2000 costs about 3x one at position 10). So with `control` the same streams run
//! once more alone, to as many tokens, and the gaps at the token positions that fell inside
//! the prefill are summarised as `control`: during / control is the slowdown the long prompt
//! caused, during / idle the one the streams saw.

use super::stream::{StreamControl, StreamRecord, StreamRequest};
use super::Target;
use crate::bench::report::{LatencySummary, MixedResult};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct MixedPlan {
    /// The long prompt's length in tokens (#14: 3,000).
    pub prompt_tokens: usize,
    /// Decoding streams (#14: 4).
    pub streams: usize,
    /// max_tokens of each decoding stream: enough to outlast the long prompt's prefill (they are
    /// stopped once it has its first token).
    pub stream_tokens: usize,
    /// Tokens every stream delivers, all decoding together, before the long prompt is sent.
    pub idle_tokens: usize,
    /// Then run the streams again without the long prompt (the control, see the module docs).
    pub control: bool,
}

/// Words the long prompt is made of (its length is calibrated in tokens, so the tokenizer
/// does not matter).
const FILLER: &[&str] = &[
    "the",
    "keeper",
    "of",
    "the",
    "lighthouse",
    "wrote",
    "in",
    "his",
    "log",
    "every",
    "night",
    "about",
    "ships",
    "storms",
    "birds",
    "and",
    "the",
    "slow",
    "turning",
    "of",
    "the",
    "lamp",
    "above",
    "a",
    "cold",
    "grey",
    "sea",
];

fn filler(nonce: u128, words: usize) -> String {
    // The nonce first: no prefix-cache hit from an earlier run or the calibration request.
    let mut s = format!("Log {nonce}:");
    for w in FILLER.iter().cycle().take(words) {
        s.push(' ');
        s.push_str(w);
    }
    s
}

fn nonce() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

/// A prompt of about `tokens` tokens: one short request measures the tokenizer's tokens per
/// filler word from its usage. The exact length is reported from the long request's usage.
async fn long_prompt(target: &Target, tokens: usize) -> anyhow::Result<String> {
    const SAMPLE_WORDS: usize = 200;
    let sample = filler(nonce(), SAMPLE_WORDS);
    let r = target.stream(&StreamRequest { prompt: sample, max_tokens: 1 }, StreamControl::default()).await;
    if let Some(e) = r.error {
        anyhow::bail!("calibrating the long prompt: {e}");
    }
    let measured = r.prompt_tokens.filter(|&n| n > 0).ok_or_else(|| anyhow::anyhow!("the server reported no prompt usage"))?;
    let words = (tokens as f64 * SAMPLE_WORDS as f64 / measured as f64).round().max(1.0) as usize;
    Ok(filler(nonce(), words))
}

/// Starts `n` streams of `max_tokens` each; their controls can stop them through `stop`.
fn start_streams(
    target: &Target,
    n: usize,
    prompt: &str,
    max_tokens: usize,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> (Vec<StreamControl>, Vec<tokio::task::JoinHandle<StreamRecord>>) {
    let mut controls = Vec::new();
    let mut handles = Vec::new();
    for _ in 0..n {
        let ctl = StreamControl::stoppable(stop.clone());
        controls.push(ctl.clone());
        let (t, req) = (target.clone(), StreamRequest { prompt: prompt.to_string(), max_tokens });
        handles.push(tokio::spawn(async move { t.stream(&req, ctl).await }));
    }
    (controls, handles)
}

pub async fn run(target: &Target, plan: &MixedPlan, stream_prompt: &str) -> anyhow::Result<MixedResult> {
    let long = long_prompt(target, plan.prompt_tokens).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (controls, handles) = start_streams(target, plan.streams, stream_prompt, plan.stream_tokens, &stop_rx);
    // Idle phase: every stream decoding, for idle_tokens each.
    let want = plan.idle_tokens.min(plan.stream_tokens);
    while controls.iter().any(|c| c.delivered() < want) {
        if handles.iter().any(|h| h.is_finished()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let long_record = target.stream(&StreamRequest { prompt: long, max_tokens: 1 }, StreamControl::default()).await;
    let _ = stop_tx.send(true);
    if let Some(e) = &long_record.error {
        eprintln!("mixed: the long prompt failed: {e}");
    }
    let mut streams = Vec::new();
    for h in handles {
        streams.push(h.await?);
    }
    let mut result = summarise(plan.streams, &streams, &long_record);
    if plan.control {
        if let Some(positions) = during_positions(&streams, &long_record) {
            // The same streams alone, to the last position that fell inside the prefill.
            let (_, never) = tokio::sync::watch::channel(false);
            let (_, handles) = start_streams(target, plan.streams, stream_prompt, positions.end + 1, &never);
            let mut alone = Vec::new();
            for h in handles {
                alone.push(h.await?);
            }
            result.errors += alone.iter().filter(|r| r.error.is_some()).count();
            let control = LatencySummary::of(alone.iter().flat_map(|r| samples_at(r, positions.clone())).collect());
            result.p99_ratio_control =
                (control.samples > 0 && control.p99_s > 0.0 && result.during.samples > 0).then(|| result.during.p99_s / control.p99_s);
            result.control = Some(control);
        }
    }
    Ok(result)
}

/// The positions (indices into `itl_samples`) of the streams' samples that fell inside the
/// long prompt's prefill, from the first to the last over all streams.
fn during_positions(streams: &[StreamRecord], long: &StreamRecord) -> Option<std::ops::Range<usize>> {
    let first = long.first_token_at()?;
    let inside = streams
        .iter()
        .flat_map(|r| r.itl_samples().into_iter().enumerate().filter(|(_, (at, _))| *at > long.sent && *at <= first).map(|(i, _)| i));
    let (lo, hi) = inside.fold((usize::MAX, 0), |(lo, hi), i| (lo.min(i), hi.max(i)));
    (lo <= hi).then_some(lo..hi + 1)
}

/// A stream's inter-token samples at `positions` (those it has).
fn samples_at(r: &StreamRecord, positions: std::ops::Range<usize>) -> Vec<f64> {
    r.itl_samples().into_iter().skip(positions.start).take(positions.len()).map(|(_, itl)| itl).collect()
}

/// Sorts the streams' samples into idle (after every stream had its first token, before the long
/// prompt was sent) and during (delivered after it was sent, up to its first token).
pub fn summarise(n_streams: usize, streams: &[StreamRecord], long: &StreamRecord) -> MixedResult {
    let errors = streams.iter().chain([long]).filter(|r| r.error.is_some()).count();
    let long_first = long.first_token_at();
    let all_started = streams.iter().map(|r| r.first_token_at()).collect::<Option<Vec<Instant>>>().and_then(|v| v.into_iter().max());
    let (mut idle, mut during) = (Vec::new(), Vec::new());
    for r in streams {
        for (at, itl) in r.itl_samples() {
            if all_started.is_some_and(|s| at > s) && at <= long.sent {
                idle.push(itl);
            } else if at > long.sent && long_first.is_some_and(|f| at <= f) {
                during.push(itl);
            }
        }
    }
    // A stream that was still running when stopped, or whose last token came after the long
    // prompt's first, decoded through the whole prefill.
    let outlasted = long_first.is_some_and(|f| streams.iter().all(|r| r.cancelled || r.deliveries.last().is_some_and(|d| d.at >= f)));
    let (idle, during) = (LatencySummary::of(idle), LatencySummary::of(during));
    let p99_ratio = (idle.samples > 0 && during.samples > 0 && idle.p99_s > 0.0).then(|| during.p99_s / idle.p99_s);
    MixedResult {
        protocol: String::new(),
        streams: n_streams,
        long_prompt_tokens: long.prompt_tokens.unwrap_or(0),
        long_ttft_s: long.ttft().unwrap_or(0.0),
        idle,
        during,
        p99_ratio,
        control: None,
        p99_ratio_control: None,
        streams_outlasted_prefill: outlasted,
        errors,
    }
}

#[cfg(test)]
mod tests {
    use super::super::stream::Delivery;
    use super::*;

    #[test]
    fn samples_are_sorted_by_when_they_arrived() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let stream = |starts: u64| {
            let mut r = StreamRecord::new(t0);
            // Every 10 ms until 100 ms, then 50 ms gaps while the long prompt prefills (100..200).
            for at in (starts..=100).step_by(10).chain([150, 200, 210]) {
                r.deliveries.push(Delivery { at: ms(at), tokens: 1 });
            }
            r.cancelled = true;
            r
        };
        let streams = [stream(20), stream(30)];
        let mut long = StreamRecord::new(ms(100));
        long.deliveries.push(Delivery { at: ms(200), tokens: 1 });
        long.prompt_tokens = Some(3000);
        let m = summarise(2, &streams, &long);
        // Idle: deliveries after 30 ms (both started) up to 100 ms: 7 + 7.
        assert_eq!(m.idle.samples, 14);
        assert!((m.idle.p99_s - 0.010).abs() < 1e-9);
        // During: 150 and 200 of each stream.
        assert_eq!(m.during.samples, 4);
        assert!((m.during.p99_s - 0.050).abs() < 1e-9);
        assert!((m.p99_ratio.unwrap() - 5.0).abs() < 1e-9);
        assert!((m.long_ttft_s - 0.1).abs() < 1e-9);
        assert_eq!(m.long_prompt_tokens, 3000);
        assert!(m.streams_outlasted_prefill);
        // A stream that finished before the long prompt's first token did not outlast it.
        let mut short = stream(20);
        short.cancelled = false;
        short.deliveries.retain(|d| d.at < ms(200));
        assert!(!summarise(2, &[short, stream(30)], &long).streams_outlasted_prefill);
    }

    #[test]
    fn the_control_takes_the_positions_that_fell_inside_the_prefill() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let record = |ats: &[u64]| {
            let mut r = StreamRecord::new(t0);
            r.deliveries.extend(ats.iter().map(|&at| Delivery { at: ms(at), tokens: 1 }));
            r
        };
        // Samples (gaps) end at 20, 30, 40, 90, 140, 150: indices 0..=5. The prefill runs from 35
        // to 140: the first stream's samples 2 (40), 3 (90) and 4 (140) fall inside it, the second's
        // (two tokens behind) 0 (40) to 2 (140): positions 0 to 4.
        let streams = [record(&[10, 20, 30, 40, 90, 140, 150]), record(&[30, 40, 90, 140, 150])];
        let mut long = StreamRecord::new(ms(35));
        long.deliveries.push(Delivery { at: ms(140), tokens: 1 });
        assert_eq!(during_positions(&streams, &long), Some(0..5));
        // The control's samples at those positions, whatever their times.
        let alone = record(&[0, 1, 3, 6, 10, 15, 21]);
        let gaps: Vec<f64> = samples_at(&alone, 1..5).iter().map(|g| (g * 1e3).round()).collect();
        assert_eq!(gaps, [2.0, 3.0, 4.0, 5.0]);
        assert_eq!(samples_at(&alone, 4..9).len(), 2, "only the samples the stream has");
        // No sample inside (the long prompt never answered): no control.
        assert_eq!(during_positions(&streams, &StreamRecord::new(ms(35))), None);
    }
}
