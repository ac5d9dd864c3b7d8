//! How a [`GpuStep`](super::GpuStep) lays host values out on the device: operand buffers in the
//! path's format (f32 or bf16), instructions as device-copyable words, and matrices with padded
//! rows ([`pitch`]) or transposed into K-major copies.

use crate::error::Result;
use crate::megakernel::DataPath;
use kiln_gpu::megakernel::{Instruction, pitch};

/// A device buffer of product operands as a step kernel reads them: f32 values (tf32 ones on
/// [`DataPath::Tf32`]), or on [`DataPath::Bf16`] bf16 ones at the same element indices. The
/// host passes and reads f32 either way (values already rounded as [`DataPath::operand`] does,
/// so that the narrowing is exact).
pub(super) enum OperandBuffer {
    F32(crate::cuda::DeviceBuffer<f32>),
    Bf16(crate::cuda::DeviceBuffer<half::bf16>),
}

impl OperandBuffer {
    /// `n` zeros of `path`'s operand format.
    pub(super) fn zeros(dev: &crate::cuda::Device, path: DataPath, n: usize) -> Result<OperandBuffer> {
        Ok(match path {
            DataPath::Bf16 => OperandBuffer::Bf16(dev.zeros::<half::bf16>(n)?),
            _ => OperandBuffer::F32(dev.zeros::<f32>(n)?),
        })
    }

    /// `v` in `path`'s operand format.
    pub(super) fn upload(dev: &crate::cuda::Device, path: DataPath, v: &[f32]) -> Result<OperandBuffer> {
        Ok(match path {
            DataPath::Bf16 => OperandBuffer::Bf16(dev.upload(&to_bf16(v))?),
            _ => OperandBuffer::F32(dev.upload(v)?),
        })
    }

    /// Overwrites the first `v.len()` elements.
    pub(super) fn write_prefix(&mut self, dev: &crate::cuda::Device, v: &[f32]) -> Result<()> {
        match self {
            OperandBuffer::Bf16(b) => dev.write_prefix(b, &to_bf16(v)),
            OperandBuffer::F32(b) => dev.write_prefix(b, v),
        }
    }

    /// Every element, widened to f32.
    pub(super) fn download(&self, dev: &crate::cuda::Device) -> Result<Vec<f32>> {
        Ok(match self {
            OperandBuffer::Bf16(b) => dev.download(b)?.into_iter().map(half::bf16::to_f32).collect(),
            OperandBuffer::F32(b) => dev.download(b)?,
        })
    }

    /// The device address of element `i`.
    pub(super) fn addr_of(&self, i: u32) -> u64 {
        match self {
            OperandBuffer::Bf16(b) => b.addr() + 2 * i as u64,
            OperandBuffer::F32(b) => b.addr() + 4 * i as u64,
        }
    }

    /// The kernel parameter (typed f32; the bf16 kernel stores bf16 through it).
    pub(super) fn ptr_mut(&mut self) -> kiln_gpu::DevicePtrMut<f32> {
        kiln_gpu::DevicePtrMut::from_addr(self.addr_of(0))
    }
}

/// `v` as bf16 (rounded to nearest, ties to even: exact for values already rounded).
fn to_bf16(v: &[f32]) -> Vec<half::bf16> {
    v.iter().map(|&x| half::bf16::from_f32(x)).collect()
}

/// An [`Instruction`] as a device-copyable value (cudarc's `DeviceRepr` is implemented here, where
/// the orphan rule allows it; the layout is the instruction's own).
#[repr(transparent)]
#[derive(Clone, Copy)]
pub(super) struct InstructionWords(pub(super) Instruction);
// SAFETY: repr(transparent) over a repr(C) struct of u32.
unsafe impl cudarc::driver::DeviceRepr for InstructionWords {}

/// `rows` rows of `cols` values, each padded with zeros to [`pitch`]`(cols)`.
pub(super) fn pad_rows(v: &[f32], cols: usize) -> Vec<f32> {
    let p = pitch(cols as u32) as usize;
    if p == cols {
        return v.to_vec();
    }
    let mut out = vec![0.0; v.len() / cols * p];
    for (dst, src) in out.chunks_mut(p).zip(v.chunks(cols)) {
        dst[..cols].copy_from_slice(src);
    }
    out
}

/// `rows x cols` values (unpadded rows) transposed into `cols` rows of `rows` values, each padded
/// with zeros to [`pitch`]`(rows)`.
pub(super) fn transpose_padded(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let p = pitch(rows as u32) as usize;
    let mut out = vec![0.0; cols * p];
    for (r, row) in v.chunks(cols).enumerate() {
        for (c, &x) in row.iter().enumerate() {
            out[c * p + r] = x;
        }
    }
    out
}

/// The inverse of [`pad_rows`].
fn unpad_rows(v: &[f32], cols: usize) -> Vec<f32> {
    let p = pitch(cols as u32) as usize;
    v.chunks(p).flat_map(|r| r[..cols].iter().copied()).collect()
}

/// Consecutive padded matrices of `(rows, cols)` each (rows of [`pitch`]`(cols)`), unpadded.
pub(super) fn split_rows(flat: &[f32], shapes: impl Iterator<Item = (usize, usize)>) -> Vec<Vec<f32>> {
    let mut at = 0;
    shapes
        .map(|(rows, cols)| {
            let n = rows * pitch(cols as u32) as usize;
            let m = unpad_rows(&flat[at..at + n], cols);
            at += n;
            m
        })
        .collect()
}
