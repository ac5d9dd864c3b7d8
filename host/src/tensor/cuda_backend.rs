//! The CUDA backend of tensors: f32, bf16 and f16 device buffers ([`CudaData`]) and one safe
//! launcher per kernel family of `kiln_gpu::kernels::tensor_ops` (f32) and
//! `kiln_gpu::kernels::tensor_b16` (bf16 and f16: 16-bit in and out, f32 arithmetic inside). Every
//! CUDA op runs a kiln Rust kernel; none is computed on the host, and none falls back to the CPU.
//! The backend's dialect lives here: the kernels' function codes for each [`Unary`] and [`Binary`],
//! and the GEMM [`Layout`] of each in-place product.
//!
//! Each op method starts from the f32 path; bf16 and f16 data leave it at the method's first line
//! (`f32_or_b16!`) for the generic 16-bit path in `cuda_b16.rs`, whose kernels for each format
//! are one table (the impls of its `B16` trait). f64 tensors do not live on CUDA (convert first).

use super::elementwise::{Binary, Unary};
use super::layout::coalesce;
use super::shape::Shape;
use crate::cuda::gemm::Layout;
use crate::cuda::{Device as CudaDevice, DeviceBuffer, LaunchConfig, MatmulPrecision};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::cpu::CpuStorage;
use kiln_gpu::kernels::reduce::ReduceSumF32;
use kiln_gpu::kernels::tensor_ops::{self as k, AdamStep, MAX_DIMS, MatmulShape, ROW_THREADS, SgdStep, Strided2};
use std::sync::{Arc, Mutex};

#[path = "cuda_attention.rs"]
mod attention;
#[path = "cuda_b16.rs"]
mod b16;
#[path = "cuda_linear.rs"]
mod linear;

/// A CUDA tensor's elements, typed (at least one allocated, so that empty tensors need no
/// zero-byte allocation).
pub enum CudaData {
    /// f32 elements.
    F32(DeviceBuffer<f32>),
    /// bf16 elements.
    BF16(DeviceBuffer<half::bf16>),
    /// f16 elements.
    F16(DeviceBuffer<half::f16>),
}

/// A tensor's data on a GPU: f32, bf16 or f16.
pub struct CudaStorage {
    data: CudaData,
    /// The device.
    pub dev: Arc<CudaDevice>,
    len: usize,
}

/// The f32 buffer of `$s` (a `CudaStorage`), or, for bf16 and f16 data, a return from the calling
/// method with `$b16` evaluated on the typed 16-bit buffer `$x` (the generic path of `cuda_b16.rs`).
macro_rules! f32_or_b16 {
    ($s:expr, |$x:ident| $b16:expr) => {
        match &$s.data {
            CudaData::F32(buf) => buf,
            CudaData::BF16($x) => return $b16,
            CudaData::F16($x) => return $b16,
        }
    };
}

/// Most elements a CUDA tensor may hold: the kernels index in u32, and every offset product and
/// grid-stride step must stay below 2^32.
pub const MAX_CUDA_ELEMENTS: usize = (1 << 31) - 1;

fn check_len(op: &'static str, n: usize) -> Result<()> {
    if n > MAX_CUDA_ELEMENTS {
        return Err(Error::Unsupported {
            op,
            what: format!(
                "{n} elements in one CUDA tensor (at most {MAX_CUDA_ELEMENTS}: the kernels index in 32 bits); split the tensor"
            ),
        });
    }
    Ok(())
}

impl std::fmt::Debug for CudaStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaStorage({} {:?} on {})", self.len, self.dtype(), self.dev.name())
    }
}

const MAX_BLOCKS: u32 = 8192;

/// The launch for the kernels that take 4 elements per thread step (16-byte accesses).
fn grid4(n: usize, op: &'static str) -> Result<(u32, LaunchConfig)> {
    let (n32, mut cfg) = grid(n, op)?;
    cfg.grid_dim.0 = n32.div_ceil(4 * 256).clamp(1, MAX_BLOCKS);
    Ok((n32, cfg))
}

fn grid(n: usize, op: &'static str) -> Result<(u32, LaunchConfig)> {
    let n32 =
        u32::try_from(n).map_err(|_| Error::shape(op, format!("{n} elements exceed the CUDA kernels' u32 indices")))?;
    Ok((
        n32,
        LaunchConfig {
            grid_dim: (n32.div_ceil(256).clamp(1, MAX_BLOCKS), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        },
    ))
}

fn u32s(op: &'static str, v: &[usize]) -> Result<Vec<u32>> {
    v.iter().map(|&x| u32::try_from(x).map_err(|_| Error::shape(op, format!("{x} exceeds u32")))).collect()
}

/// Pads dims/strides on the left to [`MAX_DIMS`]; errors above it.
fn pad(op: &'static str, dims: &[usize], strides: &[usize]) -> Result<([u32; MAX_DIMS], [u32; MAX_DIMS])> {
    if dims.len() > MAX_DIMS {
        return Err(Error::Unsupported {
            op,
            what: format!("{} dimensions on CUDA (at most {MAX_DIMS}): reshape first", dims.len()),
        });
    }
    let (mut d, mut s) = ([1u32; MAX_DIMS], [0u32; MAX_DIMS]);
    let off = MAX_DIMS - dims.len();
    let (dd, ss) = (u32s(op, dims)?, u32s(op, strides)?);
    d[off..].copy_from_slice(&dd);
    s[off..].copy_from_slice(&ss);
    Ok((d, s))
}

/// A walk of `dims` read through each of `strides` at once, coalesced ([`coalesce`]: size-1
/// dimensions dropped, neighbours merged where every stride list allows) and then padded to
/// [`MAX_DIMS`]: a contiguous operand of any rank is one dimension, so only walks that stay
/// irregular in more than [`MAX_DIMS`] dimensions are refused.
fn pad_walk<const N: usize>(
    op: &'static str,
    dims: &[usize],
    strides: [&[usize]; N],
) -> Result<([u32; MAX_DIMS], [[u32; MAX_DIMS]; N])> {
    let (d, s) = coalesce(dims, &strides);
    let mut out = [[0u32; MAX_DIMS]; N];
    let mut padded = [1u32; MAX_DIMS];
    for (o, s) in out.iter_mut().zip(&s) {
        let (pd, ps) = pad(op, &d, s)?;
        padded = pd;
        *o = ps;
    }
    Ok((padded, out))
}

/// The chunk of a split sum over dimensions (`reduce_sum_dims_partial_f32`): `red_n` (no split)
/// where the outputs alone fill the GPU or the reduction is short; else chunks of at least 64
/// elements, enough of them that outputs x chunks is about 2^18 threads.
fn split_sum_chunk(out_n: u32, red_n: u32) -> u32 {
    const THREADS: u32 = 1 << 18;
    if out_n >= THREADS / 4 || red_n < 256 {
        return red_n.max(1);
    }
    let chunks = (THREADS / out_n.max(1)).clamp(1, red_n / 64);
    red_n.div_ceil(chunks)
}

/// A view the strided kernels cannot take (more than [`MAX_DIMS`] dimensions after merging), said
/// as what to change.
fn view_error(e: Error) -> Error {
    match e {
        Error::Unsupported { op, what } => Error::Unsupported {
            op,
            what: format!(
                "{what}; this view does not merge into {MAX_DIMS} dimensions: call .contiguous() at an earlier step, or reshape to fewer dimensions"
            ),
        },
        e => e,
    }
}

/// The unary kernel's function code and scalar for `u`.
fn unary_code(u: Unary) -> (u32, f32) {
    match u {
        Unary::Neg => (k::unary::NEG, 0.0),
        Unary::Exp => (k::unary::EXP, 0.0),
        Unary::Log => (k::unary::LOG, 0.0),
        Unary::Sqrt => (k::unary::SQRT, 0.0),
        Unary::Relu => (k::unary::RELU, 0.0),
        Unary::Gelu => (k::unary::GELU, 0.0),
        Unary::GeluGrad => (k::unary::GELU_GRAD, 0.0),
        Unary::Tanh => (k::unary::TANH, 0.0),
        Unary::Sigmoid => (k::unary::SIGMOID, 0.0),
        Unary::Step => (k::unary::STEP, 0.0),
        Unary::AddScalar(s) => (k::unary::ADD_SCALAR, s as f32),
        Unary::MulScalar(s) => (k::unary::MUL_SCALAR, s as f32),
    }
}

/// The binary kernels' function code for `b`.
fn binary_code(b: Binary) -> u32 {
    match b {
        Binary::Add => k::binary::ADD,
        Binary::Sub => k::binary::SUB,
        Binary::Mul => k::binary::MUL,
        Binary::Div => k::binary::DIV,
    }
}

/// A host index list's u32 copy on the last device it was used on (cross-entropy's
/// [`Targets`](super::Targets) keep one, so the forward and the backward share one upload).
#[derive(Default)]
pub(crate) struct DeviceIndices(Mutex<Option<IndicesOn>>);

/// A device, and the indices' copy on it.
type IndicesOn = (Arc<CudaDevice>, Arc<DeviceBuffer<u32>>);

impl DeviceIndices {
    /// `idx` as u32 on `dev`: copied on the first call for a device, then reused.
    fn on(&self, dev: &Arc<CudaDevice>, idx: &[usize], op: &'static str) -> Result<Arc<DeviceBuffer<u32>>> {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((d, buf)) = &*slot
            && Arc::ptr_eq(d, dev)
        {
            return Ok(buf.clone());
        }
        let buf = Arc::new(dev.upload(&u32s(op, idx)?)?);
        *slot = Some((dev.clone(), buf.clone()));
        Ok(buf)
    }
}

impl DeviceIndices {
    /// Replaces the indices of the device copy in place with `idx` (the same buffer, so a captured
    /// graph that reads it sees them). Returns false, leaving nothing on the device, where the copy
    /// could not be reused (its length differs or another handle holds it): the next use uploads.
    pub(crate) fn overwrite(&mut self, op: &'static str, idx: &[usize]) -> Result<bool> {
        let slot = self.0.get_mut().unwrap_or_else(|p| p.into_inner());
        let written = match slot {
            Some((dev, buf)) => match Arc::get_mut(buf) {
                Some(b) if b.len() == idx.len() && !idx.is_empty() => {
                    dev.write(b, &u32s(op, idx)?)?;
                    true
                }
                _ => false,
            },
            None => false,
        };
        if !written {
            *slot = None;
        }
        Ok(written)
    }
}

impl CudaStorage {
    /// `n` elements of `data` on `dev`.
    fn wrap(dev: &Arc<CudaDevice>, data: CudaData, n: usize) -> CudaStorage {
        CudaStorage { data, dev: dev.clone(), len: n }
    }
    /// `n` zeroed f32 elements (for kernels that accumulate into their output or leave parts of it).
    fn alloc(dev: &Arc<CudaDevice>, n: usize) -> Result<CudaStorage> {
        check_len("alloc", n)?;
        Ok(Self::wrap(dev, CudaData::F32(dev.zeros::<f32>(n.max(1))?), n))
    }
    /// `n` f32 elements for a kernel that writes every one: no zeroing pass over memory about to be
    /// overwritten (poisoned instead under `KILN_POISON=1`, so a missed element fails the tests).
    fn output(dev: &Arc<CudaDevice>, n: usize) -> Result<CudaStorage> {
        check_len("alloc", n)?;
        Ok(Self::wrap(dev, CudaData::F32(dev.alloc_uninit_f32(n.max(1))?), n))
    }
    /// The f32 buffer of a storage this file just made as f32.
    fn f32_mut(&mut self) -> &mut DeviceBuffer<f32> {
        match &mut self.data {
            CudaData::F32(b) => b,
            _ => unreachable!("made as f32 by this file"),
        }
    }
    /// The element type: F32, BF16 or F16.
    pub fn dtype(&self) -> DType {
        match self.data {
            CudaData::F32(_) => DType::F32,
            CudaData::BF16(_) => DType::BF16,
            CudaData::F16(_) => DType::F16,
        }
    }
    /// The typed elements (at least one allocated; the first [`CudaStorage::len`] are the tensor's).
    pub fn data(&self) -> &CudaData {
        &self.data
    }
    /// The device address of the elements (any dtype), for runtime tables that hold raw
    /// pointers (the fused optimizer's).
    pub fn addr(&self) -> u64 {
        match &self.data {
            CudaData::F32(b) => b.addr(),
            CudaData::BF16(b) => b.addr(),
            CudaData::F16(b) => b.addr(),
        }
    }
    /// The f32 elements, or a typed error naming `op` for bf16 / f16 data (the ops that have only an
    /// f32 kernel, such as the optimizers' updates).
    pub fn f32_buf(&self, op: &'static str) -> Result<&DeviceBuffer<f32>> {
        match &self.data {
            CudaData::F32(b) => Ok(b),
            _ => Err(Error::DType { op, got: self.dtype(), expected: DType::F32 }),
        }
    }
    /// Overwrites the f32 elements with host values in place (`v` holds [`CudaStorage::len`]
    /// of them); other dtypes are a typed error naming `op`.
    pub(crate) fn write_f32(&mut self, op: &'static str, v: &[f32]) -> Result<()> {
        let CudaStorage { data, dev, .. } = self;
        match data {
            CudaData::F32(b) => dev.write_prefix(b, v),
            _ => Err(Error::DType { op, got: self.dtype(), expected: DType::F32 }),
        }
    }
    /// Copies host f32 values to the device.
    pub fn upload(dev: &Arc<CudaDevice>, v: &[f32]) -> Result<CudaStorage> {
        check_len("to_device", v.len())?;
        if v.is_empty() {
            return Self::alloc(dev, 0);
        }
        Ok(Self::wrap(dev, CudaData::F32(dev.upload(v)?), v.len()))
    }
    /// Copies host data of any CUDA dtype (f32, bf16, f16) to the device as it is (no conversion);
    /// f64 is a typed error that says to convert first.
    pub fn upload_cpu(dev: &Arc<CudaDevice>, s: &CpuStorage) -> Result<CudaStorage> {
        match s {
            CpuStorage::F32(v) => Self::upload(dev, v),
            CpuStorage::BF16(v) => Self::upload_b16(dev, v),
            CpuStorage::F16(v) => Self::upload_b16(dev, v),
            CpuStorage::F64(_) => Err(Error::Unsupported {
                op: "to_device",
                what:
                    "F64 tensors on CUDA (CUDA tensors are f32, bf16 or f16: convert with .to_dtype(DType::F32) first)"
                        .into(),
            }),
        }
    }
    /// Copies the elements to the host as f32 (bf16 and f16 widened exactly on the host).
    pub fn download(&self) -> Result<Vec<f32>> {
        Ok(self.download_cpu()?.as_f32().into_owned())
    }
    /// Copies the elements to the host in their dtype.
    pub fn download_cpu(&self) -> Result<CpuStorage> {
        let buf = f32_or_b16!(self, |x| self.download_b16(x));
        let mut v = self.dev.download(buf)?;
        v.truncate(self.len);
        Ok(CpuStorage::F32(v))
    }
    /// A device-side copy.
    pub fn try_clone(&self) -> Result<CudaStorage> {
        let buf = f32_or_b16!(self, |x| self.try_clone_b16(x));
        let mut out = Self::output(&self.dev, self.len)?;
        let p = Strided2 {
            n: self.len as u32,
            dims: [1, 1, 1, self.len.max(1) as u32],
            a: [0, 0, 0, 1],
            ..Default::default()
        };
        if self.len > 0 {
            let (_, cfg) = grid(self.len, "copy")?;
            // SAFETY: both buffers hold n elements.
            unsafe { self.dev.launch(k::StridedCopyF32, cfg, (buf.ptr(), out.f32_mut().ptr_mut(), p))? };
        }
        Ok(out)
    }
    /// The data converted to `d` on the device, by kernel (f32, bf16 and f16 each way; round to
    /// nearest-even when narrowing); f64 is a typed error.
    pub fn to_dtype(&self, d: DType) -> Result<CudaStorage> {
        b16::to_dtype(self, d)
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `value` everywhere (f32).
    pub fn full(dev: &Arc<CudaDevice>, n: usize, value: f32) -> Result<CudaStorage> {
        let mut out = Self::output(dev, n)?;
        if n > 0 {
            let (n32, cfg) = grid4(n, "full")?;
            // SAFETY: out holds n elements.
            unsafe { dev.launch(k::FillF32, cfg, (out.f32_mut().ptr_mut(), n32, value))? };
        }
        Ok(out)
    }

    /// `value` (rounded once to `dtype`) everywhere, in `dtype` (f32, bf16 or f16).
    pub fn full_dtype(dev: &Arc<CudaDevice>, n: usize, value: f64, dtype: DType) -> Result<CudaStorage> {
        b16::full_dtype(dev, n, value, dtype)
    }

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

    /// One product `op(self) op(b)` in `layout` (m x n out, reduction k), read in place: by the
    /// GEMM ladder's layout rungs at [`MatmulPrecision::F32`], where `None` says the rows are not
    /// 16-byte multiples (the caller transposes and multiplies NN instead); by
    /// [`gemm_bf16`](crate::cuda::gemm::gemm_bf16) at [`MatmulPrecision::Bf16`], which takes every
    /// shape.
    pub fn matmul_layout(
        &self,
        b: &CudaStorage,
        m: usize,
        k: usize,
        n: usize,
        layout: Layout,
    ) -> Result<Option<CudaStorage>> {
        let (x, y) = match (&self.data, &b.data) {
            (CudaData::F32(x), CudaData::F32(y)) => (x, y),
            (CudaData::BF16(x), CudaData::BF16(y)) => return self.matmul_layout_b16(x, y, m, k, n, layout).map(Some),
            (CudaData::F16(x), CudaData::F16(y)) => return self.matmul_layout_b16(x, y, m, k, n, layout).map(Some),
            _ => return Err(Error::DType { op: "matmul", got: b.dtype(), expected: self.dtype() }),
        };
        let v = u32s("matmul", &[m, n, k])?;
        let s = kiln_gpu::kernels::mma_tile::GemmShape { m: v[0], n: v[1], k: v[2] };
        let bf16 = crate::cuda::matmul_precision() == MatmulPrecision::Bf16;
        if m * n == 0 || k == 0 || !(bf16 || layout.rows_aligned(s)) {
            return Ok(None);
        }
        let mut c = Self::alloc(&self.dev, m * n)?;
        if bf16 {
            crate::cuda::gemm::gemm_bf16(&self.dev, x, y, c.f32_mut(), s, layout)?;
        } else {
            crate::cuda::gemm::sgemm_layout(&self.dev, x, y, c.f32_mut(), s, layout)?;
        }
        Ok(Some(c))
    }

    /// `self b^T` (m x n; `self` m x k, `b` stored n x k), `b` read in place: the NT layout (see
    /// [`CudaStorage::matmul_layout`]; `None` where its rungs do not take the shape).
    pub fn matmul_abt(&self, b: &CudaStorage, m: usize, k: usize, n: usize) -> Result<Option<CudaStorage>> {
        self.matmul_layout(b, m, k, n, Layout::NT)
    }

    /// `self^T b` (m x n; `self` stored k x m, `b` k x n), `self` read in place: the TN layout (see
    /// [`CudaStorage::matmul_layout`]; `None` where its rungs do not take the shape).
    pub fn matmul_atb(&self, b: &CudaStorage, m: usize, k: usize, n: usize) -> Result<Option<CudaStorage>> {
        self.matmul_layout(b, m, k, n, Layout::TN)
    }

    /// Batched product (see `Tensor::matmul`). bf16 batches with a batched B on sm_90a run on the
    /// strided-batch `wgmma` kernel ([`CudaStorage::matmul_batched_abt`], B transposed once).
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &self,
        b: &CudaStorage,
        batch: usize,
        m: usize,
        kk: usize,
        n: usize,
        b_batched: bool,
    ) -> Result<CudaStorage> {
        let (x, y) = match (&self.data, &b.data) {
            (CudaData::F32(x), CudaData::F32(y)) => (x, y),
            (CudaData::BF16(_), CudaData::BF16(_)) if b_batched && self.batched_on_wgmma(batch, m, kk, n) => {
                // B transposed once to n x k per product, for the strided-batch wgmma kernel
                let bt = b.view_copy(&[batch, n, kk], &[kk * n, 1, n], 0)?;
                return self.matmul_batched_abt(&bt, batch, m, kk, n);
            }
            (CudaData::BF16(x), CudaData::BF16(y)) => return self.matmul_b16(x, y, batch, m, kk, n, b_batched),
            (CudaData::F16(x), CudaData::F16(y)) => return self.matmul_b16(x, y, batch, m, kk, n, b_batched),
            _ => return Err(Error::DType { op: "matmul", got: b.dtype(), expected: self.dtype() }),
        };
        let mut c = Self::alloc(&self.dev, batch * m * n)?;
        if batch * m * n == 0 || kk == 0 {
            return Ok(c); // zeros
        }
        if batch == 1 || !b_batched {
            // One product (a batch against a shared B is one (batch * m) x k product): the GEMM
            // ladder's chooser picks the kernel.
            let s = kiln_gpu::kernels::mma_tile::GemmShape { m: (batch * m) as u32, n: n as u32, k: kk as u32 };
            if crate::cuda::matmul_precision() == MatmulPrecision::Bf16 {
                let nn = Layout::NN;
                crate::cuda::gemm::gemm_bf16(&self.dev, x, y, c.f32_mut(), s, nn)?;
            } else {
                crate::cuda::gemm::sgemm(&self.dev, x, y, c.f32_mut(), s)?;
            }
            return Ok(c);
        }
        let v = u32s("matmul", &[m, n, kk, batch])?;
        let s = MatmulShape {
            m: v[0],
            n: v[1],
            k: v[2],
            a_stride: (m * kk) as u32,
            b_stride: if b_batched { (kk * n) as u32 } else { 0 },
        };
        let t = k::MATMUL_TILE;
        if v[0].div_ceil(t) > 65535 || v[3] > 65535 {
            return Err(Error::Unsupported {
                op: "matmul",
                what: format!(
                    "{m} rows or {batch} batches on CUDA (the grid allows 65535 x 16 rows and 65535 batches)"
                ),
            });
        }
        let cfg = LaunchConfig {
            grid_dim: (v[1].div_ceil(t), v[0].div_ceil(t), v[3]),
            block_dim: (t, t, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: a, b and c hold the products' operands as described by `s`.
        unsafe { self.dev.launch(k::MatmulF32, cfg, (x.ptr(), y.ptr(), c.f32_mut().ptr_mut(), s))? };
        Ok(c)
    }

    fn rows_cfg(rows: usize) -> Result<LaunchConfig> {
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

/// The embedding backward's counting sort of positions by id: (`order`, `offsets`), with
/// `order[offsets[v]..offsets[v + 1]]` the positions of id `v`, in position order.
fn bucket_by_id(ids: &[usize], v: usize) -> (Vec<u32>, Vec<u32>) {
    let mut offsets = vec![0u32; v + 1];
    for &id in ids {
        offsets[id + 1] += 1;
    }
    for i in 0..v {
        offsets[i + 1] += offsets[i];
    }
    let mut fill = offsets.clone();
    let mut order = vec![0u32; ids.len()];
    for (p, &id) in ids.iter().enumerate() {
        order[fill[id] as usize] = p as u32;
        fill[id] += 1;
    }
    (order, offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_bucketed_by_id_in_order() {
        let (order, offsets) = bucket_by_id(&[2, 0, 2, 1, 2], 4);
        assert_eq!(offsets, [0, 1, 2, 5, 5]);
        assert_eq!(order, [1, 3, 0, 2, 4]);
        let (order, offsets) = bucket_by_id(&[], 2);
        assert!(order.is_empty());
        assert_eq!(offsets, [0, 0, 0]);
    }

    #[test]
    fn pad_left_pads_and_refuses_rank_five() {
        let (d, s) = pad("t", &[3, 5], &[5, 1]).unwrap();
        assert_eq!((d, s), ([1, 1, 3, 5], [0, 0, 5, 1]));
        assert!(matches!(pad("t", &[1; 5], &[0; 5]), Err(Error::Unsupported { op: "t", .. })));
    }

    #[test]
    fn long_sums_over_few_outputs_split_into_chunks_of_at_least_64() {
        // a bias gradient: 384 columns over 16384 rows
        let c = split_sum_chunk(384, 16384);
        assert!((64..16384).contains(&c), "{c}");
        assert!(384 * 16384u32.div_ceil(c) <= 1 << 19);
        // many outputs or short sums: no split
        assert_eq!(split_sum_chunk(1 << 17, 16384), 16384);
        assert_eq!(split_sum_chunk(10, 100), 100);
        assert_eq!(split_sum_chunk(1, 1 << 20) * (1u32 << 20).div_ceil(split_sum_chunk(1, 1 << 20)) >= 1 << 20, true);
    }

    #[test]
    fn walks_of_any_rank_coalesce_before_padding() {
        // two contiguous rank-5 operands: one dimension
        let c = [60, 30, 10, 5, 1];
        let (d, [a, b]) = pad_walk::<2>("t", &[2, 2, 3, 2, 5], [&c, &c]).unwrap();
        assert_eq!((d, a, b), ([1, 1, 1, 120], [0, 0, 0, 1], [0, 0, 0, 1]));
        // a rank-5 broadcast of a row over contiguous data: two dimensions
        let row = [0, 0, 0, 0, 1];
        let (d, [a, b]) = pad_walk::<2>("t", &[2, 2, 3, 2, 5], [&c, &row]).unwrap();
        assert_eq!((d, a, b), ([1, 1, 24, 5], [0, 0, 5, 1], [0, 0, 0, 1]));
        // five irregular dimensions stay refused
        let odd = [1000, 100, 20, 7, 1];
        assert!(pad_walk::<1>("t", &[2, 2, 3, 2, 5], [&odd]).is_err());
    }
}
