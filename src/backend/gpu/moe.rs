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
//! - `gather_rows` / `scatter_rows` of more than a few rows, `weighted_sum_rows` and
//!   `scale_rows` run as kernels over an uploaded index / weight list instead of the trait's
//!   host round trips. The weighted sum keeps ggml's order (kernels/moe.hip).

use super::*;

/// Row lists up to this long are moved with one device-to-device copy per row (recorded on the
/// tape: no upload, so a decode step's tape stays the same from step to step where the rows
/// do); longer lists with one `moe_gather_rows` / `moe_scatter_rows` launch over an uploaded
/// index list.
const COPY_MAX_ROWS: usize = 4;

/// Why a GPU backend refuses this model's experts, if it does: gpt-oss (MXFP4 experts, expert
/// biases, attention sinks) always; qwen3moe and qwen2moe when `engine.gpu.moe` is off.
pub(super) fn refusal(hp: &HParams, moe_enabled: bool) -> Option<String> {
    use crate::model::Arch;
    hp.moe.as_ref()?;
    match hp.arch {
        Arch::Qwen3Moe | Arch::Qwen2Moe if moe_enabled => None,
        Arch::Qwen3Moe | Arch::Qwen2Moe => Some(format!(
            "{} is a mixture-of-experts model and engine.gpu.moe is false: use the CPU backend, \
             or set engine.gpu.moe = true (--gpu-moe)",
            hp.arch.name()
        )),
        _ => Some(format!("{} (MXFP4 experts, expert biases, attention sinks) runs on the CPU backend only so far", hp.arch.name())),
    }
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
    fn moe_models_are_refused_only_when_switched_off_and_gpt_oss_always() {
        for arch in ["qwen3moe", "qwen2moe"] {
            let hp = hparams(arch);
            let why = super::refusal(&hp, false).expect("refused without the opt-in");
            assert!(why.contains("engine.gpu.moe"), "{why}");
            assert_eq!(super::refusal(&hp, true), None, "{arch} with the opt-in");
        }
        let why = super::refusal(&hparams("gpt-oss"), true).expect("gpt-oss is refused");
        assert!(why.contains("CPU backend only"), "{why}");
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
