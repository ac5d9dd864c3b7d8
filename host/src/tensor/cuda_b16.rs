//! The bf16 / f16 path of the CUDA backend: every op on 16-bit tensors, bf16 / f16 in and out with
//! f32 arithmetic inside, by the kernels of `kiln_gpu::kernels::tensor_b16`.
//!
//! One generic method per op, over [`B16`]: the trait's two impls are the per-format kernel table
//! (bf16's kernels, f16's kernels); ops that only move 16-bit patterns share one kernel. The
//! parent's op methods send bf16 and f16 data here on their first line.
//!
//! What is computed in which precision:
//! - elementwise maps, broadcasts, softmax, layer norm, the cross-entropy gradient: widened to f32,
//!   computed in f32, rounded once per output element (nearest-even);
//! - sums over dimensions: f64 per output element (one output: the f32 block reduction), rounded
//!   once; the embedding gradient: f32 per element; the cross-entropy loss: row losses and their
//!   mean in f32, the mean rounded once;
//! - layer norm writes its mean and rstd rounded to the tensor's dtype, as the CPU backend does
//!   (they feed the backward's tensor ops, which take one dtype);
//! - products: the tensor cores on the 16-bit operands (bf16: the persistent `wgmma` kernel on
//!   sm_90a, `mma.sync` elsewhere; f16: `mma.sync`), f32 accumulation, an f32 product narrowed to
//!   the dtype by one more pass for now (the GEMMs write f32); batched products with a batched B:
//!   bf16 on sm_90a the strided-batch `wgmma` kernel (`cuda_batched.rs`), elsewhere widened to
//!   f32, multiplied by the batched f32 kernel and narrowed.

use super::{CudaData, CudaStorage, DeviceIndices, binary_code, check_len, grid, pad, pad_walk, u32s, unary_code};
use crate::cuda::gemm::{Layout, WgmmaLayout};
use crate::cuda::{Device as CudaDevice, DeviceBuffer, LaunchConfig};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::cpu::CpuStorage;
use crate::tensor::elementwise::{Binary, Unary};
use crate::tensor::shape::Shape;
use half::{bf16, f16};
use kiln_gpu::kernels::convert::{NarrowF32B16, WidenB16F32, format};
use kiln_gpu::kernels::mma_tile::GemmShape;
use kiln_gpu::kernels::reduce::ReduceSumF32;
use kiln_gpu::kernels::tensor_b16 as t;
use kiln_gpu::kernels::tensor_ops::{MAX_DIMS, ReduceDims, Strided2};
use kiln_gpu::{DevicePtr, DevicePtrMut, Kernel};
use std::sync::Arc;

#[path = "cuda_batched.rs"]
mod batched;

/// A 16-bit device operand (bit patterns).
type P = DevicePtr<u16>;
/// A 16-bit device output (bit patterns).
type Pm = DevicePtrMut<u16>;

/// A 16-bit float type of CUDA tensors, and its row of the kernel table: the format's kernels, its
/// allocation, and its storage variants.
pub(crate) trait B16: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + Copy + 'static {
    /// The dtype.
    const DTYPE: DType;
    /// The `kiln_gpu::kernels::convert::format` code.
    const FORMAT: u32;
    /// `unary_*`.
    type Unary: Kernel<Args = (P, Pm, u32, u32, f32)>;
    /// `binary_flat_*`.
    type BinaryFlat: Kernel<Args = (P, P, Pm, u32, u32)>;
    /// `binary_*`.
    type Binary: Kernel<Args = (P, P, Pm, Strided2)>;
    /// `reduce_sum_dims_*`.
    type ReduceSumDims: Kernel<Args = (P, Pm, ReduceDims)>;
    /// `max_dim_*`.
    type MaxDim: Kernel<Args = (P, Pm, DevicePtrMut<u32>, u32, u32, u32)>;
    /// `softmax_rows_*`.
    type SoftmaxRows: Kernel<Args = (P, Pm, u32, u32)>;
    /// `cross_entropy_rows_*`.
    type CrossEntropyRows: Kernel<Args = (P, DevicePtr<u32>, DevicePtrMut<f32>, u32)>;
    /// `cross_entropy_backward_rows_*`.
    type CrossEntropyBackwardRows: Kernel<Args = (P, DevicePtr<u32>, P, Pm, u32, f32)>;
    /// `layer_norm_rows_*`.
    type LayerNormRows: Kernel<Args = (P, P, P, Pm, Pm, Pm, u32, f32)>;
    /// `embedding_scatter_*`.
    type EmbeddingScatter: Kernel<Args = (P, DevicePtr<u32>, DevicePtr<u32>, Pm, u32, u32)>;
    /// `n` elements for a kernel that writes each (poisoned under `KILN_POISON=1`).
    fn alloc_uninit(dev: &CudaDevice, n: usize) -> Result<DeviceBuffer<Self>>;
    /// The storage variant.
    fn wrap(b: DeviceBuffer<Self>) -> CudaData;
    /// The host storage variant.
    fn host(v: Vec<Self>) -> CpuStorage;
    /// The bit pattern of `v` rounded to this format (nearest-even).
    fn bits(v: f64) -> u16;
}

impl B16 for bf16 {
    const DTYPE: DType = DType::BF16;
    const FORMAT: u32 = format::BF16;
    type Unary = t::UnaryBf16;
    type BinaryFlat = t::BinaryFlatBf16;
    type Binary = t::BinaryBf16;
    type ReduceSumDims = t::ReduceSumDimsBf16;
    type MaxDim = t::MaxDimBf16;
    type SoftmaxRows = t::SoftmaxRowsBf16;
    type CrossEntropyRows = t::CrossEntropyRowsBf16;
    type CrossEntropyBackwardRows = t::CrossEntropyBackwardRowsBf16;
    type LayerNormRows = t::LayerNormRowsBf16;
    type EmbeddingScatter = t::EmbeddingScatterBf16;
    fn alloc_uninit(dev: &CudaDevice, n: usize) -> Result<DeviceBuffer<Self>> {
        dev.alloc_uninit_bf16(n)
    }
    fn wrap(b: DeviceBuffer<Self>) -> CudaData {
        CudaData::BF16(b)
    }
    fn host(v: Vec<Self>) -> CpuStorage {
        CpuStorage::BF16(v)
    }
    fn bits(v: f64) -> u16 {
        crate::dtype::bf16_from_f64(v).to_bits()
    }
}

impl B16 for f16 {
    const DTYPE: DType = DType::F16;
    const FORMAT: u32 = format::F16;
    type Unary = t::UnaryF16;
    type BinaryFlat = t::BinaryFlatF16;
    type Binary = t::BinaryF16;
    type ReduceSumDims = t::ReduceSumDimsF16;
    type MaxDim = t::MaxDimF16;
    type SoftmaxRows = t::SoftmaxRowsF16;
    type CrossEntropyRows = t::CrossEntropyRowsF16;
    type CrossEntropyBackwardRows = t::CrossEntropyBackwardRowsF16;
    type LayerNormRows = t::LayerNormRowsF16;
    type EmbeddingScatter = t::EmbeddingScatterF16;
    fn alloc_uninit(dev: &CudaDevice, n: usize) -> Result<DeviceBuffer<Self>> {
        dev.alloc_uninit_f16(n)
    }
    fn wrap(b: DeviceBuffer<Self>) -> CudaData {
        CudaData::F16(b)
    }
    fn host(v: Vec<Self>) -> CpuStorage {
        CpuStorage::F16(v)
    }
    fn bits(v: f64) -> u16 {
        crate::dtype::f16_from_f64(v).to_bits()
    }
}

/// A 16-bit buffer's elements as bit patterns, for the kernels.
fn p<T: B16>(b: &DeviceBuffer<T>) -> P {
    b.ptr().cast()
}
/// A 16-bit output buffer as bit patterns, for the kernels.
fn pm<T: B16>(b: &mut DeviceBuffer<T>) -> Pm {
    b.ptr_mut().cast()
}

/// The 16-bit data of `s` as bit patterns and its format code; `None` for f32.
fn b16_source(s: &CudaStorage) -> Option<(P, u32)> {
    match &s.data {
        CudaData::F32(_) => None,
        CudaData::BF16(x) => Some((p(x), format::BF16)),
        CudaData::F16(x) => Some((p(x), format::F16)),
    }
}

/// `n` elements of `T` for a kernel that writes each.
fn output<T: B16>(dev: &CudaDevice, n: usize) -> Result<DeviceBuffer<T>> {
    check_len("alloc", n)?;
    T::alloc_uninit(dev, n.max(1))
}

/// `n` zeroed elements of `T` (+0.0 in both formats).
fn zeros<T: B16>(dev: &CudaDevice, n: usize) -> Result<DeviceBuffer<T>> {
    check_len("alloc", n)?;
    dev.zeros::<T>(n.max(1))
}

/// The error for f64 data on CUDA.
fn no_f64(op: &'static str) -> Error {
    Error::Unsupported {
        op,
        what: "F64 tensors on CUDA (CUDA tensors are f32, bf16 or f16: convert with .to_dtype(DType::F32) first)"
            .into(),
    }
}

/// `s` converted to `d` on the device (see [`CudaStorage::to_dtype`]).
pub(super) fn to_dtype(s: &CudaStorage, d: DType) -> Result<CudaStorage> {
    if d == s.dtype() {
        return s.try_clone();
    }
    match d {
        DType::F64 => Err(no_f64("to_dtype")),
        DType::BF16 => narrow_to::<bf16>(s),
        DType::F16 => narrow_to::<f16>(s),
        DType::F32 => match &s.data {
            CudaData::BF16(x) => widen(&s.dev, x, s.len),
            CudaData::F16(x) => widen(&s.dev, x, s.len),
            CudaData::F32(_) => unreachable!("f32 to f32 returned above"),
        },
    }
}

/// The first `n` elements of `x` widened to f32 (exact).
fn widen<T: B16>(dev: &Arc<CudaDevice>, x: &DeviceBuffer<T>, n: usize) -> Result<CudaStorage> {
    let mut out = CudaStorage::output(dev, n)?;
    if n > 0 {
        let (n32, cfg) = grid(n, "to_dtype")?;
        // SAFETY: n 16-bit values in, n f32 out.
        unsafe { dev.launch(WidenB16F32, cfg, (p(x), out.f32_mut().ptr_mut(), n32, T::FORMAT))? };
    }
    Ok(out)
}

/// `s` (f32 or the other 16-bit format) rounded to `T`, nearest-even.
fn narrow_to<T: B16>(s: &CudaStorage) -> Result<CudaStorage> {
    let mut out = output::<T>(&s.dev, s.len)?;
    if s.len > 0 {
        let (n, cfg) = grid(s.len, "to_dtype")?;
        // SAFETY: n values in, n out.
        unsafe {
            match (&s.data, b16_source(s)) {
                (CudaData::F32(x), _) => s.dev.launch(NarrowF32B16, cfg, (x.ptr(), pm(&mut out), n, T::FORMAT))?,
                (_, Some((src, from))) => s.dev.launch(t::ConvertB16, cfg, (src, pm(&mut out), n, from, T::FORMAT))?,
                (_, None) => unreachable!("f32 data matched above"),
            }
        }
    }
    Ok(CudaStorage::wrap(&s.dev, T::wrap(out), s.len))
}

/// `value` in `dtype` everywhere (see [`CudaStorage::full_dtype`]).
pub(super) fn full_dtype(dev: &Arc<CudaDevice>, n: usize, value: f64, dtype: DType) -> Result<CudaStorage> {
    fn fill<T: B16>(dev: &Arc<CudaDevice>, n: usize, value: f64) -> Result<CudaStorage> {
        let mut out = output::<T>(dev, n)?;
        if n > 0 {
            let (n32, cfg) = grid(n, "full")?;
            // SAFETY: out holds n elements.
            unsafe { dev.launch(t::FillB16, cfg, (pm(&mut out), n32, T::bits(value) as u32))? };
        }
        Ok(CudaStorage::wrap(dev, T::wrap(out), n))
    }
    match dtype {
        DType::F32 => CudaStorage::full(dev, n, value as f32),
        DType::BF16 => fill::<bf16>(dev, n, value),
        DType::F16 => fill::<f16>(dev, n, value),
        DType::F64 => Err(no_f64("full")),
    }
}

/// `n` elements of `dtype` for an op that writes every one (not cleared; poisoned under
/// `KILN_POISON=1`).
pub(super) fn scratch(dev: &Arc<CudaDevice>, n: usize, dtype: DType) -> Result<CudaStorage> {
    match dtype {
        DType::F32 => Ok(CudaStorage::wrap(dev, CudaData::F32(dev.alloc_uninit_f32(n.max(1))?), n)),
        DType::BF16 => Ok(CudaStorage::wrap(dev, bf16::wrap(output::<bf16>(dev, n)?), n)),
        DType::F16 => Ok(CudaStorage::wrap(dev, f16::wrap(output::<f16>(dev, n)?), n)),
        DType::F64 => Err(no_f64("alloc")),
    }
}

/// The sum kernel's parameters for summing `from` into `to` (a shape that broadcasts to `from`),
/// with the number of outputs and of elements summed per output.
pub(super) fn reduce_dims(from: &Shape, to: &Shape) -> Result<(ReduceDims, usize, usize)> {
    let padded = Shape([vec![1; from.rank() - to.rank()], to.dims().to_vec()].concat());
    let strides = from.strides();
    let (mut kept_dims, mut kept_strides, mut red_dims, mut red_strides) = (vec![], vec![], vec![], vec![]);
    for (i, (&fd, &td)) in from.dims().iter().zip(padded.dims()).enumerate() {
        if td == fd {
            kept_dims.push(fd);
            kept_strides.push(strides[i]);
        } else {
            red_dims.push(fd);
            red_strides.push(strides[i]);
        }
    }
    let (kd, ks) = pad("sum", &kept_dims, &kept_strides)?;
    let (rd, rs) = pad("sum", &red_dims, &red_strides)?;
    let (out_n, red_n) = (to.elem_count(), red_dims.iter().product::<usize>());
    let p = ReduceDims {
        out_n: u32s("sum", &[out_n])?[0],
        kept_dims: kd,
        kept_strides: ks,
        red_n: u32s("sum", &[red_n])?[0],
        red_dims: rd,
        red_strides: rs,
    };
    Ok((p, out_n, red_n))
}

/// The tensor-core product `c = a b^T` of packed 16-bit operands (`a` m x k, `b` n x k, k a
/// multiple of 8) into f32.
fn tensor_core_product<T: B16>(
    dev: &CudaDevice,
    a: &DeviceBuffer<T>,
    b: &DeviceBuffer<T>,
    c: &mut DeviceBuffer<f32>,
    s: GemmShape,
) -> Result<()> {
    use crate::cuda::gemm::{WgmmaGemm, hgemm};
    use kiln_gpu::kernels::gemm_wgmma::GemmWgmmaBf16Persistent;
    // SAFETY (each cast): `T` is the type its DTYPE names.
    match T::DTYPE {
        DType::BF16 => {
            let (a, b) = unsafe { (cast::<T, bf16>(a), cast::<T, bf16>(b)) };
            if dev.supports::<GemmWgmmaBf16Persistent>() {
                WgmmaGemm::new(dev, a, b, s)?.run(c)
            } else {
                hgemm(dev, a, b, c, s)
            }
        }
        _ => hgemm(dev, unsafe { cast::<T, f16>(a) }, unsafe { cast::<T, f16>(b) }, c, s),
    }
}

/// The `wgmma` layout that reads the operands of a bf16 product in `layout` (m x n out, reduction
/// k) in place, or `None` where they must be packed: every stored row pitch a multiple of 8
/// elements (TMA's 16-byte pitch; [`WgmmaLayout::pitches`]), no empty dimension, sizes within 32
/// bits. `NN` (B k x n) is [`WgmmaLayout::AB`], `NT` (B n x k) [`WgmmaLayout::ABt`], `TN` (A k x
/// m) [`WgmmaLayout::AtB`].
pub(crate) fn in_place_layout(layout: Layout, m: usize, k: usize, n: usize) -> Option<WgmmaLayout> {
    if m == 0 || k == 0 || n == 0 {
        return None;
    }
    let v = u32s("matmul", &[m, n, k]).ok()?;
    let s = GemmShape { m: v[0], n: v[1], k: v[2] };
    let w = match layout {
        Layout::NN => WgmmaLayout::AB,
        Layout::NT => WgmmaLayout::ABt,
        Layout::TN => WgmmaLayout::AtB,
    };
    let (pa, pb) = w.pitches(s);
    (pa.is_multiple_of(8) && pb.is_multiple_of(8)).then_some(w)
}

/// `b` as a buffer of `U`.
///
/// # Safety
/// `T` and `U` are the same type.
unsafe fn cast<T, U>(b: &DeviceBuffer<T>) -> &DeviceBuffer<U> {
    debug_assert_eq!(std::any::type_name::<T>(), std::any::type_name::<U>());
    // SAFETY: the caller's: the same type.
    unsafe { &*(b as *const DeviceBuffer<T>).cast::<DeviceBuffer<U>>() }
}

impl CudaStorage {
    /// `n` elements of `buf` on this storage's device.
    fn wrap16<T: B16>(&self, buf: DeviceBuffer<T>, n: usize) -> CudaStorage {
        CudaStorage::wrap(&self.dev, T::wrap(buf), n)
    }

    /// Copies host 16-bit values to the device as they are.
    pub(super) fn upload_b16<T: B16>(dev: &Arc<CudaDevice>, v: &[T]) -> Result<CudaStorage> {
        check_len("to_device", v.len())?;
        let buf = if v.is_empty() { zeros::<T>(dev, 0)? } else { dev.upload(v)? };
        Ok(CudaStorage::wrap(dev, T::wrap(buf), v.len()))
    }

    pub(super) fn download_b16<T: B16>(&self, x: &DeviceBuffer<T>) -> Result<CpuStorage> {
        let mut v = self.dev.download(x)?;
        v.truncate(self.len);
        Ok(T::host(v))
    }

    pub(super) fn try_clone_b16<T: B16>(&self, x: &DeviceBuffer<T>) -> Result<CudaStorage> {
        let n = self.len;
        self.strided_copy_b16(x, &Shape(vec![n]), &[1])
    }

    pub(super) fn unary_b16<T: B16>(&self, x: &DeviceBuffer<T>, u: Unary) -> Result<CudaStorage> {
        let (op, s) = unary_code(u);
        let mut out = output::<T>(&self.dev, self.len)?;
        if self.len > 0 {
            let (n, cfg) = grid(self.len, "unary")?;
            // SAFETY: same length in and out.
            unsafe { self.dev.launch(T::Unary::default(), cfg, (p(x), pm(&mut out), n, op, s))? };
        }
        Ok(self.wrap16(out, self.len))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn binary_b16<T: B16>(
        &self,
        x: &DeviceBuffer<T>,
        a_shape: &Shape,
        y: &DeviceBuffer<T>,
        b_shape: &Shape,
        out: &Shape,
        op: Binary,
    ) -> Result<CudaStorage> {
        let op = binary_code(op);
        let (dims, [sa, sb]) =
            pad_walk("binary", out.dims(), [&a_shape.broadcast_strides(out), &b_shape.broadcast_strides(out)])?;
        let n_out = out.elem_count();
        let mut res = output::<T>(&self.dev, n_out)?;
        if n_out > 0 {
            let (n, cfg) = grid(n_out, "binary")?;
            if a_shape == out && b_shape == out {
                // SAFETY: both inputs and the output hold n elements.
                unsafe { self.dev.launch(T::BinaryFlat::default(), cfg, (p(x), p(y), pm(&mut res), n, op))? };
            } else {
                let s = Strided2 { n, dims, a: sa, b: sb, op };
                // SAFETY: offsets stay inside each input by construction of the strides.
                unsafe { self.dev.launch(T::Binary::default(), cfg, (p(x), p(y), pm(&mut res), s))? };
            }
        }
        Ok(self.wrap16(res, n_out))
    }

    /// [`CudaStorage::binary_strided`] on 16-bit inputs: each read at its offset through its
    /// (padded) strides by the format's strided binary kernel.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn binary_strided_b16<T: B16>(
        &self,
        x: &DeviceBuffer<T>,
        (a_offset, sa): (usize, [u32; MAX_DIMS]),
        y: &DeviceBuffer<T>,
        (b_offset, sb): (usize, [u32; MAX_DIMS]),
        dims: [u32; MAX_DIMS],
        n_out: usize,
        op: Binary,
    ) -> Result<CudaStorage> {
        let mut res = output::<T>(&self.dev, n_out)?;
        if n_out > 0 {
            let (n, cfg) = grid(n_out, "binary")?;
            let s = Strided2 { n, dims, a: sa, b: sb, op: binary_code(op) };
            let (a, b) = (p(x).offset(a_offset), p(y).offset(b_offset));
            // SAFETY: every input offset stays inside its buffer (checked by the caller); out holds n.
            unsafe { self.dev.launch(T::Binary::default(), cfg, (a, b, pm(&mut res), s))? };
        }
        Ok(self.wrap16(res, n_out))
    }

    /// [`CudaStorage::view_copy`] on 16-bit data (bits copied).
    pub(super) fn view_copy_b16<T: B16>(
        &self,
        x: &DeviceBuffer<T>,
        dims: [u32; MAX_DIMS],
        sa: [u32; MAX_DIMS],
        offset: usize,
        n_out: usize,
    ) -> Result<CudaStorage> {
        let mut res = output::<T>(&self.dev, n_out)?;
        if n_out > 0 {
            let (n, cfg) = grid(n_out, "view copy")?;
            let s = Strided2 { n, dims, a: sa, b: [0; MAX_DIMS], op: 0 };
            // SAFETY: every offset + off(i) is inside the input (checked by the caller); out holds n.
            unsafe { self.dev.launch(t::StridedCopyB16, cfg, (p(x).offset(offset), pm(&mut res), s))? };
        }
        Ok(self.wrap16(res, n_out))
    }

    pub(super) fn strided_copy_b16<T: B16>(
        &self,
        x: &DeviceBuffer<T>,
        out: &Shape,
        strides: &[usize],
    ) -> Result<CudaStorage> {
        let (dims, [sa]) = pad_walk("strided copy", out.dims(), [strides])?;
        let n_out = out.elem_count();
        let mut res = output::<T>(&self.dev, n_out)?;
        if n_out > 0 {
            let (n, cfg) = grid(n_out, "strided copy")?;
            let s = Strided2 { n, dims, a: sa, b: [0; MAX_DIMS], op: 0 };
            // SAFETY: offsets stay inside the input.
            unsafe { self.dev.launch(t::StridedCopyB16, cfg, (p(x), pm(&mut res), s))? };
        }
        Ok(self.wrap16(res, n_out))
    }

    pub(super) fn sum_into_b16<T: B16>(&self, x: &DeviceBuffer<T>, from: &Shape, to: &Shape) -> Result<CudaStorage> {
        let (params, out_n, red_n) = reduce_dims(from, to)?;
        if out_n == 1 && red_n > 1 {
            // One output: widened to f32 and summed by the block-parallel two-pass reduction (in
            // f32, fixed order), then rounded once.
            let wide = to_dtype(self, DType::F32)?.sum_into(from, to)?;
            return narrow_to::<T>(&wide);
        }
        let mut res = output::<T>(&self.dev, out_n)?;
        if out_n > 0 {
            let (_, cfg) = grid(out_n, "sum")?;
            // SAFETY: every offset is a valid index of `from`.
            unsafe { self.dev.launch(T::ReduceSumDims::default(), cfg, (p(x), pm(&mut res), params))? };
        }
        Ok(self.wrap16(res, out_n))
    }

    /// `op(self) op(b)` in `layout` (m x n out, reduction k) on the tensor cores, any shape. bf16
    /// operands on a device with the fused `wgmma` kernel (sm_90a) whose stored rows suit its
    /// tensor maps ([`in_place_layout`]) are read in place in their layout and the product is
    /// written in bf16 by the kernel's epilogue: no packing, no f32 product, no narrowing pass.
    /// Otherwise (f16, other shapes, other devices) the operands are packed k-major (transposed
    /// where `layout` stores them the other way, rows padded to a multiple of 8 with zeros; an
    /// operand already in that form is read as it is), an f32 product, then one narrowing pass to
    /// the dtype.
    pub(super) fn matmul_layout_b16<T: B16>(
        &self,
        x: &DeviceBuffer<T>,
        y: &DeviceBuffer<T>,
        m: usize,
        k: usize,
        n: usize,
        layout: Layout,
    ) -> Result<CudaStorage> {
        if m * n == 0 || k == 0 {
            return Ok(self.wrap16(zeros::<T>(&self.dev, m * n)?, m * n)); // an empty sum
        }
        if T::DTYPE == DType::BF16
            && (x.len(), y.len()) == (m * k, k * n)
            && let Some(w) = in_place_layout(layout, m, k, n)
            && self.dev.supports::<kiln_gpu::kernels::gemm_wgmma_fused::GemmWgmmaBf16Fused>()
        {
            use crate::cuda::gemm::{GemmEpilogue, WgmmaGemm};
            let v = u32s("matmul", &[m, n, k])?;
            let s = GemmShape { m: v[0], n: v[1], k: v[2] };
            // SAFETY (each cast): `T` is bf16 (checked above).
            let (a, b) = unsafe { (cast::<T, bf16>(x), cast::<T, bf16>(y)) };
            let mut out = output::<bf16>(&self.dev, m * n)?;
            let plan = WgmmaGemm::with_layout(&self.dev, a, b, s, w)?;
            // A^T B (a weight gradient's shape: few outputs summed over many rows) takes the
            // engine's k split where it helps; the other layouts keep their unsplit sums
            let split = if w == WgmmaLayout::AtB { plan.auto_split_k() } else { 1 };
            plan.with_split_k(split)?.run_fused(&mut out, GemmEpilogue::default())?;
            return Ok(self.wrap16(out, m * n));
        }
        let v = u32s("matmul", &[m, n, k])?;
        let kp = v[2].next_multiple_of(kiln_gpu::kernels::convert::PACK_K_MULTIPLE);
        // (source rows, source columns, transposed) of each operand, read as op(x) = x or x^T
        let (a_src, b_src) = match layout {
            Layout::NN => ((v[0], v[2], false), (v[2], v[1], true)),
            Layout::NT => ((v[0], v[2], false), (v[1], v[2], false)),
            Layout::TN => ((v[2], v[0], true), (v[2], v[1], true)),
        };
        let pack = |src: &DeviceBuffer<T>, (rows, cols, tr): (u32, u32, bool)| -> Result<Option<DeviceBuffer<T>>> {
            if !tr && cols == kp {
                return Ok(None); // already k-major rows of a multiple of 8
            }
            let out_rows = if tr { cols } else { rows } as usize;
            let len = out_rows * kp as usize;
            let mut dst = output::<T>(&self.dev, len)?;
            let (_, cfg) = grid(len, "matmul")?;
            // SAFETY: src holds rows x cols values, dst out_rows x kp (checked below 2^31).
            unsafe { self.dev.launch(t::PackB16, cfg, (p(src), pm(&mut dst), rows, cols, kp, tr as u32))? };
            Ok(Some(dst))
        };
        let (pa, pb) = (pack(x, a_src)?, pack(y, b_src)?);
        let mut c32 = CudaStorage::output(&self.dev, m * n)?;
        let s = GemmShape { m: v[0], n: v[1], k: kp };
        tensor_core_product::<T>(&self.dev, pa.as_ref().unwrap_or(x), pb.as_ref().unwrap_or(y), c32.f32_mut(), s)?;
        narrow_to::<T>(&c32)
    }

    /// Batched product (see `Tensor::matmul`): one product (a batch against a shared B is one
    /// (batch m) x k product) on the tensor cores; batches of distinct Bs widened to f32, multiplied
    /// by the batched f32 kernel and narrowed (bf16 batches on sm_90a leave before this, for the
    /// strided-batch `wgmma` kernel: [`CudaStorage::matmul`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_b16<T: B16>(
        &self,
        x: &DeviceBuffer<T>,
        y: &DeviceBuffer<T>,
        batch: usize,
        m: usize,
        kk: usize,
        n: usize,
        b_batched: bool,
    ) -> Result<CudaStorage> {
        if batch == 1 || !b_batched {
            return self.matmul_layout_b16(x, y, batch * m, kk, n, Layout::NN);
        }
        let (a32, b32) = (widen(&self.dev, x, self.len)?, widen(&self.dev, y, batch * kk * n)?);
        narrow_to::<T>(&a32.matmul(&b32, batch, m, kk, n, b_batched)?)
    }

    pub(super) fn softmax_b16<T: B16>(&self, x: &DeviceBuffer<T>, d: usize, log: bool) -> Result<CudaStorage> {
        let rows = self.len / d;
        let mut out = output::<T>(&self.dev, self.len)?;
        if rows > 0 {
            // SAFETY: rows * d elements in and out.
            unsafe {
                self.dev.launch(
                    T::SoftmaxRows::default(),
                    CudaStorage::rows_cfg(rows)?,
                    (p(x), pm(&mut out), d as u32, log as u32),
                )?
            };
        }
        Ok(self.wrap16(out, self.len))
    }

    pub(super) fn cross_entropy_b16<T: B16>(
        &self,
        x: &DeviceBuffer<T>,
        targets: &[usize],
        copy: &DeviceIndices,
        c: usize,
    ) -> Result<CudaStorage> {
        let n = targets.len();
        let tg = copy.on(&self.dev, targets, "cross_entropy")?;
        let mut rows = CudaStorage::output(&self.dev, n)?;
        // SAFETY: n rows of c logits; one target per row, each < c; n f32 row losses.
        unsafe {
            self.dev.launch(
                T::CrossEntropyRows::default(),
                CudaStorage::rows_cfg(n)?,
                (p(x), tg.ptr(), rows.f32_mut().ptr_mut(), c as u32),
            )?
        };
        let mut mean = CudaStorage::output(&self.dev, 1)?;
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
        let rows = rows.f32_mut();
        // SAFETY: `rows` holds n elements; `mean` one slot for the single block.
        unsafe {
            self.dev.launch(ReduceSumF32, cfg, (rows.ptr(), mean.f32_mut().ptr_mut(), n as u32, 1.0 / n as f32))?
        };
        narrow_to::<T>(&mean)
    }

    pub(super) fn cross_entropy_backward_b16<T: B16>(
        &self,
        x: &DeviceBuffer<T>,
        targets: &[usize],
        copy: &DeviceIndices,
        c: usize,
        g: &DeviceBuffer<T>,
    ) -> Result<CudaStorage> {
        let n = targets.len();
        let tg = copy.on(&self.dev, targets, "cross_entropy backward")?;
        let mut grad = output::<T>(&self.dev, n * c)?;
        // SAFETY: n rows of c logits and gradients; one target (< c) per row; g holds one element.
        unsafe {
            self.dev.launch(
                T::CrossEntropyBackwardRows::default(),
                CudaStorage::rows_cfg(n)?,
                (p(x), tg.ptr(), p(g), pm(&mut grad), c as u32, 1.0 / n as f32),
            )?
        };
        Ok(self.wrap16(grad, n * c))
    }

    pub(super) fn layer_norm_b16<T: B16>(
        &self,
        x: &DeviceBuffer<T>,
        w: &DeviceBuffer<T>,
        b: &DeviceBuffer<T>,
        d: usize,
        eps: f64,
    ) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
        let rows = self.len / d;
        let mut out = output::<T>(&self.dev, self.len)?;
        let (mut mean, mut rstd) = (output::<T>(&self.dev, rows)?, output::<T>(&self.dev, rows)?);
        if rows > 0 {
            let args = (p(x), p(w), p(b), pm(&mut out), pm(&mut mean), pm(&mut rstd), d as u32, eps as f32);
            // SAFETY: rows * d in and out; one mean and rstd per row; w and b hold d.
            unsafe { self.dev.launch(T::LayerNormRows::default(), CudaStorage::rows_cfg(rows)?, args)? };
        }
        Ok((self.wrap16(out, self.len), self.wrap16(mean, rows), self.wrap16(rstd, rows)))
    }

    pub(super) fn embedding_b16<T: B16>(&self, x: &DeviceBuffer<T>, ids: &[usize], d: usize) -> Result<CudaStorage> {
        let dev_ids = self.dev.upload(&u32s("embedding", ids)?)?;
        let mut out = output::<T>(&self.dev, ids.len() * d)?;
        if !ids.is_empty() && d > 0 {
            let (_, cfg) = grid(ids.len() * d, "embedding")?;
            let args = (p(x), dev_ids.ptr(), pm(&mut out), ids.len() as u32, d as u32);
            // SAFETY: every id < v; out holds n * d.
            unsafe { self.dev.launch(t::EmbeddingGatherB16, cfg, args)? };
        }
        Ok(self.wrap16(out, ids.len() * d))
    }

    pub(super) fn embedding_backward_b16<T: B16>(
        &self,
        x: &DeviceBuffer<T>,
        order: &[u32],
        offsets: &[u32],
        v: usize,
        d: usize,
    ) -> Result<CudaStorage> {
        let (o, off) = (self.dev.upload(order)?, self.dev.upload(offsets)?);
        let mut gw = output::<T>(&self.dev, v * d)?;
        if v * d > 0 {
            let (_, cfg) = grid(v * d, "embedding backward")?;
            let args = (p(x), o.ptr(), off.ptr(), pm(&mut gw), v as u32, d as u32);
            // SAFETY: offsets index `order`, whose entries index rows of self.
            unsafe { self.dev.launch(T::EmbeddingScatter::default(), cfg, args)? };
        }
        Ok(self.wrap16(gw, v * d))
    }

    pub(super) fn max_dim_b16<T: B16>(
        &self,
        x: &DeviceBuffer<T>,
        outer: usize,
        len: usize,
        inner: usize,
    ) -> Result<(CudaStorage, DeviceBuffer<u32>)> {
        let n = outer * inner;
        let mut vals = output::<T>(&self.dev, n)?;
        let mut arg = self.dev.zeros::<u32>(n)?;
        if n > 0 {
            let (_, cfg) = grid(n, "max")?;
            let v = u32s("max", &[outer, len, inner])?;
            // SAFETY: outer * len * inner inputs, n outputs.
            unsafe {
                self.dev.launch(T::MaxDim::default(), cfg, (p(x), pm(&mut vals), arg.ptr_mut(), v[0], v[1], v[2]))?
            };
        }
        Ok((self.wrap16(vals, n), arg))
    }

    pub(super) fn scatter_argmax_b16<T: B16>(
        &self,
        g: &DeviceBuffer<T>,
        argmax: &DeviceBuffer<u32>,
        n_in: usize,
    ) -> Result<CudaStorage> {
        let mut gx = zeros::<T>(&self.dev, n_in)?;
        if !argmax.is_empty() {
            let (n, cfg) = grid(argmax.len(), "max backward")?;
            // SAFETY: argmax offsets are < n_in and distinct.
            unsafe { self.dev.launch(t::ScatterArgmaxB16, cfg, (p(g), argmax.ptr(), pm(&mut gx), n))? };
        }
        Ok(self.wrap16(gx, n_in))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_table_rounds_to_nearest_even() {
        // values exact in f32 (where `half`'s f32 conversions are the reference), ties among them
        for v in [
            0.0,
            -0.0,
            1.0,
            1.0 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
            3.140625,
            65504.0,
            2f64.powi(-27) * 1.5,
            -2f64.powi(127) * 1.5,
        ] {
            assert_eq!(v as f32 as f64, v);
            assert_eq!(<bf16 as B16>::bits(v), bf16::from_f32(v as f32).to_bits());
            assert_eq!(<f16 as B16>::bits(v), f16::from_f32(v as f32).to_bits());
        }
        assert_eq!(<bf16 as B16>::bits(f64::INFINITY), bf16::INFINITY.to_bits());
        assert_eq!(<bf16 as B16>::FORMAT, format::BF16);
        assert_eq!(<f16 as B16>::FORMAT, format::F16);
        assert_eq!(<bf16 as B16>::DTYPE, DType::BF16);
        assert_eq!(<f16 as B16>::DTYPE, DType::F16);
    }

    #[test]
    fn table_kernels_are_the_formats_own() {
        use kiln_gpu::Kernel;
        assert_eq!(<<bf16 as B16>::Unary as Kernel>::NAME, "unary_bf16");
        assert_eq!(<<f16 as B16>::Unary as Kernel>::NAME, "unary_f16");
        assert_eq!(<<bf16 as B16>::LayerNormRows as Kernel>::NAME, "layer_norm_rows_bf16");
        assert_eq!(<<f16 as B16>::CrossEntropyBackwardRows as Kernel>::NAME, "cross_entropy_backward_rows_f16");
        assert_eq!(<<f16 as B16>::EmbeddingScatter as Kernel>::NAME, "embedding_scatter_f16");
    }

    #[test]
    fn bf16_products_read_in_place_only_where_every_pitch_is_a_multiple_of_8() {
        // NN: A m x k (pitch k), B k x n (pitch n)
        assert_eq!(in_place_layout(Layout::NN, 5, 16, 24), Some(WgmmaLayout::AB));
        assert_eq!(in_place_layout(Layout::NN, 5, 16, 20), None);
        assert_eq!(in_place_layout(Layout::NN, 5, 12, 24), None);
        // NT: both pitch k; m and n free
        assert_eq!(in_place_layout(Layout::NT, 3, 64, 7), Some(WgmmaLayout::ABt));
        assert_eq!(in_place_layout(Layout::NT, 3, 63, 7), None);
        // TN: A k x m (pitch m), B k x n (pitch n); k free
        assert_eq!(in_place_layout(Layout::TN, 8, 3, 16), Some(WgmmaLayout::AtB));
        assert_eq!(in_place_layout(Layout::TN, 12, 3, 16), None);
        assert_eq!(in_place_layout(Layout::TN, 8, 3, 4), None);
        // empty products and sizes past 32 bits are packed (or answered) elsewhere
        for l in [Layout::NN, Layout::NT, Layout::TN] {
            assert_eq!(in_place_layout(l, 0, 8, 8), None);
            assert_eq!(in_place_layout(l, 8, 0, 8), None);
            assert_eq!(in_place_layout(l, 8, 8, 0), None);
            assert_eq!(in_place_layout(l, 8, 8, 1 << 33), None);
        }
    }

    #[test]
    fn reduce_dims_splits_kept_and_reduced() {
        // [2, 3, 4] summed into [3, 1]: kept dim 1 (stride 4), reduced dims 0 and 2
        let (p, out_n, red_n) = reduce_dims(&Shape(vec![2, 3, 4]), &Shape(vec![3, 1])).unwrap();
        assert_eq!((out_n, red_n), (3, 8));
        assert_eq!(p.kept_dims, [1, 1, 1, 3]);
        assert_eq!(p.kept_strides, [0, 0, 0, 4]);
        assert_eq!(p.red_dims, [1, 1, 2, 4]);
        assert_eq!(p.red_strides, [0, 0, 12, 1]);
    }
}

/// The strided write of [`CudaStorage::scatter_from`] for 16-bit data (bits copied).
///
/// # Safety
/// Both walks of `p` stay inside their buffers from the given offsets, and the destination
/// offsets are distinct.
pub(super) unsafe fn scatter<T: B16>(
    dev: &CudaDevice,
    cfg: LaunchConfig,
    x: &DeviceBuffer<T>,
    src_offset: usize,
    out: &mut DeviceBuffer<T>,
    dst_offset: usize,
    s: Strided2,
) -> Result<()> {
    unsafe { dev.launch(t::StridedScatterB16, cfg, (p(x).offset(src_offset), pm(out).offset(dst_offset), s)) }
}
