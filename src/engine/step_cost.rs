//! A cost model of one engine step, learned online from measured step times, so the scheduler
//! can cut a long prompt's prefill chunk to what keeps the decoding streams' step short
//! (`engine.max_decode_slowdown`, see `scheduler::plan_step`).
//!
//! A step's time is modelled as `overhead + per_row * rows + per_kv * attended`, where `rows`
//! are the step's token rows (every matmul runs over each of them) and `attended` the KV
//! positions its rows attend to (a row at position p attends to p + 1 positions: the cost of
//! attention, which grows with a long prompt's chunks). The three coefficients are an
//! exponentially weighted least-squares fit over the recent steps (about the last 30), pulled
//! gently towards a prior so that they stay defined while the steps do not vary (all decode
//! steps have the same rows): the prior is cost proportional to `rows + kv_per_row * attended`,
//! with `kv_per_row` the ratio of attention to matmul multiply-adds of the model's shape, scaled
//! by the measured seconds per unit. Before any step is measured the prior alone predicts (its
//! scale is then unknown but the scheduler only compares predictions with each other).

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
    xtx: [[f64; 3]; 3],
    xty: [f64; 3],
    /// The current fit (scaled features): overhead, per ROW_SCALE rows, per KV_SCALE positions.
    theta: [f64; 3],
}

impl StepCost {
    /// A model with no measurements yet; `kv_per_row` is the prior ratio of one attended
    /// position's cost to one row's ([`StepCost::kv_per_row_of_shape`]).
    pub fn new(kv_per_row: f64) -> StepCost {
        let kv_per_row = if kv_per_row.is_finite() && kv_per_row >= 0.0 { kv_per_row } else { 0.0 };
        let mut m = StepCost { kv_per_row, scale: 0.0, xtx: [[0.0; 3]; 3], xty: [0.0; 3], theta: [0.0; 3] };
        m.theta = m.prior();
        m
    }

    /// Fixed coefficients in seconds (tests, and what the fit is compared against).
    #[cfg(test)]
    pub fn fixed(overhead: f64, per_row: f64, per_kv: f64) -> StepCost {
        let mut m = StepCost::new(0.0);
        m.theta = [overhead, per_row * ROW_SCALE, per_kv * KV_SCALE];
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

    fn prior(&self) -> [f64; 3] {
        let s = if self.scale > 0.0 { self.scale } else { 1.0 };
        [0.0, s * ROW_SCALE, s * self.kv_per_row * KV_SCALE]
    }

    fn features(shape: StepShape) -> [f64; 3] {
        [1.0, shape.rows as f64 / ROW_SCALE, shape.attended as f64 / KV_SCALE]
    }

    /// Predicted seconds of a step of this shape.
    pub fn predict(&self, shape: StepShape) -> f64 {
        let x = Self::features(shape);
        (0..3).map(|i| self.theta[i] * x[i]).sum()
    }

    /// The current coefficients in seconds: (overhead, per row, per attended position).
    pub fn coefficients(&self) -> (f64, f64, f64) {
        (self.theta[0], self.theta[1] / ROW_SCALE, self.theta[2] / KV_SCALE)
    }

    /// Learns from one measured step.
    pub fn observe(&mut self, shape: StepShape, seconds: f64) {
        if shape.rows == 0 || !seconds.is_finite() || seconds <= 0.0 {
            return;
        }
        let work = shape.rows as f64 + self.kv_per_row * shape.attended as f64;
        let unit = seconds / work;
        self.scale = if self.scale > 0.0 { self.scale + SCALE_ALPHA * (unit - self.scale) } else { unit };
        let x = Self::features(shape);
        for i in 0..3 {
            for j in 0..3 {
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
        for i in 0..3 {
            a[i][i] += RIDGE;
            b[i] += RIDGE * prior[i];
        }
        let theta = match solve3(a, b) {
            Some(t) if t.iter().all(|v| v.is_finite()) && t[1] >= 0.1 * prior[1] => t,
            _ => prior,
        };
        // Negative overhead or attention cost is noise: clamp (rows carry the rest).
        self.theta = [theta[0].max(0.0), theta[1], theta[2].max(0.0)];
    }
}

/// Gaussian elimination with partial pivoting; None when singular.
fn solve3(mut a: [[f64; 3]; 3], mut b: [f64; 3]) -> Option<[f64; 3]> {
    for col in 0..3 {
        let pivot = (col..3).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        for row in col + 1..3 {
            let f = a[row][col] / a[col][col];
            for k in col..3 {
                a[row][k] -= f * a[col][k];
            }
            b[row] -= f * b[col];
        }
    }
    let mut x = [0.0; 3];
    for row in (0..3).rev() {
        let s: f64 = (row + 1..3).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - s) / a[row][row];
    }
    Some(x)
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

    #[test]
    fn the_fit_recovers_a_linear_cost_from_varied_steps() {
        // A machine whose steps cost 4 ms + 3 ms per row + 1 µs per attended position.
        let truth = StepCost::fixed(0.004, 0.003, 1e-6);
        let mut m = StepCost::new(3e-4);
        // Decode-only steps of 4 rows, then a long prompt's chunks of varying size at growing
        // positions alongside them (the mixed scenario's shapes).
        for i in 0..200usize {
            let decode = (0..4).fold(StepShape::default(), |s, _| s.plus(StepShape::chunk(50 + i, 1)));
            let shape = if i % 3 == 0 { decode } else { decode.plus(StepShape::chunk(10 * i, 1 + i % 17)) };
            m.observe(shape, truth.predict(shape));
        }
        let (a, b, c) = m.coefficients();
        assert!((a - 0.004).abs() < 4e-4, "overhead {a}");
        assert!((b - 0.003).abs() < 3e-4, "per row {b}");
        assert!((c - 1e-6).abs() < 1e-7, "per kv {c}");
    }

    #[test]
    fn identical_steps_keep_the_prior_shape_and_learn_its_scale() {
        // Only 4-row decode steps at 20 ms: the fit cannot separate overhead from rows, so it
        // stays near the prior (no overhead) and predicts those steps right.
        let mut m = StepCost::new(0.0);
        let shape = StepShape { rows: 4, attended: 400 };
        for _ in 0..100 {
            m.observe(shape, 0.020);
        }
        assert!((m.predict(shape) - 0.020).abs() < 1e-3, "{}", m.predict(shape));
        let (_, per_row, _) = m.coefficients();
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
