//! Dumps the intermediate tensors of civetta's forward pass over one prompt, in op order, for
//! comparison with llama.cpp's cb_eval dump of the same prompt (docs/REFERENCE.md).
//!
//! A `Backend` wrapper around the CPU backend reads each op's output back after the op.
//!
//! usage: dump_forward MODEL ID,ID,... OUTDIR [THREADS]
//! OUTDIR/index.txt: "<seq> <op> <elements>", OUTDIR/<seq>.bin: the f32 values.

use civetta::backend::{AttentionShape, Backend, RopeStyle, WeightOf};
use civetta::gguf::{GgmlType, GgufFile};
use civetta::model::{HParams, Logits, Model};
use parking_lot::Mutex;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

/// Implements the primitive ops only, on purpose (unlike the tests' delegating backend,
/// tests/common/delegate.rs, which forwards every method): the trait's default bodies of the
/// fused ops (`matmul_add`, `rope_qk`, `kv_store_attention`, ...) then run as the primitive
/// calls they stand for, through this wrapper, so each intermediate tensor is dumped as
/// llama.cpp's graph names it. The defaults give the fused ops' numbers (the trait's contract).
struct Tap<B: Backend> {
    inner: Arc<B>,
    dir: PathBuf,
    seq: Mutex<(usize, std::fs::File)>,
}

impl<B: Backend> Tap<B> {
    fn dump(&self, op: &str, b: &B::Buffer, offset: usize, len: usize) -> civetta::backend::Result<()> {
        let mut v = vec![0f32; len];
        self.inner.read(b, offset, &mut v)?;
        let mut s = self.seq.lock();
        let n = s.0;
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(self.dir.join(format!("{n:04}.bin")), bytes).unwrap();
        writeln!(s.1, "{n:04} {op} {len}").unwrap();
        s.0 += 1;
        Ok(())
    }
}

impl<B: Backend> Backend for Tap<B> {
    type Buffer = B::Buffer;
    type KvBuffer = B::KvBuffer;
    type WeightData = B::WeightData;
    type ExpertTable = B::ExpertTable;

    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn variant(&self) -> &'static str {
        self.inner.variant()
    }
    fn supports(&self, t: GgmlType) -> bool {
        self.inner.supports(t)
    }
    fn check_model(&self, hp: &HParams) -> civetta::backend::Result<()> {
        self.inner.check_model(hp)
    }
    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> civetta::backend::Result<WeightOf<Self>> {
        self.inner.load_weight(file, name)
    }
    fn alloc(&self, len: usize) -> civetta::backend::Result<Self::Buffer> {
        self.inner.alloc(len)
    }
    fn alloc_kv_cache(&self, len: usize) -> civetta::backend::Result<Self::KvBuffer> {
        self.inner.alloc_kv_cache(len)
    }
    fn kv_cache_elem_bytes(&self) -> usize {
        self.inner.kv_cache_elem_bytes()
    }
    fn write(&self, dst: &mut Self::Buffer, offset: usize, src: &[f32]) -> civetta::backend::Result<()> {
        self.inner.write(dst, offset, src)
    }
    fn read(&self, src: &Self::Buffer, offset: usize, dst: &mut [f32]) -> civetta::backend::Result<()> {
        self.inner.read(src, offset, dst)
    }
    fn embed(&self, table: &WeightOf<Self>, tokens: &[u32], out: &mut Self::Buffer) -> civetta::backend::Result<()> {
        self.inner.embed(table, tokens, out)?;
        self.dump("embed", out, 0, tokens.len() * table.cols)?;
        Ok(())
    }
    fn rmsnorm(
        &self,
        x: &Self::Buffer,
        w: &WeightOf<Self>,
        rows: usize,
        dim: usize,
        eps: f32,
        out: &mut Self::Buffer,
    ) -> civetta::backend::Result<()> {
        self.inner.rmsnorm(x, w, rows, dim, eps, out)?;
        self.dump(&format!("rmsnorm:{}", w.name), out, 0, rows * dim)?;
        Ok(())
    }
    fn rmsnorm_inplace(&self, x: &mut Self::Buffer, w: &WeightOf<Self>, rows: usize, dim: usize, eps: f32) -> civetta::backend::Result<()> {
        self.inner.rmsnorm_inplace(x, w, rows, dim, eps)?;
        self.dump(&format!("rmsnorm:{}", w.name), x, 0, rows * dim)?;
        Ok(())
    }
    fn matmul(&self, w: &WeightOf<Self>, x: &Self::Buffer, rows: usize, out: &mut Self::Buffer) -> civetta::backend::Result<()> {
        self.inner.matmul(w, x, rows, out)?;
        self.dump(&format!("matmul:{}", w.name), out, 0, rows * w.rows)?;
        Ok(())
    }
    fn matmul_many(
        &self,
        ws: &[&WeightOf<Self>],
        x: &Self::Buffer,
        rows: usize,
        outs: &mut [&mut Self::Buffer],
    ) -> civetta::backend::Result<()> {
        self.inner.matmul_many(ws, x, rows, outs)?;
        for (w, o) in ws.iter().zip(outs.iter()) {
            self.dump(&format!("matmul:{}", w.name), o, 0, rows * w.rows)?;
        }
        Ok(())
    }
    fn add_bias(&self, x: &mut Self::Buffer, b: &WeightOf<Self>, rows: usize) -> civetta::backend::Result<()> {
        self.inner.add_bias(x, b, rows)
    }
    fn rope(
        &self,
        x: &mut Self::Buffer,
        positions: &[u32],
        n_heads: usize,
        head_dim: usize,
        freq_base: f32,
        style: RopeStyle,
    ) -> civetta::backend::Result<()> {
        self.inner.rope(x, positions, n_heads, head_dim, freq_base, style)?;
        self.dump(&format!("rope:{freq_base}"), x, 0, positions.len() * n_heads * head_dim)?;
        Ok(())
    }
    #[allow(clippy::too_many_arguments)]
    fn kv_store(
        &self,
        k: &Self::Buffer,
        v: &Self::Buffer,
        kc: &mut Self::KvBuffer,
        vc: &mut Self::KvBuffer,
        src_row: usize,
        start: usize,
        n: usize,
        kvd: usize,
    ) -> civetta::backend::Result<()> {
        self.inner.kv_store(k, v, kc, vc, src_row, start, n, kvd)
    }
    fn attention(
        &self,
        q: &Self::Buffer,
        k_cache: &Self::KvBuffer,
        v_cache: &Self::KvBuffer,
        s: AttentionShape,
        out: &mut Self::Buffer,
    ) -> civetta::backend::Result<()> {
        self.inner.attention(q, k_cache, v_cache, s, out)?;
        let w = s.n_head * s.head_dim;
        self.dump(&format!("attention:window={:?}", s.window), out, s.first_row * w, s.n_tokens * w)?;
        Ok(())
    }
    fn silu_mul(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> civetta::backend::Result<()> {
        self.inner.silu_mul(gate, up, n)
    }
    fn gelu_tanh_mul(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> civetta::backend::Result<()> {
        self.inner.gelu_tanh_mul(gate, up, n)?;
        self.dump("geglu", gate, 0, n)?;
        Ok(())
    }
    fn scale(&self, x: &mut Self::Buffer, n: usize, s: f32) -> civetta::backend::Result<()> {
        self.inner.scale(x, n, s)?;
        self.dump("scale", x, 0, n)?;
        Ok(())
    }
    fn add(&self, x: &mut Self::Buffer, y: &Self::Buffer, n: usize) -> civetta::backend::Result<()> {
        self.inner.add(x, y, n)?;
        self.dump("add", x, 0, n)?;
        Ok(())
    }
    fn copy_row(&self, src: &Self::Buffer, src_row: usize, dim: usize, dst: &mut Self::Buffer) -> civetta::backend::Result<()> {
        self.inner.copy_row(src, src_row, dim, dst)
    }
    fn gather_rows(&self, src: &Self::Buffer, rows: &[usize], dim: usize, dst: &mut Self::Buffer) -> civetta::backend::Result<()> {
        self.inner.gather_rows(src, rows, dim, dst)
    }
    fn run(&self, pass: &mut (dyn FnMut() + Send)) {
        self.inner.run(pass)
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() >= 4, "usage: dump_forward MODEL ID,ID,... OUTDIR [THREADS]");
    let tokens: Vec<u32> = args[2].split(',').map(|s| s.trim().parse()).collect::<Result<_, _>>()?;
    let dir = PathBuf::from(&args[3]);
    std::fs::create_dir_all(&dir)?;
    let threads = args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(2);
    let index = std::fs::File::create(dir.join("index.txt"))?;
    let tap = Arc::new(Tap { inner: civetta::backend::create_cpu(threads)?, dir, seq: Mutex::new((0, index)) });
    let model = Model::load(Arc::new(GgufFile::open(std::path::Path::new(&args[1]))?), tap)?;
    let mut cache = model.new_cache(tokens.len() + 1)?;
    let logits = model.forward(&mut cache, &tokens, Logits::Last)?;
    let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(PathBuf::from(&args[3]).join("logits.bin"), bytes)?;
    Ok(())
}
