//! The CUDA backend's row ops: softmax and log-softmax, cross-entropy and its gradient, layer norm,
//! embeddings and their gradient, max along a dimension and its gradient, and the per-tensor
//! optimizer steps (`adam_step`, `sgd_step`).

use super::*;

impl CudaStorage {
    pub(super) fn rows_cfg(rows: usize) -> Result<LaunchConfig> {
        let r = u32::try_from(rows).map_err(|_| Error::shape("rows", format!("{rows} rows exceed u32")))?;
        Ok(LaunchConfig { grid_dim: (r, 1, 1), block_dim: (ROW_THREADS, 1, 1), shared_mem_bytes: 0 })
    }

    /// Softmax or log-softmax of each row of `d`.
    pub fn softmax(&self, d: usize, log: bool) -> Result<CudaStorage> {
        let buf = f32_or_b16!(self, |x| self.softmax_b16(x, d, log));
        let rows = self.len() / d;
        let mut out = Self::output(&self.dev, self.len())?;
        if rows == 0 {
            return Ok(out);
        }
        // SAFETY: rows * d elements in and out.
        unsafe {
            self.dev.launch(
                k::SoftmaxRowsF32,
                Self::rows_cfg(rows)?,
                (buf.ptr(), out.f32_mut().ptr_mut(), d as u32, log as u32),
            )?
        };
        Ok(out)
    }

    /// Mean cross-entropy of (n, c) logits against `targets` (already range-checked; `copy` keeps
    /// their device copy).
    pub(crate) fn cross_entropy(&self, targets: &[usize], copy: &DeviceIndices, c: usize) -> Result<CudaStorage> {
        let buf = f32_or_b16!(self, |x| self.cross_entropy_b16(x, targets, copy, c));
        let n = targets.len();
        let t = copy.on(&self.dev, targets, "cross_entropy")?;
        let mut rows = Self::output(&self.dev, n)?;
        // SAFETY: n rows of c logits; one target per row, each < c.
        unsafe {
            self.dev.launch(
                k::CrossEntropyRowsF32,
                Self::rows_cfg(n)?,
                (buf.ptr(), t.ptr(), rows.f32_mut().ptr_mut(), c as u32),
            )?
        };
        // The mean in one launch: one block (of 1024 threads, the most it takes) sums the row losses
        // in a fixed order and scales by 1 / n.
        let mut mean = Self::output(&self.dev, 1)?;
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: `rows` holds n elements; `mean` one slot for the single block.
        let rows = rows.f32_mut();
        unsafe {
            self.dev.launch(ReduceSumF32, cfg, (rows.ptr(), mean.f32_mut().ptr_mut(), n as u32, 1.0 / n as f32))?
        };
        Ok(mean)
    }

    /// The gradient of the mean cross-entropy of (n, c) logits (`self`) for upstream gradient `g`
    /// (a one-element storage), fused: (softmax - one-hot) * g / n.
    pub(crate) fn cross_entropy_backward(
        &self,
        targets: &[usize],
        copy: &DeviceIndices,
        c: usize,
        g: &CudaStorage,
    ) -> Result<CudaStorage> {
        let (x, gb) = match (&self.data, &g.data) {
            (CudaData::F32(x), CudaData::F32(gb)) => (x, gb),
            (CudaData::BF16(x), CudaData::BF16(gb)) => return self.cross_entropy_backward_b16(x, targets, copy, c, gb),
            (CudaData::F16(x), CudaData::F16(gb)) => return self.cross_entropy_backward_b16(x, targets, copy, c, gb),
            _ => return Err(Error::DType { op: "cross_entropy backward", got: g.dtype(), expected: self.dtype() }),
        };
        let n = targets.len();
        let t = copy.on(&self.dev, targets, "cross_entropy backward")?;
        let mut grad = Self::output(&self.dev, n * c)?;
        let cfg = Self::rows_cfg(n)?;
        // SAFETY: n rows of c logits and gradients; one target (< c) per row; g holds one element.
        unsafe {
            self.dev.launch(
                k::CrossEntropyBackwardRowsF32,
                cfg,
                (x.ptr(), t.ptr(), gb.ptr(), grad.f32_mut().ptr_mut(), c as u32, 1.0 / n as f32),
            )?
        };
        Ok(grad)
    }

    /// Layer norm rows of `d`: (out, mean, rstd).
    pub fn layer_norm(
        &self,
        w: &CudaStorage,
        b: &CudaStorage,
        d: usize,
        eps: f64,
    ) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
        let (xb, wb, bb) = match (&self.data, &w.data, &b.data) {
            (CudaData::F32(x), CudaData::F32(w), CudaData::F32(b)) => (x, w, b),
            (CudaData::BF16(x), CudaData::BF16(w), CudaData::BF16(b)) => return self.layer_norm_b16(x, w, b, d, eps),
            (CudaData::F16(x), CudaData::F16(w), CudaData::F16(b)) => return self.layer_norm_b16(x, w, b, d, eps),
            _ => {
                let got = if w.dtype() != self.dtype() { w.dtype() } else { b.dtype() };
                return Err(Error::DType { op: "layer_norm", got, expected: self.dtype() });
            }
        };
        let rows = self.len() / d;
        let mut out = Self::output(&self.dev, self.len())?;
        let mut mean = Self::output(&self.dev, rows)?;
        let mut rstd = Self::output(&self.dev, rows)?;
        if rows == 0 {
            return Ok((out, mean, rstd));
        }
        // SAFETY: rows * d in and out; one mean and rstd per row; w and b hold d.
        unsafe {
            self.dev.launch(
                k::LayerNormRowsF32,
                Self::rows_cfg(rows)?,
                (
                    xb.ptr(),
                    wb.ptr(),
                    bb.ptr(),
                    out.f32_mut().ptr_mut(),
                    mean.f32_mut().ptr_mut(),
                    rstd.f32_mut().ptr_mut(),
                    d as u32,
                    eps as f32,
                ),
            )?
        };
        Ok((out, mean, rstd))
    }

    /// Rows of the (v, d) table `self` for `ids` (already range-checked).
    pub fn embedding(&self, ids: &[usize], d: usize) -> Result<CudaStorage> {
        let buf = f32_or_b16!(self, |x| self.embedding_b16(x, ids, d));
        let dev_ids = self.dev.upload(&u32s("embedding", ids)?)?;
        let mut out = Self::output(&self.dev, ids.len() * d)?;
        if !ids.is_empty() && d > 0 {
            let (_, cfg) = grid(ids.len() * d, "embedding")?;
            // SAFETY: every id < v; out holds n * d.
            unsafe {
                self.dev.launch(
                    k::EmbeddingGatherF32,
                    cfg,
                    (buf.ptr(), dev_ids.ptr(), out.f32_mut().ptr_mut(), ids.len() as u32, d as u32),
                )?
            };
        }
        Ok(out)
    }

    /// The embedding gradient: rows of `self` (n, d) summed per id into a (v, d) table, in position
    /// order (positions are bucketed by id on the host: a counting sort).
    pub fn embedding_backward(&self, ids: &[usize], v: usize, d: usize) -> Result<CudaStorage> {
        let (order, offsets) = bucket_by_id(ids, v);
        let buf = f32_or_b16!(self, |x| self.embedding_backward_b16(x, &order, &offsets, v, d));
        let (o, off) = (self.dev.upload(&order)?, self.dev.upload(&offsets)?);
        let mut gw = Self::output(&self.dev, v * d)?;
        if v * d > 0 {
            let (_, cfg) = grid(v * d, "embedding backward")?;
            // SAFETY: offsets index `order`, whose entries index rows of self.
            unsafe {
                self.dev.launch(
                    k::EmbeddingScatterF32,
                    cfg,
                    (buf.ptr(), o.ptr(), off.ptr(), gw.f32_mut().ptr_mut(), v as u32, d as u32),
                )?
            };
        }
        Ok(gw)
    }

    /// Maximum along the middle of (outer, len, inner): values and the input offset of each.
    pub fn max_dim(&self, outer: usize, len: usize, inner: usize) -> Result<(CudaStorage, DeviceBuffer<u32>)> {
        let buf = f32_or_b16!(self, |x| self.max_dim_b16(x, outer, len, inner));
        let n = outer * inner;
        let mut vals = Self::output(&self.dev, n)?;
        let mut arg = self.dev.zeros::<u32>(n)?;
        if n > 0 {
            let (_, cfg) = grid(n, "max")?;
            let v = u32s("max", &[outer, len, inner])?;
            // SAFETY: outer * len * inner inputs, n outputs.
            unsafe {
                self.dev.launch(
                    k::MaxDimF32,
                    cfg,
                    (buf.ptr(), vals.f32_mut().ptr_mut(), arg.ptr_mut(), v[0], v[1], v[2]),
                )?
            };
        }
        Ok((vals, arg))
    }

    /// The column of the maximum of each row of `d`: the max kernel's offsets, downloaded.
    pub fn argmax_last(&self, d: usize) -> Result<Vec<usize>> {
        // row r's offset is r * d + column
        let (_, arg) = self.max_dim(self.len() / d, d, 1)?;
        Ok(self.dev.download(&arg)?.into_iter().map(|off| off as usize % d).collect())
    }

    /// The gradient of a max: `g` scattered to the argmax offsets of an input of `n_in` elements.
    pub fn scatter_argmax(&self, argmax: &DeviceBuffer<u32>, n_in: usize) -> Result<CudaStorage> {
        let buf = f32_or_b16!(self, |x| self.scatter_argmax_b16(x, argmax, n_in));
        let mut gx = Self::alloc(&self.dev, n_in)?;
        if !argmax.is_empty() {
            let (n, cfg) = grid(argmax.len(), "max backward")?;
            // SAFETY: argmax offsets are < n_in and distinct.
            unsafe { self.dev.launch(k::ScatterArgmaxF32, cfg, (buf.ptr(), argmax.ptr(), gx.f32_mut().ptr_mut(), n))? };
        }
        Ok(gx)
    }

    /// The f32 buffers of an optimizer's parameter and state, or a typed error: the fused
    /// optimizer kernels update f32 parameters only (keep f32 master weights for bf16 / f16
    /// compute).
    fn f32_state<'a>(
        op: &'static str,
        p: &'a mut CudaStorage,
        g: &CudaStorage,
        state: &[&CudaStorage],
    ) -> Result<&'a mut DeviceBuffer<f32>> {
        let dtype = p.dtype();
        if dtype != DType::F32 {
            return Err(Error::Unsupported {
                op,
                what: format!(
                    "{dtype:?} parameters on CUDA (the fused optimizer kernels update f32 parameters: keep the parameter in f32)"
                ),
            });
        }
        for s in std::iter::once(g).chain(state.iter().copied()) {
            s.f32_buf(op)?;
        }
        match &mut p.data {
            CudaData::F32(b) => Ok(b),
            _ => unreachable!("checked f32 above"),
        }
    }

    /// One fused Adam step on `self` (the parameter) from `g`, updating `m` and `v` (all f32).
    pub fn adam_step(
        &mut self,
        g: &CudaStorage,
        m: &mut CudaStorage,
        v: &mut CudaStorage,
        mut h: AdamStep,
    ) -> Result<()> {
        let dev = self.dev.clone();
        let (n, cfg) = grid(self.len(), "adam")?;
        let p = Self::f32_state("adam", self, g, &[&*m, &*v])?;
        let g = g.f32_buf("adam")?;
        h.n = n;
        // SAFETY: all four buffers hold n elements.
        unsafe {
            dev.launch(k::AdamStepF32, cfg, (p.ptr_mut(), g.ptr(), m.f32_mut().ptr_mut(), v.f32_mut().ptr_mut(), h))
        }
    }

    /// One fused SGD step on `self` from `g`, updating the velocity (all f32).
    pub fn sgd_step(&mut self, g: &CudaStorage, vel: &mut CudaStorage, mut h: SgdStep) -> Result<()> {
        let dev = self.dev.clone();
        let (n, cfg) = grid(self.len(), "sgd")?;
        let p = Self::f32_state("sgd", self, g, &[&*vel])?;
        let g = g.f32_buf("sgd")?;
        h.n = n;
        // SAFETY: all three buffers hold n elements.
        unsafe { dev.launch(k::SgdStepF32, cfg, (p.ptr_mut(), g.ptr(), vel.f32_mut().ptr_mut(), h)) }
    }
}
