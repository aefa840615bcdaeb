//! Mixture-of-experts support of the GPU backends (qwen3moe, qwen2moe).
//!
//! `src/model/moe.rs` runs the MoE block through the Backend trait; what the GPU backend adds
//! for it lives here:
//! - The 3-D expert tensors (`ffn_{gate,up,down}_exps`) are not uploaded whole: `load_weight`
//!   gives a placeholder (`WeightData::Unsliced`) and `weight_rows` prepares each expert's rows
//!   as a weight of its own, in the same layouts as a dense matrix (raw blocks, int8 + scale
//!   planes, f16 copy), so the dense mat-vec and GEMM kernels run them unchanged and no view
//!   has to start on a tile or plane boundary.
//! - The routers (`ffn_gate_inp`, qwen2moe's `ffn_gate_inp_shexp`) stay f32 on the device and
//!   run through `moe_router_f32` (kernels/moe.hip), so the top-k choice (made on the host from
//!   the downloaded logits) sees logits close to the CPU's.
//! - Device routing (decode): `expert_table` uploads, per layer, tables of each expert's
//!   weight addresses (the per-expert weights above, nothing copied), and `routed_experts`
//!   runs `moe_topk` (the router's top-k and weights on the device), one `moe_matvec` launch
//!   for every (token, slot)'s gate and up, one for down (kernels/moe_matvec.hip, the dp4a
//!   mat-vec over device-side expert ids) and the weighted sum with the device-side weights:
//!   seven launches per MoE layer whatever the routing, no host round trip.
//! - `gather_rows` / `scatter_rows` of more than a few rows, `weighted_sum_rows` and
//!   `scale_rows` run as kernels over an uploaded index / weight list instead of the trait's
//!   host round trips. The weighted sum keeps ggml's order (kernels/moe.hip).

use super::*;

/// Row lists up to this long are moved with one device-to-device copy per row (recorded on the
/// tape: no upload, so a decode step's tape stays the same from step to step where the rows
/// do); longer lists with one `moe_gather_rows` / `moe_scatter_rows` launch over an uploaded
/// index list.
const COPY_MAX_ROWS: usize = 4;

/// Most experts `moe_topk` chooses among (kernels/moe.hip: 16 per lane of a 32-lane wave).
const TOPK_MAX_EXPERTS: usize = 512;

/// Most experts per token `moe_topk` chooses (one lane each).
const TOPK_MAX_USED: usize = 32;

/// One MoE layer's experts as the routed mat-vecs reach them (kernels/moe_matvec.hip).
pub struct ExpertTable {
    n_expert: usize,
    gate: ExpertMatrices,
    up: ExpertMatrices,
    down: ExpertMatrices,
}

/// One of an MoE layer's expert matrices (gate, up or down) for every expert: entry e of the
/// device tables is expert e's weight address (the int8 plane or the raw Q4_K blocks) and, for
/// the planes, its scale plane's. The addresses are of the per-expert weights, which the
/// model's `MoeWeights` keeps alive beside the table.
struct ExpertMatrices {
    kind: MatvecKind,
    rows: usize,
    cols: usize,
    w: DevBuf,
    s: Option<DevBuf>,
    /// The grouped prefill GEMM's operand per expert, where every expert has one.
    grouped: Option<GroupedOperand>,
    /// Each expert's f32 bias row (gpt-oss; `Backend::expert_biases`), added after the matrix.
    bias: Option<DevBuf>,
}

/// What the grouped GEMM reads for each expert of a matrix: a table of device pointers.
struct GroupedOperand {
    /// `moe_gemm_f16_64x64` (f16 copies) or `moe_gemm_q4k_64x64` (raw Q4_K blocks).
    kernel: &'static str,
    table: DevBuf,
}

impl ExpertMatrices {
    fn kernel(&self) -> &'static str {
        match (self.kind == MatvecKind::Q4KDp4a, self.lanes()) {
            (false, 32) => "moe_matvec_q8p_g32",
            (false, 64) => "moe_matvec_q8p_g64",
            (false, _) => "moe_matvec_q8p_g128",
            (true, 32) => "moe_matvec_q4k_g32",
            (true, 64) => "moe_matvec_q4k_g64",
            (true, _) => "moe_matvec_q4k_g128",
        }
    }

    /// Lanes per row, as the dense dp4a mat-vec picks them for rows of `cols` (16-value units
    /// for the planes, 32 for Q4_K).
    fn lanes(&self) -> usize {
        matvec_lanes(self.cols / if self.kind == MatvecKind::Q4KDp4a { 32 } else { 16 })
    }

    fn s_ptr(&self) -> DevicePtr {
        self.s.as_ref().map_or(0, |s| s.ptr)
    }

    fn bias_ptr(&self) -> DevicePtr {
        self.bias.as_ref().map_or(0, |b| b.ptr)
    }
}

/// Why a GPU backend refuses this model's experts, if it does: when `engine.gpu.moe` is off
/// (qwen3moe, qwen2moe and gpt-oss run otherwise; gpt-oss's MXFP4 experts as int8 planes).
pub(super) fn refusal(hp: &HParams, moe_enabled: bool) -> Option<String> {
    hp.moe.as_ref()?;
    (!moe_enabled).then(|| {
        format!(
            "{} is a mixture-of-experts model and engine.gpu.moe is false: use the CPU backend, \
             or set engine.gpu.moe = true (--gpu-moe)",
            hp.arch.name()
        )
    })
}

/// Whether a tensor is an MoE router, kept f32 on the device (`moe_router_f32`).
pub(super) fn is_router(name: &str) -> bool {
    name.ends_with(".ffn_gate_inp.weight") || name.ends_with(".ffn_gate_inp_shexp.weight")
}

impl<A: GpuApi> GpuBackend<A> {
    /// `bytes` uploaded into a pooled device buffer, queued after the work recorded so far.
    fn upload_list(&self, bytes: &[u8]) -> Result<DevBuf> {
        let buf = self.pooled_alloc(bytes.len())?;
        drop(self.fresh_q8.lock().take());
        // Recorded launches may still use the buffer the pool just handed out: queue them first
        // (the upload is ordered after them on the stream).
        self.flush()?;
        self.api.upload(buf.ptr, bytes)?;
        Ok(buf)
    }

    /// Rows `first_row..first_row + n_rows` of `w` prepared as a weight of their own, straight
    /// from the mapped file (one expert's matrix of a 3-D expert tensor).
    pub(super) fn weight_rows_prepared(&self, w: &GpuWeight, first_row: usize, n_rows: usize, name: &str) -> Result<GpuWeight> {
        let gw = &w.data;
        let info = &gw.file.tensors[gw.index];
        if first_row + n_rows > w.rows || n_rows == 0 {
            return Err(Error::invalid(
                self.be(),
                format!("rows {first_row}..{} of \"{}\" are outside its {} rows", first_row + n_rows, w.name, w.rows),
            ));
        }
        let bytes = gw.file.tensor_data(info);
        let row_bytes = bytes.len() / w.rows;
        let slice = &bytes[first_row * row_bytes..(first_row + n_rows) * row_bytes];
        let layout = self.prepare_rows(name, w.ggml_type, slice, n_rows, w.cols, false).while_doing(|| format!("uploading {name}"))?;
        Ok(Weight {
            name: name.to_string(),
            ggml_type: w.ggml_type,
            rows: n_rows,
            cols: w.cols,
            data: DeviceWeight { file: gw.file.clone(), index: gw.index, layout },
        })
    }

    /// `Backend::expert_table`: the tables of one layer's experts, or None where the routed
    /// mat-vecs have no build for them (not the dp4a family, a layout other than Q8_0 / Q5_0
    /// planes or Q4_K blocks, gate and up of different layouts, too many experts) or
    /// `GpuOptions::moe_device_routing` is off.
    pub(super) fn expert_table_dev(&self, gate: &[&GpuWeight], up: &[&GpuWeight], down: &[&GpuWeight]) -> Result<Option<ExpertTable>> {
        if !self.moe_device_routing
            || !matches!(self.matvec_family, MatvecFamily::Dp4a { .. })
            || gate.is_empty()
            || gate.len() > TOPK_MAX_EXPERTS
        {
            return Ok(None);
        }
        let matrices = |ws: &[&GpuWeight]| -> Result<Option<ExpertMatrices>> {
            let (rows, cols) = (ws[0].rows, ws[0].cols);
            let mut kinds = Vec::with_capacity(ws.len());
            for w in ws {
                match self.matvec_weight(w, 1) {
                    Some(m) if matches!(m.kind, MatvecKind::Q8Planes | MatvecKind::Q4KDp4a) && w.rows == rows && w.cols == cols => {
                        kinds.push(m)
                    }
                    _ => return Ok(None),
                }
            }
            let kind = kinds[0].kind;
            if kinds.iter().any(|m| m.kind != kind) {
                return Ok(None);
            }
            let table = |f: fn(&MatvecWeight) -> DevicePtr| kinds.iter().flat_map(|m| f(m).to_le_bytes()).collect::<Vec<u8>>();
            let w = self.upload_new(&table(|m| m.w))?;
            let s = if kind == MatvecKind::Q8Planes { Some(self.upload_new(&table(|m| m.s))?) } else { None };
            // Each expert's f16 copy, or all raw Q4_K blocks: the grouped GEMM's operand.
            let operand = |w: &GpuWeight| match &w.data.layout {
                WeightData::KQuant { f16: Some(f16), .. } | WeightData::F16(f16) => Some(("moe_gemm_f16_64x64", f16.ptr)),
                WeightData::KQuant { blocks, f16: None } if w.ggml_type == GgmlType::Q4_K => Some(("moe_gemm_q4k_64x64", blocks.ptr)),
                _ => None,
            };
            let operands = ws.iter().map(|w| operand(w)).collect::<Option<Vec<_>>>();
            let grouped = match operands {
                Some(ops) if ops.iter().all(|o| o.0 == ops[0].0) => Some(GroupedOperand {
                    kernel: ops[0].0,
                    table: self.upload_new(&ops.iter().flat_map(|o| o.1.to_le_bytes()).collect::<Vec<u8>>())?,
                }),
                _ => None,
            };
            Ok(Some(ExpertMatrices { kind, rows, cols, w, s, grouped, bias: None }))
        };
        let (Some(g), Some(u), Some(d)) = (matrices(gate)?, matrices(up)?, matrices(down)?) else {
            return Ok(None);
        };
        if g.kind != u.kind || g.cols != u.cols {
            return Ok(None);
        }
        Ok(Some(ExpertTable { n_expert: gate.len(), gate: g, up: u, down: d }))
    }

    /// `Backend::expert_biases`: each matrix's table of the experts' f32 bias rows (one-row
    /// weights, whole f32 on the device).
    pub(super) fn expert_biases_dev(
        &self,
        t: &mut ExpertTable,
        gate: &[&GpuWeight],
        up: &[&GpuWeight],
        down: &[&GpuWeight],
    ) -> Result<bool> {
        let table = |ws: &[&GpuWeight], width: usize| -> Result<Option<DevBuf>> {
            let mut ptrs = Vec::with_capacity(8 * ws.len());
            for w in ws {
                match &w.data.layout {
                    WeightData::Vector(v) if w.rows * w.cols == width => ptrs.extend(v.ptr.to_le_bytes()),
                    _ => return Ok(None),
                }
            }
            self.upload_new(&ptrs).map(Some)
        };
        if [gate.len(), up.len(), down.len()] != [t.n_expert; 3] {
            return Ok(false);
        }
        let (Some(g), Some(u), Some(d)) = (table(gate, t.gate.rows)?, table(up, t.up.rows)?, table(down, t.down.rows)?) else {
            return Ok(false);
        };
        (t.gate.bias, t.up.bias, t.down.bias) = (Some(g), Some(u), Some(d));
        Ok(true)
    }

    /// `Backend::routed_experts`: top-k, gate/up, SwiGLU + down, weighted sum, all on the
    /// device (seven launches with the two quantisers).
    pub(super) fn routed_experts_dev(&self, r: crate::backend::RoutedExperts<'_, Self>) -> Result<()> {
        use crate::model::{ExpertAct, Gating};
        let (p, t) = (r.params, r.table);
        let (n, k, d, ff) = (r.n, p.n_expert_used, r.dim, t.gate.rows);
        if k == 0 || k > TOPK_MAX_USED || k > p.n_expert || t.down.rows != d || t.gate.cols != d || t.down.cols != ff {
            return Err(Error::invalid(
                self.be(),
                format!("device routing of {k} of {} experts over an expert table of {ff} x {d}", p.n_expert),
            ));
        }
        let slots = n * k;
        let ids = r.choice.mem.ptr;
        let weights = ids + (slots * 4) as u64;
        let log = r.ids_log.0.mem.ptr + (r.ids_log.1 * 4) as u64;
        let router_bias = match r.router_bias {
            Some(b) if b.len() == p.n_expert => self.host_vector_on_device(b)?,
            Some(b) => return Err(Error::invalid(self.be(), format!("a router bias of {} for {} experts", b.len(), p.n_expert))),
            None => 0,
        };
        let gating = match p.gating {
            Gating::Softmax => 0,
            Gating::SoftmaxWeight => 1,
        };
        self.launch(
            "moe_topk",
            n,
            [n, 1, 1],
            Args::default()
                .ptr(r.logits.mem.ptr)
                .ptr(ids)
                .ptr(weights)
                .ptr(log)
                .i32(p.n_expert)
                .i32(k)
                .i32(gating)
                .i32(usize::from(p.norm_topk))
                .f32(p.weights_scale)
                .ptr(router_bias),
        )?;
        // Gate and up of every (token, slot), from the token's quantised input.
        let (xq, xds) = self.quantize_q8_1(r.x.mem.ptr, 0, n, n * d)?;
        let (g, u) = (&t.gate, &t.up);
        self.launch(
            g.kernel(),
            n,
            [(2 * ff).div_ceil(128 / g.lanes()), slots, 1],
            Args::default()
                .ptr(g.w.ptr)
                .ptr(g.s_ptr())
                .ptr(g.bias_ptr())
                .ptr(r.gate.mem.ptr)
                .i32(ff)
                .ptr(u.w.ptr)
                .ptr(u.s_ptr())
                .ptr(u.bias_ptr())
                .ptr(r.up.mem.ptr)
                .i32(ff)
                .ptr(ids)
                .ptr(xq.ptr)
                .ptr(xds.mem.ptr)
                .i32(d)
                .i32(k)
                .i32(0),
        )?;
        // Down of each slot's activation of (gate, up), in the quantiser.
        let act = match p.act {
            ExpertAct::SwiGlu => GatedAct::Silu,
            ExpertAct::SwiGluOai => GatedAct::SwiGluOai,
        };
        let (hq, hds) = self.quantize_q8_1_act(r.gate.mem.ptr, r.up.mem.ptr, act, n, slots * ff)?;
        let dn = &t.down;
        self.launch(
            dn.kernel(),
            n,
            [d.div_ceil(128 / dn.lanes()), slots, 1],
            Args::default()
                .ptr(dn.w.ptr)
                .ptr(dn.s_ptr())
                .ptr(dn.bias_ptr())
                .ptr(r.slots.mem.ptr)
                .i32(d)
                .ptr(0)
                .ptr(0)
                .ptr(0)
                .ptr(0)
                .i32(0)
                .ptr(ids)
                .ptr(hq.ptr)
                .ptr(hds.mem.ptr)
                .i32(ff)
                .i32(k)
                .i32(1),
        )?;
        self.launch(
            "moe_weighted_sum",
            n,
            [d.div_ceil(256), n, 1],
            Args::default().ptr(r.slots.mem.ptr).ptr(weights).ptr(r.out.mem.ptr).i32(k).i32(d),
        )
    }

    /// `Backend::grouped_experts`: the (token, slot) rows sorted by expert and gathered in one
    /// launch, gate / up / down as one `moe_gemm_f16_64x64` launch each over every expert's
    /// segment (the experts' f16 copies), SwiGLU, a scatter back to slot order and the weighted
    /// sum: nine launches per MoE layer instead of about seven per active expert. Per output
    /// element the arithmetic of `gemm_f16_64x64`, which the expert-by-expert path uses for
    /// experts with more rows than the mat-vecs take. Only where every expert matrix has an
    /// f16 copy (the K-quants).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn grouped_experts_dev(
        &self,
        t: &ExpertTable,
        experts: &[u32],
        weights: &[f32],
        k: usize,
        x: &GpuBuffer,
        n: usize,
        dim: usize,
        out: &mut GpuBuffer,
    ) -> Result<bool> {
        let (Some(gf), Some(uf), Some(df)) = (&t.gate.grouped, &t.up.grouped, &t.down.grouped) else {
            return Ok(false);
        };
        if t.gate.bias.is_some() {
            return Ok(false); // the grouped kernels add no biases
        }
        const TILE: usize = 64;
        let (ff, total) = (t.gate.rows, n * k);
        // Grid rows are one per routed row (gather, scatter): within the 65535 a grid allows.
        if total > 65535 {
            return Ok(false);
        }
        if experts.len() != total || weights.len() != total || t.down.rows != dim || t.gate.cols != dim {
            return Err(Error::invalid(self.be(), format!("grouped experts: {} routed rows for {n} tokens x {k}", experts.len())));
        }
        // Slot rows by expert, in slot order within an expert.
        let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); t.n_expert];
        for (i, &e) in experts.iter().enumerate() {
            by_expert.get_mut(e as usize).ok_or_else(|| Error::invalid(self.be(), format!("expert {e} of {}", t.n_expert)))?.push(i);
        }
        // One list: the token of each sorted row, its slot row, then (expert, first row, end) per tile.
        let mut list: Vec<i32> = Vec::with_capacity(2 * total + 3 * (total / TILE + t.n_expert));
        list.extend(by_expert.iter().flatten().map(|&i| (i / k) as i32));
        list.extend(by_expert.iter().flatten().map(|&i| i as i32));
        let mut start = 0;
        for (e, rows) in by_expert.iter().enumerate() {
            let end = start + rows.len();
            list.extend((start..end).step_by(TILE).flat_map(|m0| [e as i32, m0 as i32, end as i32]));
            start = end;
        }
        let tiles = (list.len() - 2 * total) / 3;
        let bytes: Vec<u8> = list.iter().flat_map(|v| v.to_le_bytes()).collect();
        let idx = self.upload_list(&bytes)?;
        let (gather, scatter, tile_map) = (idx.ptr, idx.ptr + (total * 4) as u64, idx.ptr + (2 * total * 4) as u64);
        let xs = self.scratch(total * dim, Elem::F32)?;
        self.launch(
            "moe_gather_rows",
            total,
            [dim.div_ceil(256), total, 1],
            Args::default().ptr(x.mem.ptr).ptr(gather).ptr(xs.mem.ptr).i32(dim),
        )?;
        let xh = self.to_f16(&xs, total * dim)?;
        let gemm = |a: &GpuBuffer, b: &GroupedOperand, c: &GpuBuffer, nn: usize, kk: usize| {
            self.launch(
                b.kernel,
                total,
                [nn.div_ceil(TILE), tiles, 1],
                Args::default().ptr(a.mem.ptr).ptr(b.table.ptr).ptr(c.mem.ptr).ptr(tile_map).i32(nn).i32(kk),
            )
        };
        let mut g = self.scratch(total * ff, Elem::F32)?;
        let u = self.scratch(total * ff, Elem::F32)?;
        gemm(&xh, gf, &g, ff, dim)?;
        gemm(&xh, uf, &u, ff, dim)?;
        self.silu_mul(&mut g, &u, total * ff)?;
        let gh = self.to_f16(&g, total * ff)?;
        let ys = self.scratch(total * dim, Elem::F32)?;
        gemm(&gh, df, &ys, dim, ff)?;
        let slots = self.scratch(total * dim, Elem::F32)?;
        self.launch(
            "moe_scatter_rows",
            total,
            [dim.div_ceil(256), total, 1],
            Args::default().ptr(ys.mem.ptr).ptr(scatter).ptr(slots.mem.ptr).i32(dim),
        )?;
        self.weighted_sum_rows_dev(&slots, weights, n, k, dim, out)?;
        Ok(true)
    }

    /// out[rows x w.rows] = x · wᵀ for an f32 weight kept whole (`is_router`).
    pub(super) fn router_matmul(&self, w: &GpuWeight, wv: &DevBuf, x: &GpuBuffer, rows: usize, out: &GpuBuffer) -> Result<()> {
        self.launch(
            "moe_router_f32",
            rows,
            [w.rows, rows, 1],
            Args::default().ptr(x.mem.ptr).ptr(wv.ptr).ptr(out.mem.ptr).i32(w.rows).i32(w.cols),
        )
    }

    /// `Backend::gather_rows`: copies for a few rows, else one kernel over an index list (dense
    /// models keep the copies when `engine.gpu.moe` is off).
    pub(super) fn gather_rows_dev(&self, src: &GpuBuffer, rows: &[usize], dim: usize, dst: &mut GpuBuffer) -> Result<()> {
        let (s, d) = (src.mem.ptr, dst.mem.ptr);
        if rows.len() <= COPY_MAX_ROWS || !self.moe {
            for (i, &r) in rows.iter().enumerate() {
                self.copy_op(d + (i * dim * 4) as u64, s + (r * dim * 4) as u64, dim * 4)?;
            }
            return Ok(());
        }
        let idx = rows.iter().map(|&r| i32::try_from(r).map(i32::to_le_bytes)).collect::<std::result::Result<Vec<_>, _>>();
        let idx = idx.map_err(|_| Error::invalid(self.be(), "a row index exceeds i32"))?.concat();
        let idx = self.upload_list(&idx)?;
        self.launch(
            "moe_gather_rows",
            rows.len(),
            [dim.div_ceil(256), rows.len(), 1],
            Args::default().ptr(s).ptr(idx.ptr).ptr(d).i32(dim),
        )?;
        Ok(())
    }

    /// `Backend::scatter_rows`: copies for a few rows, else one kernel over an index list.
    pub(super) fn scatter_rows_dev(&self, src: &GpuBuffer, rows: &[u32], dim: usize, dst: &mut GpuBuffer) -> Result<()> {
        let (s, d) = (src.mem.ptr, dst.mem.ptr);
        if rows.len() <= COPY_MAX_ROWS {
            for (i, &r) in rows.iter().enumerate() {
                self.copy_op(d + (r as usize * dim * 4) as u64, s + (i * dim * 4) as u64, dim * 4)?;
            }
            return Ok(());
        }
        let idx: Vec<u8> = rows.iter().flat_map(|&r| r.to_le_bytes()).collect();
        let idx = self.upload_list(&idx)?;
        self.launch(
            "moe_scatter_rows",
            rows.len(),
            [dim.div_ceil(256), rows.len(), 1],
            Args::default().ptr(s).ptr(idx.ptr).ptr(d).i32(dim),
        )?;
        Ok(())
    }

    /// `Backend::weighted_sum_rows` on the device (ggml's order of additions).
    pub(super) fn weighted_sum_rows_dev(
        &self,
        src: &GpuBuffer,
        weights: &[f32],
        n: usize,
        k: usize,
        dim: usize,
        out: &mut GpuBuffer,
    ) -> Result<()> {
        debug_assert_eq!(weights.len(), n * k);
        let w = self.upload_list(bytemuck_f32(weights))?;
        self.launch(
            "moe_weighted_sum",
            n,
            [dim.div_ceil(256), n, 1],
            Args::default().ptr(src.mem.ptr).ptr(w.ptr).ptr(out.mem.ptr).i32(k).i32(dim),
        )?;
        Ok(())
    }

    /// `Backend::scale_rows` on the device.
    pub(super) fn scale_rows_dev(&self, x: &mut GpuBuffer, scales: &[f32], dim: usize) -> Result<()> {
        let s = self.upload_list(bytemuck_f32(scales))?;
        self.launch(
            "moe_scale_rows",
            scales.len(),
            [dim.div_ceil(256), scales.len(), 1],
            Args::default().ptr(x.mem.ptr).ptr(s.ptr).i32(dim),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::gguf::{GgmlType, GgufFile};
    use crate::model::HParams;
    use crate::synth::{synth_model, SynthSpec};

    fn hparams(arch: &str) -> HParams {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let quant = if arch == "gpt-oss" { GgmlType::MXFP4 } else { GgmlType::Q8_0 };
        synth_model(&SynthSpec::preset(arch, quant, "tiny").unwrap(), &path).unwrap();
        HParams::from_gguf(&GgufFile::open(&path).unwrap()).unwrap()
    }

    #[test]
    fn moe_models_are_refused_only_when_switched_off() {
        for arch in ["qwen3moe", "qwen2moe", "gpt-oss"] {
            let hp = hparams(arch);
            let why = super::refusal(&hp, false).expect("refused without the opt-in");
            assert!(why.contains("engine.gpu.moe"), "{why}");
            assert_eq!(super::refusal(&hp, true), None, "{arch} with the opt-in");
        }
        assert_eq!(super::refusal(&hparams("qwen3"), false), None, "dense models are not affected");
    }

    #[test]
    fn routers_are_recognised_by_name() {
        assert!(super::is_router("blk.3.ffn_gate_inp.weight"));
        assert!(super::is_router("blk.0.ffn_gate_inp_shexp.weight"));
        assert!(!super::is_router("blk.0.ffn_gate_exps.weight"));
        assert!(!super::is_router("blk.0.ffn_gate.weight"));
    }
}
