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
//!
//! This file holds the storage types, the launch helpers and the storage's life cycle (upload,
//! download, conversions, fills); the op methods live in its children by role:
//! `cuda_elementwise.rs`, `cuda_products.rs`, `cuda_rows.rs` (and `cuda_attention.rs`,
//! `cuda_linear.rs`, `cuda_b16.rs` with `cuda_batched.rs`).

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

// The op methods by role (declared after `f32_or_b16!`, which they use): elementwise maps,
// broadcasts, view copies and sums; the products; the row ops (softmax, cross-entropy, layer
// norm, embeddings, max) and the per-tensor optimizer steps.
#[path = "cuda_elementwise.rs"]
mod elementwise;
#[path = "cuda_products.rs"]
mod products;
#[path = "cuda_rows.rs"]
mod rows;

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
        Binary::ReluGrad => k::binary::RELU_GRAD,
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
