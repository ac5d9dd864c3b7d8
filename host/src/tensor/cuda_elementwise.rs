//! The CUDA backend's elementwise ops: unary and binary maps (flat, broadcast and strided), view
//! copies and scatters, and sums over dimensions; f32 here, bf16 / f16 through `cuda_b16.rs`.

use super::*;

impl CudaStorage {
    /// An elementwise function of one input (the unary kernel, by its [`k::unary`] code).
    pub fn unary(&self, u: Unary) -> Result<CudaStorage> {
        let buf = f32_or_b16!(self, |x| self.unary_b16(x, u));
        let (op, s) = unary_code(u);
        let mut out = Self::output(&self.dev, self.len())?;
        if !self.is_empty() {
            let (n, cfg) = grid4(self.len(), "unary")?;
            // SAFETY: same length in and out.
            unsafe { self.dev.launch(k::UnaryF32, cfg, (buf.ptr(), out.f32_mut().ptr_mut(), n, op, s))? };
        }
        Ok(out)
    }

    /// `self (op) other` broadcast to `out` (the binary kernels, by their [`k::binary`] code).
    pub fn binary(
        &self,
        a_shape: &Shape,
        other: &CudaStorage,
        b_shape: &Shape,
        out: &Shape,
        op: Binary,
    ) -> Result<CudaStorage> {
        let (x, y) = match (&self.data, &other.data) {
            (CudaData::F32(x), CudaData::F32(y)) => (x, y),
            (CudaData::BF16(x), CudaData::BF16(y)) => return self.binary_b16(x, a_shape, y, b_shape, out, op),
            (CudaData::F16(x), CudaData::F16(y)) => return self.binary_b16(x, a_shape, y, b_shape, out, op),
            _ => return Err(Error::DType { op: op.name(), got: other.dtype(), expected: self.dtype() }),
        };
        let op = binary_code(op);
        let (dims, [sa, sb]) =
            pad_walk("binary", out.dims(), [&a_shape.broadcast_strides(out), &b_shape.broadcast_strides(out)])?;
        let mut res = Self::output(&self.dev, out.elem_count())?;
        if out.elem_count() > 0 && a_shape == out && b_shape == out {
            // No broadcasting: the flat kernel, 16-byte accesses and no index arithmetic.
            let (n, cfg) = grid4(out.elem_count(), "binary")?;
            // SAFETY: both inputs and the output hold n elements, in fresh 16-byte aligned buffers.
            unsafe { self.dev.launch(k::BinaryFlatF32, cfg, (x.ptr(), y.ptr(), res.f32_mut().ptr_mut(), n, op))? };
        } else if out.elem_count() > 0 {
            let (n, cfg) = grid(out.elem_count(), "binary")?;
            let p = Strided2 { n, dims, a: sa, b: sb, op };
            // SAFETY: offsets stay inside each input by construction of the strides.
            unsafe { self.dev.launch(k::BinaryF32, cfg, (x.ptr(), y.ptr(), res.f32_mut().ptr_mut(), p))? };
        }
        Ok(res)
    }

    /// `out[i] = self[offset(i)]` for an output of `out` dims read through `strides`.
    pub fn strided_copy(&self, out: &Shape, strides: &[usize]) -> Result<CudaStorage> {
        let buf = f32_or_b16!(self, |x| self.strided_copy_b16(x, out, strides));
        let (dims, [sa]) = pad_walk("strided copy", out.dims(), [strides])?;
        let mut res = Self::output(&self.dev, out.elem_count())?;
        if out.elem_count() > 0 {
            let (n, cfg) = grid(out.elem_count(), "strided copy")?;
            let p = Strided2 { n, dims, a: sa, b: [0; MAX_DIMS], op: 0 };
            // SAFETY: offsets stay inside the input.
            unsafe { self.dev.launch(k::StridedCopyF32, cfg, (buf.ptr(), res.f32_mut().ptr_mut(), p))? };
        }
        Ok(res)
    }

    /// `out[i] = self[a_offset + a(i)] (op) other[b_offset + b(i)]` over an output of `dims`
    /// (coalesced; each input's strides 0 where it broadcasts): views and broadcasts read in
    /// place by the strided binary kernel, one launch.
    pub(crate) fn binary_strided(
        &self,
        other: &CudaStorage,
        dims: &[usize],
        (a_strides, a_offset): (&[usize], usize),
        (b_strides, b_offset): (&[usize], usize),
        op: Binary,
    ) -> Result<CudaStorage> {
        let (d, sa) = pad("binary", dims, a_strides).map_err(view_error)?;
        let (_, sb) = pad("binary", dims, b_strides).map_err(view_error)?;
        let n: usize = dims.iter().product();
        let (x, y) = match (&self.data, &other.data) {
            (CudaData::F32(x), CudaData::F32(y)) => (x, y),
            (CudaData::BF16(x), CudaData::BF16(y)) => {
                return self.binary_strided_b16(x, (a_offset, sa), y, (b_offset, sb), d, n, op);
            }
            (CudaData::F16(x), CudaData::F16(y)) => {
                return self.binary_strided_b16(x, (a_offset, sa), y, (b_offset, sb), d, n, op);
            }
            _ => return Err(Error::DType { op: op.name(), got: other.dtype(), expected: self.dtype() }),
        };
        let mut res = Self::output(&self.dev, n)?;
        if n > 0 {
            let (n, cfg) = grid(n, "binary")?;
            let p = Strided2 { n, dims: d, a: sa, b: sb, op: binary_code(op) };
            let (a, b) = (x.ptr().offset(a_offset), y.ptr().offset(b_offset));
            // SAFETY: every input offset stays inside its buffer (checked by the caller); out holds n.
            unsafe { self.dev.launch(k::BinaryF32, cfg, (a, b, res.f32_mut().ptr_mut(), p))? };
        }
        Ok(res)
    }

    /// `n` elements for an op that writes every one (not cleared; poisoned under `KILN_POISON=1`).
    pub(crate) fn scratch(dev: &Arc<CudaDevice>, n: usize, dtype: DType) -> Result<CudaStorage> {
        check_len("alloc", n)?;
        b16::scratch(dev, n, dtype)
    }

    /// A dense copy of a view: `out[i] = self[offset + off(i)]` for an output of `dims` read
    /// through `strides` (a coalesced layout; the caller checked it stays inside the buffer).
    pub(crate) fn view_copy(&self, dims: &[usize], strides: &[usize], offset: usize) -> Result<CudaStorage> {
        let (d, sa) = pad("view copy", dims, strides).map_err(view_error)?;
        let n: usize = dims.iter().product();
        let buf = f32_or_b16!(self, |x| self.view_copy_b16(x, d, sa, offset, n));
        let mut res = Self::output(&self.dev, n)?;
        if n > 0 {
            let (n, cfg) = grid(n, "view copy")?;
            let p = Strided2 { n, dims: d, a: sa, b: [0; MAX_DIMS], op: 0 };
            // SAFETY: every offset + off(i) is inside the input (checked by the caller); out holds n.
            unsafe { self.dev.launch(k::StridedCopyF32, cfg, (buf.ptr().offset(offset), res.f32_mut().ptr_mut(), p))? };
        }
        Ok(res)
    }

    /// `self[dst_offset + dst(i)] = src[src_offset + src(i)]` over a walk of `dims` (coalesced),
    /// each side read or written through its strides (the scatter kernel, one launch).
    pub(crate) fn scatter_from(
        &mut self,
        src: &CudaStorage,
        dims: &[usize],
        (src_strides, src_offset): (&[usize], usize),
        (dst_strides, dst_offset): (&[usize], usize),
    ) -> Result<()> {
        let (d, sa) = pad("strided write", dims, src_strides).map_err(view_error)?;
        let (_, sb) = pad("strided write", dims, dst_strides).map_err(view_error)?;
        let n: usize = dims.iter().product();
        if n == 0 {
            return Ok(());
        }
        let (n, cfg) = grid(n, "strided write")?;
        let p = Strided2 { n, dims: d, a: sa, b: sb, op: 0 };
        let dev = self.dev.clone();
        // SAFETY (every arm): both walks stay inside their buffers (checked by the caller); the
        // destination places are distinct, so no two threads write one element.
        match (&mut self.data, &src.data) {
            (CudaData::F32(o), CudaData::F32(x)) => unsafe {
                dev.launch(k::StridedScatterF32, cfg, (x.ptr().offset(src_offset), o.ptr_mut().offset(dst_offset), p))
            },
            (CudaData::BF16(o), CudaData::BF16(x)) => unsafe {
                b16::scatter(&dev, cfg, x, src_offset, o, dst_offset, p)
            },
            (CudaData::F16(o), CudaData::F16(x)) => unsafe { b16::scatter(&dev, cfg, x, src_offset, o, dst_offset, p) },
            _ => Err(Error::DType { op: "strided write", got: src.dtype(), expected: self.dtype() }),
        }
    }

    /// Sum of `self` (shape `from`) into `to` (a shape that broadcasts to `from`).
    pub fn sum_into(&self, from: &Shape, to: &Shape) -> Result<CudaStorage> {
        let buf = f32_or_b16!(self, |x| self.sum_into_b16(x, from, to));
        let (p, out_n, red_n) = b16::reduce_dims(from, to)?;
        if out_n == 1 && red_n > 1 {
            // One output: a block-parallel two-pass reduction (fixed order for a given size)
            // instead of one thread walking every element.
            let total = crate::cuda::ops::sum_on_device(&self.dev, buf)?;
            return Ok(Self::wrap(&self.dev, CudaData::F32(total), 1));
        }
        let mut res = Self::output(&self.dev, out_n)?;
        let chunk = split_sum_chunk(p.out_n, p.red_n);
        if out_n > 0 && chunk < p.red_n {
            // Few outputs over a long reduction: split it (two passes, fixed order).
            let chunks = p.red_n.div_ceil(chunk);
            let mut partial = self.dev.zeros::<f64>(out_n * chunks as usize)?;
            let (_, cfg) = grid(out_n * chunks as usize, "sum")?;
            let (_, cfg2) = grid(out_n, "sum")?;
            // SAFETY: every offset is a valid index of `from`; `partial` holds chunks x out_n.
            unsafe {
                self.dev.launch(k::ReduceSumDimsPartialF32, cfg, (buf.ptr(), partial.ptr_mut(), p, chunk))?;
                self.dev.launch(
                    k::ReducePartialsF64,
                    cfg2,
                    (partial.ptr(), res.f32_mut().ptr_mut(), p.out_n, chunks),
                )?;
            }
        } else if out_n > 0 {
            let (_, cfg) = grid(out_n, "sum")?;
            // SAFETY: every offset is a valid index of `from`.
            unsafe { self.dev.launch(k::ReduceSumDimsF32, cfg, (buf.ptr(), res.f32_mut().ptr_mut(), p))? };
        }
        Ok(res)
    }
}
