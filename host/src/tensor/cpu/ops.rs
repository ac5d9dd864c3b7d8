//! The CPU reference of every op: maps written once over [`Float`], and the [`CpuStorage`] methods
//! the backend table (`Storage` in `storage.rs`) calls, one per op.

use super::{CpuStorage, Float, Map1, Map2, par_rows};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::elementwise::{Binary, Unary};
use crate::tensor::shape::Shape;

impl CpuStorage {
    /// An elementwise function of one input.
    pub(crate) fn unary(&self, u: Unary) -> Result<CpuStorage> {
        u.map(self)
    }

    /// `self (op) other`, their shapes `a` and `b` broadcast to `out`.
    pub(crate) fn binary(
        &self,
        a: &Shape,
        other: &CpuStorage,
        b: &Shape,
        out: &Shape,
        op: Binary,
    ) -> Result<CpuStorage> {
        BroadcastBinary { op, a, b, out }.map(self, other).map_err(|e| match e {
            Error::DType { got, expected, .. } => Error::DType { op: op.name(), got, expected },
            e => e,
        })
    }

    /// The elements at `offsets`, in order (a dense copy of a view; every dtype).
    pub(crate) fn gather(&self, offsets: &[usize]) -> CpuStorage {
        fn pick<T: Copy>(v: &[T], offsets: &[usize]) -> Vec<T> {
            offsets.iter().map(|&o| v[o]).collect()
        }
        match self {
            CpuStorage::F32(v) => CpuStorage::F32(pick(v, offsets)),
            CpuStorage::F64(v) => CpuStorage::F64(pick(v, offsets)),
            CpuStorage::BF16(v) => CpuStorage::BF16(pick(v, offsets)),
            CpuStorage::F16(v) => CpuStorage::F16(pick(v, offsets)),
        }
    }

    /// `self[dst[i]] = src[src_offsets[i]]` for every `i` (a strided write; every dtype, both the
    /// same).
    pub(crate) fn scatter(&mut self, dst: &[usize], src: &CpuStorage, src_offsets: &[usize]) -> Result<()> {
        fn put<T: Copy>(out: &mut [T], dst: &[usize], v: &[T], src: &[usize]) {
            for (&d, &s) in dst.iter().zip(src) {
                out[d] = v[s];
            }
        }
        match (self, src) {
            (CpuStorage::F32(o), CpuStorage::F32(v)) => put(o, dst, v, src_offsets),
            (CpuStorage::F64(o), CpuStorage::F64(v)) => put(o, dst, v, src_offsets),
            (CpuStorage::BF16(o), CpuStorage::BF16(v)) => put(o, dst, v, src_offsets),
            (CpuStorage::F16(o), CpuStorage::F16(v)) => put(o, dst, v, src_offsets),
            (o, v) => return Err(Error::DType { op: "strided write", got: v.dtype(), expected: o.dtype() }),
        }
        Ok(())
    }

    /// `self` (shape `from`) summed into `to`, a shape that broadcasts to `from` (every dtype: `_op`
    /// names no error).
    pub(crate) fn sum_into(&self, _op: &'static str, from: &Shape, to: &Shape) -> Result<CpuStorage> {
        match self {
            CpuStorage::F32(v) => Ok(CpuStorage::F32(sum_into(v, from, to))),
            CpuStorage::F64(v) => Ok(CpuStorage::F64(sum_into(v, from, to))),
            // bf16 / f16: accumulated in f64, rounded once
            other => Ok(CpuStorage::F32(sum_into(&other.as_f32(), from, to)).to_dtype(other.dtype())),
        }
    }

    /// Softmax or log-softmax of each row of `d` (max-subtracted).
    pub(crate) fn softmax(&self, d: usize, log: bool) -> Result<CpuStorage> {
        SoftmaxRows { log, d }.map(self)
    }

    /// Mean cross-entropy of (n, c) logits against `targets` (already range-checked): the
    /// log-softmax, then the mean of the picked entries in f64.
    pub(crate) fn cross_entropy(&self, targets: &[usize], c: usize) -> Result<CpuStorage> {
        let logp = self.softmax(c, true)?.to_f64_vec();
        let n = targets.len();
        let loss: f64 = targets.iter().enumerate().map(|(i, &t)| -logp[i * c + t]).sum::<f64>() / n as f64;
        Ok(CpuStorage::from_f64(self.dtype(), &[loss]))
    }

    /// Layer norm of rows of `d` with scale `w` and shift `b`: (out, mean, rstd).
    pub(crate) fn layer_norm(
        &self,
        w: &CpuStorage,
        b: &CpuStorage,
        d: usize,
        eps: f64,
    ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
        let op = "layer_norm";
        let f = LayerNormFwd { d, eps };
        Ok(match (self, w, b) {
            (CpuStorage::F32(x), CpuStorage::F32(w), CpuStorage::F32(b)) => {
                let (o, m, r) = f.run(x, w, b);
                (CpuStorage::F32(o), CpuStorage::F32(m), CpuStorage::F32(r))
            }
            (CpuStorage::F64(x), CpuStorage::F64(w), CpuStorage::F64(b)) => {
                let (o, m, r) = f.run(x, w, b);
                (CpuStorage::F64(o), CpuStorage::F64(m), CpuStorage::F64(r))
            }
            (x, w, _) if x.dtype() != w.dtype() => {
                return Err(Error::DType { op, got: w.dtype(), expected: x.dtype() });
            }
            (x, _, b) if x.dtype() != b.dtype() => {
                return Err(Error::DType { op, got: b.dtype(), expected: x.dtype() });
            }
            // bf16 / f16: in f32 (statistics in f64), out, mean and rstd rounded once to the dtype
            (x, w, b) => {
                let (o, m, r) = f.run(&x.as_f32(), &w.as_f32(), &b.as_f32());
                let d = x.dtype();
                (CpuStorage::F32(o).to_dtype(d), CpuStorage::F32(m).to_dtype(d), CpuStorage::F32(r).to_dtype(d))
            }
        })
    }

    /// Rows of the (v, d) table `self` for `ids` (already range-checked).
    pub(crate) fn embedding(&self, ids: &[usize], d: usize) -> CpuStorage {
        let table = self.to_f64_vec();
        let mut out = Vec::with_capacity(ids.len() * d);
        for &id in ids {
            out.extend_from_slice(&table[id * d..(id + 1) * d]);
        }
        CpuStorage::from_f64(self.dtype(), &out)
    }

    /// The embedding gradient: rows of `self` (n, d) summed per id into a (v, d) table of `dtype`.
    pub(crate) fn embedding_backward(&self, ids: &[usize], v: usize, d: usize, dtype: DType) -> CpuStorage {
        let gv = self.to_f64_vec();
        let mut gw = vec![0.0; v * d];
        // Deterministic scatter-add: positions in order, one thread.
        for (pos, &row) in ids.iter().enumerate() {
            for c in 0..d {
                gw[row * d + c] += gv[pos * d + c];
            }
        }
        CpuStorage::from_f64(dtype, &gw)
    }

    /// Maximum along the middle of (outer, len, inner): the values, and the input offset of each
    /// (the first maximum; a NaN wins).
    pub(crate) fn max_dim(&self, outer: usize, len: usize, inner: usize) -> (CpuStorage, Vec<usize>) {
        let v = self.to_f64_vec();
        let mut vals = Vec::with_capacity(outer * inner);
        let mut arg = Vec::with_capacity(outer * inner);
        for o in 0..outer {
            for i in 0..inner {
                let mut best = o * len * inner + i;
                for j in 1..len {
                    let idx = (o * len + j) * inner + i;
                    if v[idx] > v[best] || (v[idx].is_nan() && !v[best].is_nan()) {
                        best = idx;
                    }
                }
                vals.push(v[best]);
                arg.push(best);
            }
        }
        (CpuStorage::from_f64(self.dtype(), &vals), arg)
    }

    /// The gradient of a max: `self` added at the `argmax` offsets of an input of `n_in` elements
    /// of `dtype`.
    pub(crate) fn scatter_argmax(&self, argmax: &[usize], n_in: usize, dtype: DType) -> CpuStorage {
        let gv = self.to_f64_vec();
        let mut gx = vec![0.0; n_in];
        for (o, &src) in argmax.iter().enumerate() {
            gx[src] += gv[o];
        }
        CpuStorage::from_f64(dtype, &gx)
    }

    /// The column of the (first) maximum of each row of `d`.
    pub(crate) fn argmax_last(&self, d: usize) -> Vec<usize> {
        self.to_f64_vec()
            .chunks(d)
            .map(|r| r.iter().enumerate().fold(0, |best, (i, &x)| if x > r[best] { i } else { best }))
            .collect()
    }
}

const GELU_C: f64 = 0.797_884_560_802_865_4; // sqrt(2/pi)
const GELU_A: f64 = 0.044_715;

impl Map1 for Unary {
    fn f<T: Float>(&self, x: &[T]) -> Result<Vec<T>> {
        let c = T::from_f64(GELU_C);
        let a = T::from_f64(GELU_A);
        let half = T::from_f64(0.5);
        Ok(match *self {
            Unary::Neg => x.iter().map(|&v| -v).collect(),
            Unary::Exp => x.iter().map(|&v| v.exp()).collect(),
            Unary::Log => x.iter().map(|&v| v.ln()).collect(),
            Unary::Sqrt => x.iter().map(|&v| v.sqrt()).collect(),
            Unary::Relu => x.iter().map(|&v| if v > T::ZERO { v } else { T::ZERO }).collect(),
            Unary::Gelu => x.iter().map(|&v| half * v * (T::ONE + (c * (v + a * v * v * v)).tanh())).collect(),
            Unary::GeluGrad => x
                .iter()
                .map(|&v| {
                    let t = (c * (v + a * v * v * v)).tanh();
                    half * (T::ONE + t) + half * v * (T::ONE - t * t) * c * (T::ONE + T::from_f64(3.0) * a * v * v)
                })
                .collect(),
            Unary::Tanh => x.iter().map(|&v| v.tanh()).collect(),
            Unary::Sigmoid => x.iter().map(|&v| T::ONE / (T::ONE + (-v).exp())).collect(),
            Unary::Step => x.iter().map(|&v| if v > T::ZERO { T::ONE } else { T::ZERO }).collect(),
            Unary::AddScalar(s) => {
                let s = T::from_f64(s);
                x.iter().map(|&v| v + s).collect()
            }
            Unary::MulScalar(s) => {
                let s = T::from_f64(s);
                x.iter().map(|&v| v * s).collect()
            }
        })
    }
}

struct BroadcastBinary<'a> {
    op: Binary,
    a: &'a Shape,
    b: &'a Shape,
    out: &'a Shape,
}

/// Visits every index of `out` in row-major order, with the matching offsets into two inputs read
/// through (possibly zero) strides.
fn for_each_broadcast(out: &Shape, sa: &[usize], sb: &[usize], mut f: impl FnMut(usize, usize)) {
    let dims = out.dims();
    let n = out.elem_count();
    if n == 0 {
        return;
    }
    let r = dims.len();
    let mut idx = vec![0usize; r];
    let (mut oa, mut ob) = (0usize, 0usize);
    for _ in 0..n {
        f(oa, ob);
        // odometer increment
        for d in (0..r).rev() {
            idx[d] += 1;
            oa += sa[d];
            ob += sb[d];
            if idx[d] < dims[d] {
                break;
            }
            oa -= sa[d] * dims[d];
            ob -= sb[d] * dims[d];
            idx[d] = 0;
        }
    }
}

impl Map2 for BroadcastBinary<'_> {
    const OP: &'static str = "binary";
    fn f<T: Float>(&self, a: &[T], b: &[T]) -> Result<Vec<T>> {
        let apply = |x: T, y: T| match self.op {
            Binary::Add => x + y,
            Binary::Sub => x - y,
            Binary::Mul => x * y,
            Binary::Div => x / y,
            Binary::ReluGrad => x * if y > T::ZERO { T::ONE } else { T::ZERO },
        };
        if self.a == self.b {
            return Ok(a.iter().zip(b).map(|(&x, &y)| apply(x, y)).collect());
        }
        let (sa, sb) = (self.a.broadcast_strides(self.out), self.b.broadcast_strides(self.out));
        let mut out = Vec::with_capacity(self.out.elem_count());
        for_each_broadcast(self.out, &sa, &sb, |i, j| out.push(apply(a[i], b[j])));
        Ok(out)
    }
}

/// Sum of `x` (shape `from`) into shape `to`, where `from` is a broadcast of `to` (same rank after
/// left-padding with 1s). Accumulates in f64, in row-major order of `from`.
fn sum_into<T: Float>(x: &[T], from: &Shape, to: &Shape) -> Vec<T> {
    let padded = Shape([vec![1; from.rank() - to.rank()], to.dims().to_vec()].concat());
    let st = padded.broadcast_strides(from);
    let mut acc = vec![0.0f64; to.elem_count()];
    let zeros = vec![0; from.rank()];
    let mut k = 0;
    for_each_broadcast(from, &st, &zeros, |o, _| {
        acc[o] += x[k].to_f64();
        k += 1;
    });
    acc.into_iter().map(T::from_f64).collect()
}

/// Applies `f(row_index, row, out_row)` to every row of length `d`, rows in parallel.
fn map_rows<T: Float>(x: &[T], d: usize, f: impl Fn(usize, &[T], &mut [T]) + Sync) -> Vec<T> {
    let mut out = vec![T::ZERO; x.len()];
    par_rows(&mut out, d, d * 8, |row0, chunk| {
        for (r, orow) in chunk.chunks_mut(d).enumerate() {
            let i = row0 + r;
            f(i, &x[i * d..(i + 1) * d], orow);
        }
    });
    out
}

struct SoftmaxRows {
    log: bool,
    d: usize,
}
impl Map1 for SoftmaxRows {
    fn f<T: Float>(&self, x: &[T]) -> Result<Vec<T>> {
        Ok(map_rows(x, self.d, |_, row, out| {
            let m = row.iter().fold(T::from_f64(f64::NEG_INFINITY), |a, &b| a.maxf(b));
            let mut s = 0.0f64;
            for &v in row {
                s += (v - m).exp().to_f64();
            }
            if self.log {
                let ls = T::from_f64(s.ln());
                for (o, &v) in out.iter_mut().zip(row) {
                    *o = v - m - ls;
                }
            } else {
                let inv = T::from_f64(1.0 / s);
                for (o, &v) in out.iter_mut().zip(row) {
                    *o = (v - m).exp() * inv;
                }
            }
        }))
    }
}

struct LayerNormFwd {
    d: usize,
    eps: f64,
}
impl LayerNormFwd {
    /// Normalized rows, with per-row mean and rstd from Welford's algorithm (in f64).
    fn run<T: Float>(&self, x: &[T], w: &[T], b: &[T]) -> (Vec<T>, Vec<T>, Vec<T>) {
        let d = self.d;
        let rows = x.len() / d;
        let mut mean = vec![T::ZERO; rows];
        let mut rstd = vec![T::ZERO; rows];
        for r in 0..rows {
            let (mut m, mut m2) = (0.0f64, 0.0f64);
            for (i, &v) in x[r * d..(r + 1) * d].iter().enumerate() {
                let v = v.to_f64();
                let delta = v - m;
                m += delta / (i + 1) as f64;
                m2 += delta * (v - m);
            }
            mean[r] = T::from_f64(m);
            rstd[r] = T::from_f64(1.0 / (m2 / d as f64 + self.eps).sqrt());
        }
        let out = map_rows(x, d, |r, row, o| {
            for c in 0..d {
                o[c] = (row[c] - mean[r]) * rstd[r] * w[c] + b[c];
            }
        });
        (out, mean, rstd)
    }
}
