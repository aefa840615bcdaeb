//! A cost model of one engine step, learned online from measured step times, so the scheduler
//! can cut a long prompt's prefill chunk to what keeps the decoding streams' step short
//! (`engine.max_decode_slowdown`, see `scheduler::plan_step`).
//!
//! A step's time is modelled as `per_row * rows + per_kv * attended`, where `rows` are the
//! step's token rows (every matmul runs over each of them) and `attended` the KV positions its
//! rows attend to (a row at position p attends to p + 1 positions: attention, which grows along a
//! long prompt). The two coefficients are an exponentially weighted least-squares fit over the
//! recent steps (about the last 30), pulled gently towards a prior so that they stay defined
//! while the steps do not vary: the prior is cost proportional to `rows + kv_per_row *
//! attended`, with `kv_per_row` the ratio of attention to matmul multiply-adds of the model's
//! shape, scaled by the measured seconds per unit. Before any step is measured the prior alone
//! predicts (its scale is then unknown, but the scheduler only compares predictions).
//!
//! The reference a slowdown is relative to, the decode-only step, is measured rather than
//! predicted (an EWMA of decode-only steps' time per row, [`StepCost::decode_step`]): during a
//! long prefill every step is a mixed one, and the fit extrapolates decode-only steps poorly.
//! The planner lets a chunk through when the prefill rows' predicted cost fits in
//! (slowdown - 1) x that measured step.
//!
//! There is deliberately no fixed per-step term. Fitted on steps of about R rows, a real
//! overhead `a` lands in the per-row cost as `a / R`, so a prefill chunk's rows are predicted no
//! cheaper than they are and the planner errs towards smaller chunks. With an intercept in the fit,
//! steps of nearly constant rows (every step of a long prefill next to the same decoding streams)
//! cannot separate it from the per-row cost, and an overestimated intercept made the decode-only
//! step look dear and let oversized chunks through (seen on a small model).

/// The shape of a step (or of a part of one) that its cost depends on.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct StepShape {
    pub rows: usize,
    /// KV positions attended to, summed over the rows.
    pub attended: usize,
}

impl StepShape {
    /// `rows` consecutive rows of one sequence starting at position `start` (the positions
    /// already in its KV cache): row i attends to start + i + 1 positions.
    pub fn chunk(start: usize, rows: usize) -> StepShape {
        StepShape { rows, attended: rows * start + rows * (rows + 1) / 2 }
    }

    pub fn plus(self, o: StepShape) -> StepShape {
        StepShape { rows: self.rows + o.rows, attended: self.attended + o.attended }
    }
}

/// Feature scales: coefficients are fitted on features of order 1 (a step of ~16 rows, ~64k
/// attended positions), so the fit and its prior weigh them alike.
const ROW_SCALE: f64 = 16.0;
const KV_SCALE: f64 = 65536.0;
/// Weight of the past per observed step (memory of ~1 / (1 - DECAY) = 33 steps).
const DECAY: f64 = 0.97;
/// Strength of the pull towards the prior, in steps' worth of evidence at unit features.
const RIDGE: f64 = 0.05;
/// EWMA weight of the newest step in the prior's scale (seconds per unit of work).
const SCALE_ALPHA: f64 = 0.1;

/// The learned step cost model (see the module docs).
#[derive(Debug, Clone)]
pub(super) struct StepCost {
    /// Attention cost of one attended position relative to a row's matmuls (prior).
    kv_per_row: f64,
    /// Seconds per unit of prior work (`rows + kv_per_row * attended`), an EWMA; 0 before the
    /// first step.
    scale: f64,
    /// Exponentially weighted sums: X^T X and X^T y over the observed steps.
    xtx: [[f64; 2]; 2],
    xty: [f64; 2],
    /// The current fit (scaled features): per ROW_SCALE rows, per KV_SCALE positions.
    theta: [f64; 2],
    /// Seconds per row of the steps that only decoded, an EWMA; 0 before the first one.
    decode_row_seconds: f64,
}

impl StepCost {
    /// A model with no measurements yet; `kv_per_row` is the prior ratio of one attended
    /// position's cost to one row's ([`StepCost::kv_per_row_of_shape`]).
    pub fn new(kv_per_row: f64) -> StepCost {
        let kv_per_row = if kv_per_row.is_finite() && kv_per_row >= 0.0 { kv_per_row } else { 0.0 };
        let mut m = StepCost { kv_per_row, scale: 0.0, xtx: [[0.0; 2]; 2], xty: [0.0; 2], theta: [0.0; 2], decode_row_seconds: 0.0 };
        m.theta = m.prior();
        m
    }

    /// Fixed coefficients in seconds (tests).
    #[cfg(test)]
    pub fn fixed(per_row: f64, per_kv: f64) -> StepCost {
        let mut m = StepCost::new(0.0);
        m.theta = [per_row * ROW_SCALE, per_kv * KV_SCALE];
        m
    }

    /// The prior's attention-to-matmul ratio from a model's shape: a row costs about
    /// `matmul_params` multiply-adds, an attended position `2 * layers * heads * head_dim`
    /// (scores and the weighted sum of values).
    pub fn kv_per_row_of_shape(matmul_params: u64, layers: usize, heads: usize, head_dim: usize) -> f64 {
        if matmul_params == 0 {
            return 0.0;
        }
        (2 * layers * heads * head_dim) as f64 / matmul_params as f64
    }

    fn prior(&self) -> [f64; 2] {
        let s = if self.scale > 0.0 { self.scale } else { 1.0 };
        [s * ROW_SCALE, s * self.kv_per_row * KV_SCALE]
    }

    fn features(shape: StepShape) -> [f64; 2] {
        [shape.rows as f64 / ROW_SCALE, shape.attended as f64 / KV_SCALE]
    }

    /// Predicted seconds of a step of this shape.
    pub fn predict(&self, shape: StepShape) -> f64 {
        let x = Self::features(shape);
        self.theta[0] * x[0] + self.theta[1] * x[1]
    }

    /// Seconds of a decode-only step of `decode`: measured (the recent decode-only steps' time
    /// per row, times its rows) once such a step has run, else predicted. Measured because it
    /// is the reference a slowdown is relative to, and during a long prefill the fit only sees
    /// mixed steps, from which it extrapolates decode-only ones poorly.
    pub fn decode_step(&self, decode: StepShape) -> f64 {
        if self.decode_row_seconds > 0.0 {
            self.decode_row_seconds * decode.rows as f64
        } else {
            self.predict(decode)
        }
    }

    /// The current coefficients in seconds: (per row, per attended position).
    #[cfg(test)]
    pub fn coefficients(&self) -> (f64, f64) {
        (self.theta[0] / ROW_SCALE, self.theta[1] / KV_SCALE)
    }

    /// Learns from one measured step; `decode_only` when all its rows were decode rows.
    pub fn observe(&mut self, shape: StepShape, decode_only: bool, seconds: f64) {
        if shape.rows == 0 || !seconds.is_finite() || seconds <= 0.0 {
            return;
        }
        if decode_only {
            let per_row = seconds / shape.rows as f64;
            self.decode_row_seconds = if self.decode_row_seconds > 0.0 {
                self.decode_row_seconds + SCALE_ALPHA * (per_row - self.decode_row_seconds)
            } else {
                per_row
            };
        }
        let work = shape.rows as f64 + self.kv_per_row * shape.attended as f64;
        let unit = seconds / work;
        self.scale = if self.scale > 0.0 { self.scale + SCALE_ALPHA * (unit - self.scale) } else { unit };
        let x = Self::features(shape);
        for i in 0..2 {
            for j in 0..2 {
                self.xtx[i][j] = DECAY * self.xtx[i][j] + x[i] * x[j];
            }
            self.xty[i] = DECAY * self.xty[i] + x[i] * seconds;
        }
        self.refit();
    }

    /// Solves (X^T X + RIDGE I) theta = X^T y + RIDGE prior; a fit that is not usable (not
    /// finite, or a row that costs less than a tenth of the prior's) falls back to the prior.
    fn refit(&mut self) {
        let prior = self.prior();
        let mut a = self.xtx;
        let mut b = self.xty;
        for i in 0..2 {
            a[i][i] += RIDGE;
            b[i] += RIDGE * prior[i];
        }
        let theta = match solve2(a, b) {
            Some(t) if t.iter().all(|v| v.is_finite()) && t[0] >= 0.1 * prior[0] => t,
            _ => prior,
        };
        // A negative attention cost is noise: clamp (rows carry the rest).
        self.theta = [theta[0], theta[1].max(0.0)];
    }
}

/// Cramer's rule; None when singular (the ridge keeps the system regular).
fn solve2(a: [[f64; 2]; 2], b: [f64; 2]) -> Option<[f64; 2]> {
    let det = a[0][0] * a[1][1] - a[0][1] * a[1][0];
    if det.abs() < 1e-300 {
        return None;
    }
    Some([(b[0] * a[1][1] - a[0][1] * b[1]) / det, (a[0][0] * b[1] - a[1][0] * b[0]) / det])
}

#[cfg(test)]
mod tests {
    use super::{StepCost, StepShape};

    #[test]
    fn chunk_shapes_count_the_positions_each_row_attends_to() {
        assert_eq!(StepShape::chunk(0, 3), StepShape { rows: 3, attended: 1 + 2 + 3 });
        assert_eq!(StepShape::chunk(100, 2), StepShape { rows: 2, attended: 101 + 102 });
        assert_eq!(StepShape::chunk(7, 1).plus(StepShape::chunk(0, 1)), StepShape { rows: 2, attended: 9 });
    }

    /// The mixed scenario's step shapes: 4 decoding rows at growing positions, and from step 20
    /// on a long prompt's chunk of varying size alongside (every third step decode-only).
    fn mixed_shapes() -> impl Iterator<Item = (StepShape, StepShape)> {
        (0..200usize).map(|i| {
            let decode = (0..4).fold(StepShape::default(), |s, _| s.plus(StepShape::chunk(50 + i, 1)));
            let chunk = if i < 20 || i % 3 == 0 { StepShape::default() } else { StepShape::chunk(10 * i, 1 + i % 17) };
            (decode, chunk)
        })
    }

    #[test]
    fn the_fit_recovers_a_linear_cost_from_varied_steps() {
        // A machine whose steps cost 3 ms per row + 1 µs per attended position.
        let truth = StepCost::fixed(0.003, 1e-6);
        let mut m = StepCost::new(3e-4);
        for (decode, chunk) in mixed_shapes() {
            let shape = decode.plus(chunk);
            m.observe(shape, chunk.rows == 0, truth.predict(shape));
        }
        let (b, c) = m.coefficients();
        assert!((b - 0.003).abs() < 1e-4, "per row {b}");
        assert!((c - 1e-6).abs() < 5e-8, "per kv {c}");
    }

    #[test]
    fn a_fixed_step_overhead_makes_the_chunks_smaller_never_larger() {
        // The real cost has 5 ms of overhead per step, which the model has no term for: the
        // chunk it allows must still keep the real step within the factor of the real
        // decode-only step.
        let real = |s: StepShape| 0.005 + 0.003 * s.rows as f64 + 1e-6 * s.attended as f64;
        let mut m = StepCost::new(3e-4);
        for (decode, chunk) in mixed_shapes() {
            let shape = decode.plus(chunk);
            m.observe(shape, chunk.rows == 0, real(shape));
            // The largest chunk (of up to 64 rows at this position) the model lets through
            // under a factor of 2.
            let allowance = (2.0 - 1.0) * m.decode_step(decode);
            let start = 10 * 200;
            let rows = (1..=64).take_while(|&r| m.predict(StepShape::chunk(start, r)) <= allowance).last().unwrap_or(0);
            let step = decode.plus(StepShape::chunk(start, rows));
            assert!(real(step) <= 2.0 * real(decode) + 1e-12, "{rows} rows: {} vs {}", real(step), real(decode));
        }
    }

    #[test]
    fn identical_steps_keep_the_prior_shape_and_learn_its_scale() {
        // Only identical 4-row decode steps at 20 ms: the fit cannot separate rows from
        // attention, stays near the prior's proportions and predicts those steps right.
        let mut m = StepCost::new(0.0);
        let shape = StepShape { rows: 4, attended: 400 };
        for _ in 0..100 {
            m.observe(shape, true, 0.020);
        }
        assert!((m.predict(shape) - 0.020).abs() < 1e-3, "{}", m.predict(shape));
        assert!((m.decode_step(shape) - 0.020).abs() < 1e-9, "{}", m.decode_step(shape));
        assert!((m.decode_step(StepShape { rows: 2, attended: 0 }) - 0.010).abs() < 1e-9);
        let (per_row, _) = m.coefficients();
        assert!(per_row > 0.003, "per row {per_row}");
    }

    #[test]
    fn before_any_step_the_prior_is_proportional_to_work() {
        let m = StepCost::new(0.5);
        let one = m.predict(StepShape { rows: 1, attended: 0 });
        assert!(one > 0.0);
        assert!((m.predict(StepShape { rows: 4, attended: 0 }) - 4.0 * one).abs() < 1e-12);
        assert!((m.predict(StepShape { rows: 1, attended: 2 }) - 2.0 * one).abs() < 1e-12);
    }
}
