//! One attention rung, one command: run a flash forward kernel by name on fresh random inputs,
//! check it against the f64 reference and time it (`kiln attention --kernel NAME --shape BxHxSxD`).

use crate::attention::{self as reference, AttentionParams};
use crate::cuda::attention::{
    AttentionShape, FlashBwdKernel, FlashElement, FlashEntry, FlashKernel, flash_backward_with, flash_entry,
    flash_forward_blocks,
};
use crate::cuda::{Device, timing};
use crate::dtype::DType;
use crate::error::Result;
use half::{bf16, f16};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// f32 accumulation's unit roundoff with room for the tensor cores' internal order (as the GEMM
/// checks use).
const U_ACC: f64 = 1.0 / (1u64 << 22) as f64;

/// The largest `|O - O_ref|` (and `|lse - lse_ref|`) a kernel may show on inputs uniform in
/// `[-1, 1)`, from the error analysis (the reference sees the inputs already rounded to the
/// kernel's dtype, so input rounding is not part of it):
///
/// - a score `s = scale q . k` accumulated in f32 over `D` products of size at most 1 is off by at
///   most `δ = D u D scale` (`u = 2^-22`); a score error `δ` moves each probability by a relative
///   `2 δ`, and so O (a convex combination of V rows, `|v| <= 1`) and the log-sum-exp by `2 δ`;
/// - `ex2.approx` and the f32 sums of `p` and of `p v` over `kv_len` terms: `2^-17 + kv_len u`;
/// - `mma.sync` rounds P to bf16 (f16) before `P V`: a relative `2^-9` (`2^-11`) on each term of
///   the combination, so `2^-9` (`2^-11`) on O; f16 flushes probabilities below 2^-24 to
///   subnormals, at most `kv_len 2^-25` more (the row sum `l >= 1`);
/// - a 16-bit output is rounded once more: `2^-9` (bf16) or `2^-11` (f16) of `|O| <= 1`.
///
/// Returns `(O bound, log-sum-exp bound)`.
pub fn forward_bound(kernel: FlashKernel, dtype: DType, p: &AttentionParams) -> (f64, f64) {
    let d = p.head_dim as f64;
    let delta = d * U_ACC * d * p.scale as f64;
    let f32_part = 2.0 * delta + 2f64.powi(-17) + p.kv_len as f64 * U_ACC;
    let unit = match dtype {
        DType::BF16 => 2f64.powi(-9),
        DType::F16 => 2f64.powi(-11),
        DType::F32 | DType::F64 => 0.0,
    };
    let p_rounding = match (kernel, dtype) {
        (FlashKernel::MmaSync | FlashKernel::Wgmma | FlashKernel::Wgmma2 | FlashKernel::WgmmaPingPong, DType::F16) => {
            unit + p.kv_len as f64 * 2f64.powi(-25)
        }
        (FlashKernel::MmaSync | FlashKernel::Wgmma | FlashKernel::Wgmma2 | FlashKernel::WgmmaPingPong, _) => unit,
        (FlashKernel::Simt, _) => 0.0,
    };
    (f32_part + p_rounding + unit, f32_part)
}

/// The random inputs for `s` from `seed`, uniform in [-1, 1): Q, K, V (every kernel gets the same
/// values for the same shape and seed).
pub fn inputs(s: AttentionShape, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut uniform = |len: usize| -> Vec<f32> { (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect() };
    let q = uniform(s.q_elems());
    let k = uniform(s.kv_elems());
    (q, k, uniform(s.kv_elems()))
}

/// The outcome of one run.
#[derive(Clone, Debug)]
pub struct AttentionRun {
    /// The kernel's table entry.
    pub entry: FlashEntry,
    /// The problem.
    pub params: AttentionParams,
    /// Median milliseconds per launch.
    pub ms: f64,
    /// Forward FLOPs (`4 B H Sq Skv D`, halved with the causal mask) per second, in TFLOP/s.
    pub tflops: f64,
    /// Query rows compared with the f64 reference (all, or a random sample and the corners).
    pub rows_checked: usize,
    /// The largest `|O - O_ref|` over them (NaN where an output was never written: outputs are
    /// poisoned before the launch).
    pub o_error: f64,
    /// The largest `|lse - lse_ref|` (rows that see no key must give `-inf` exactly).
    pub lse_error: f64,
    /// `(O, lse)` bounds ([`forward_bound`]).
    pub bound: (f64, f64),
    /// The backward's run, with `--backward`.
    pub backward: Option<BackwardRun>,
}

/// The backward's outcome (`kiln attention --backward`).
#[derive(Clone, Debug)]
pub struct BackwardRun {
    /// The backward kernel (`--backward-kernel`, or [`FlashBwdKernel::of_forward`] of the forward
    /// rung: `Wgmma2` after the Hopper rungs, `MmaSync` after `mma.sync`'s, `Simt` after the CUDA
    /// cores').
    pub kernel: FlashBwdKernel,
    /// Median milliseconds per backward (its three launches).
    pub ms: f64,
    /// `2.5` times the forward's FLOPs (five products instead of two) per second, in TFLOP/s.
    pub tflops: f64,
    /// The largest `|g - g_ref| / max |g_ref|` of dQ, dK and dV, where the problem is small enough
    /// for the f64 reference ([`BACKWARD_CHECK_LIMIT`]); `None` where it is not.
    pub errors: Option<[f64; 3]>,
    /// Their bound ([`backward_tolerance`]).
    pub bound: f64,
}

/// The backward is checked against the f64 reference when `B H Sq Skv D` is at most this.
pub const BACKWARD_CHECK_LIMIT: f64 = (1u64 << 30) as f64;

/// The backward's tolerances, relative to the largest reference gradient of each tensor:
/// `(elementwise, relative L2)`. f32: every product and sum in f32 over at most `D + kv_len`
/// (or `q_len`) terms, a worst case near `(D + len) 2^-24` of the magnitudes (about 2^-14 for the
/// tested sizes), with margin. bf16: O (which enters `delta = dO . O`) and the gradients are rounded
/// to bf16, a relative 2^-9 each, and the error of `delta` is multiplied by up to `D` in `dS`; the
/// `mma.sync` backward also rounds P and dS to bf16 (f16) before their products (a relative 2^-9,
/// 2^-11 on each term), inside the same bound.
pub fn backward_tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::BF16 | DType::F16 => (2f64.powi(-4), 2f64.powi(-6)),
        DType::F32 | DType::F64 => (2f64.powi(-12), 2f64.powi(-14)),
    }
}

impl AttentionRun {
    /// Whether every checked value is within its bound.
    pub fn passed(&self) -> bool {
        let bwd = self.backward.as_ref().is_none_or(|b| b.errors.is_none_or(|e| e.iter().all(|&x| x <= b.bound)));
        self.o_error <= self.bound.0 && self.lse_error <= self.bound.1 && bwd
    }
}

impl std::fmt::Display for AttentionRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = &self.params;
        writeln!(
            f,
            "{} {}x{}x{}x{}, kv_len {}{}: O = softmax(scale Q K^T) V, {:?} in and out, f32 math, scale {}",
            self.entry.name,
            p.batch,
            p.heads,
            p.q_len,
            p.head_dim,
            p.kv_len,
            if p.causal != 0 { ", causal" } else { "" },
            self.entry.dtype,
            p.scale
        )?;
        writeln!(
            f,
            "  error: max |O - O_ref| = {:.3e} (bound {:.3e}), max |lse - lse_ref| = {:.3e} (bound {:.3e}) over {} rows: {}",
            self.o_error,
            self.bound.0,
            self.lse_error,
            self.bound.1,
            self.rows_checked,
            if self.passed() { "ok" } else { "FAILED" }
        )?;
        write!(f, "  time: {:.4} ms (median), {:.1} TFLOP/s", self.ms, self.tflops)?;
        if let Some(b) = &self.backward {
            match b.errors {
                Some([q, k, v]) => write!(
                    f,
                    "\n  backward error: max |g - g_ref| / max |g_ref| = {q:.3e} (dQ), {k:.3e} (dK), {v:.3e} (dV), bound {:.3e}: {}",
                    b.bound,
                    if [q, k, v].iter().all(|&x| x <= b.bound) { "ok" } else { "FAILED" }
                )?,
                None => write!(
                    f,
                    "\n  backward: not checked (over {BACKWARD_CHECK_LIMIT:e} = B H Sq Skv D for the f64 reference)"
                )?,
            }
            write!(f, "\n  backward time: {:.4} ms (median), {:.1} TFLOP/s", b.ms, b.tflops)?;
            write!(f, "\n  backward kernel: {:?}", b.kernel)?;
        }
        Ok(())
    }
}

/// Rows checked in full up to this many; beyond, a random sample of this many and the corners.
pub const FULL_CHECK_ROWS: usize = 1024;

/// Runs kernel `name` on `s` (scale `1 / sqrt(head_dim)`) with random inputs from `seed`: once on
/// poisoned outputs for the check, then `reps` timed launches (median). With `backward` (a backward
/// kernel, e.g. [`FlashBwdKernel::of_forward`] of the entry's rung), also the backward (from a
/// random output gradient), checked where [`BACKWARD_CHECK_LIMIT`] allows. `blocks`: the Hopper
/// forwards' block count ([`flash_forward_blocks`]; `None` for the default).
#[allow(clippy::too_many_arguments)]
pub fn run(
    dev: &Device,
    name: &str,
    s: AttentionShape,
    causal: bool,
    reps: usize,
    seed: u64,
    backward: Option<FlashBwdKernel>,
    blocks: Option<u32>,
) -> Result<AttentionRun> {
    let entry = flash_entry(name)?;
    let (q32, k32, v32) = inputs(s, seed);
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let p = s.params(causal, scale);
    let bwd = backward.map(|_| {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_00d0);
        (0..s.q_elems()).map(|_| rng.random_range(-1.0f32..1.0)).collect::<Vec<f32>>()
    });
    let d_o = bwd.as_deref().zip(backward);
    let (o, lse, q, k, v, ms, grads) = match entry.dtype {
        DType::F32 => {
            launch::<f32>(dev, entry.kernel, [&q32, &k32, &v32], d_o, s, causal, scale, (reps, blocks), |x| x, |x| x)?
        }
        DType::BF16 => launch::<bf16>(
            dev,
            entry.kernel,
            [&q32, &k32, &v32],
            d_o,
            s,
            causal,
            scale,
            (reps, blocks),
            bf16::from_f32,
            bf16::to_f32,
        )?,
        DType::F16 => launch::<f16>(
            dev,
            entry.kernel,
            [&q32, &k32, &v32],
            d_o,
            s,
            causal,
            scale,
            (reps, blocks),
            f16::from_f32,
            f16::to_f32,
        )?,
        DType::F64 => unreachable!("no f64 entry in the table"),
    };
    let heads = p.heads_total() as usize;
    let rows = heads * s.q_len as usize;
    let picks: Vec<(usize, usize)> = if rows <= FULL_CHECK_ROWS {
        (0..rows).map(|r| (r / s.q_len as usize, r % s.q_len as usize)).collect()
    } else {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x9e37_79b9);
        let last = s.q_len as usize - 1;
        let mut v: Vec<(usize, usize)> =
            (0..FULL_CHECK_ROWS).map(|_| (rng.random_range(0..heads), rng.random_range(0..=last))).collect();
        v.extend([(0, 0), (0, last), (heads - 1, 0), (heads - 1, last)]);
        v
    };
    let d = s.head_dim as usize;
    let (mut o_error, mut lse_error) = (0.0f64, 0.0f64);
    let worst = |acc: f64, e: f64| if e.is_nan() || acc.is_nan() { f64::NAN } else { acc.max(e) };
    for &(h, i) in &picks {
        let (want, want_lse) = reference::forward_row(&p, &q, &k, &v, h, i);
        let row = h * s.q_len as usize + i;
        for (c, w) in want.iter().enumerate() {
            o_error = worst(o_error, (o[row * d + c] as f64 - w).abs());
        }
        let got_lse = lse[row] as f64;
        let e = if want_lse == f64::NEG_INFINITY {
            if got_lse == f64::NEG_INFINITY { 0.0 } else { f64::NAN }
        } else {
            (got_lse - want_lse).abs()
        };
        lse_error = worst(lse_error, e);
    }
    let tflops = p.forward_flops() / ms / 1e9;
    let backward = match (grads, bwd, backward) {
        (Some((got, bms)), Some(d_o32), Some(kernel)) => {
            let work = p.heads_total() as f64 * s.q_len as f64 * s.kv_len as f64 * s.head_dim as f64;
            let errors = (work <= BACKWARD_CHECK_LIMIT).then(|| {
                // the output gradient as the kernel saw it
                let d_o: Vec<f64> = match entry.dtype {
                    DType::BF16 => d_o32.iter().map(|&x| bf16::from_f32(x).to_f64()).collect(),
                    _ => d_o32.iter().map(|&x| x as f64).collect(),
                };
                let want = reference::backward(&p, &q, &k, &v, &d_o);
                let rel = |g: &[f32], w: &[f64]| {
                    let max = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
                    g.iter().zip(w).fold(0.0f64, |e, (&a, &b)| {
                        let x = (a as f64 - b).abs() / max.max(f64::MIN_POSITIVE);
                        if x.is_nan() || e.is_nan() { f64::NAN } else { e.max(x) }
                    })
                };
                [rel(&got[0], &want.dq), rel(&got[1], &want.dk), rel(&got[2], &want.dv)]
            });
            Some(BackwardRun {
                kernel,
                ms: bms,
                tflops: 2.5 * p.forward_flops() / bms / 1e9,
                errors,
                bound: backward_tolerance(entry.dtype).0,
            })
        }
        _ => None,
    };
    Ok(AttentionRun {
        entry,
        params: p,
        ms,
        tflops,
        rows_checked: picks.len(),
        o_error,
        lse_error,
        bound: forward_bound(entry.kernel, entry.dtype, &p),
        backward,
    })
}

/// The naive rung's names (`kiln attention --kernel NAME`) and dtypes: attention composed of
/// tensor ops on CUDA ([`Tensor::naive_attention`](crate::tensor::Tensor::naive_attention): batched
/// products, the scale, the mask, the softmax; S and P materialized), rung 0 of the ladder.
pub const NAIVE_KERNELS: &[(&str, DType)] = &[("naive", DType::F32), ("naive_bf16", DType::BF16)];

/// The naive rung's error bound on inputs uniform in `[-1, 1)`: f32, the flash CUDA-core rung's
/// ([`forward_bound`]); bf16 rounds the scores (a relative `2^-9` of `|s| <= D scale`, which moves
/// O by twice that), the probabilities and the output (`2^-9` each) as well.
pub fn naive_bound(dtype: DType, p: &AttentionParams) -> f64 {
    let f32_part = forward_bound(FlashKernel::Simt, DType::F32, p).0;
    match dtype {
        DType::BF16 | DType::F16 => {
            f32_part + 2.0 * 2f64.powi(-9) * p.head_dim as f64 * p.scale as f64 + 2.0 * 2f64.powi(-9)
        }
        DType::F32 | DType::F64 => f32_part,
    }
}

/// The outcome of one naive run.
#[derive(Clone, Debug)]
pub struct NaiveRun {
    /// Its name ([`NAIVE_KERNELS`]).
    pub name: &'static str,
    /// The element type of the tensors.
    pub dtype: DType,
    /// The problem.
    pub params: AttentionParams,
    /// Median milliseconds per forward.
    pub ms: f64,
    /// Forward TFLOP/s (the FLOPs of [`AttentionRun::tflops`]).
    pub tflops: f64,
    /// Query rows compared with the f64 reference.
    pub rows_checked: usize,
    /// The largest `|O - O_ref|` over them.
    pub o_error: f64,
    /// Its bound ([`naive_bound`]).
    pub bound: f64,
}

impl NaiveRun {
    /// Whether the error is within its bound.
    pub fn passed(&self) -> bool {
        self.o_error <= self.bound
    }
}

impl std::fmt::Display for NaiveRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = &self.params;
        writeln!(
            f,
            "{} {}x{}x{}x{}, kv_len {}{}: O = softmax(scale Q K^T) V by tensor ops, {:?}, scale {}",
            self.name,
            p.batch,
            p.heads,
            p.q_len,
            p.head_dim,
            p.kv_len,
            if p.causal != 0 { ", causal" } else { "" },
            self.dtype,
            p.scale
        )?;
        writeln!(
            f,
            "  error: max |O - O_ref| = {:.3e} (bound {:.3e}) over {} rows: {}",
            self.o_error,
            self.bound,
            self.rows_checked,
            if self.passed() { "ok" } else { "FAILED" }
        )?;
        write!(f, "  time: {:.4} ms (median), {:.1} TFLOP/s", self.ms, self.tflops)
    }
}

/// The naive rung `name` ([`NAIVE_KERNELS`]) on `s` on the shared CUDA device (scale
/// `1 / sqrt(head_dim)`, any head dim), random inputs from `seed` (the flash rungs' inputs):
/// checked once against the f64 reference, then `reps` timed forwards (median; no graph recorded).
pub fn run_naive(name: &str, s: AttentionShape, causal: bool, reps: usize, seed: u64) -> Result<NaiveRun> {
    use crate::tensor::{Device as TDevice, Tensor, no_grad};
    let &(name, dtype) = NAIVE_KERNELS.iter().find(|(n, _)| *n == name).ok_or_else(|| crate::Error::Unsupported {
        op: "attention",
        what: format!("--kernel {name}: not a naive rung; known: naive, naive_bf16"),
    })?;
    let _g = no_grad();
    let dev = crate::cuda::Device::shared()?;
    let tdev = TDevice::Cuda(dev.clone());
    let (q32, k32, v32) = inputs(s, seed);
    let (b, h, sq, skv, d) =
        (s.batch as usize, s.heads as usize, s.q_len as usize, s.kv_len as usize, s.head_dim as usize);
    let tensor = |v: Vec<f32>, len: usize| -> Result<(Tensor, Vec<f64>)> {
        let t = Tensor::from_vec(v, [b, h, len, d])?.to_dtype(dtype)?;
        let seen = t.try_to_vec_f64()?;
        Ok((t.to_device(&tdev)?, seen))
    };
    let ((q, qw), (k, kw), (v, vw)) = (tensor(q32, sq)?, tensor(k32, skv)?, tensor(v32, skv)?);
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let p = s.params(causal, scale);
    let o = q.naive_attention(&k, &v, causal, Some(scale as f64))?.to_dtype(DType::F32)?.to_vec_f32();
    let ms = timing::median_ms(&dev, reps, 1, || q.naive_attention(&k, &v, causal, Some(scale as f64)).map(|_| ()))?;
    let heads = b * h;
    let picks: Vec<(usize, usize)> = if heads * sq <= FULL_CHECK_ROWS {
        (0..heads * sq).map(|r| (r / sq, r % sq)).collect()
    } else {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x9e37_79b9);
        let mut v: Vec<(usize, usize)> =
            (0..FULL_CHECK_ROWS).map(|_| (rng.random_range(0..heads), rng.random_range(0..sq))).collect();
        v.extend([(0, 0), (0, sq - 1), (heads - 1, 0), (heads - 1, sq - 1)]);
        v
    };
    let mut o_error = 0.0f64;
    for &(hh, i) in &picks {
        let (want, _) = reference::forward_row(&p, &qw, &kw, &vw, hh, i);
        for (c, w) in want.iter().enumerate() {
            let e = (o[(hh * sq + i) * d + c] as f64 - w).abs();
            o_error = if e.is_nan() || o_error.is_nan() { f64::NAN } else { o_error.max(e) };
        }
    }
    Ok(NaiveRun {
        name,
        dtype,
        params: p,
        ms,
        tflops: p.forward_flops() / ms / 1e9,
        rows_checked: picks.len(),
        o_error,
        bound: naive_bound(dtype, &p),
    })
}

/// The backward's gradients (dQ, dK, dV as f32) and its median ms.
type Grads = ([Vec<f32>; 3], f64);

/// O and the log-sum-exp as f32, the inputs as the kernel saw them (f64), the median ms, and the
/// backward's outcome when asked for.
type Launched = (Vec<f32>, Vec<f32>, Vec<f64>, Vec<f64>, Vec<f64>, f64, Option<Grads>);

/// Rounds the inputs to `T`, launches once on poisoned outputs (read back), then times `reps`
/// launches; with `d_o` (and the backward kernel), the same for the backward.
#[allow(clippy::too_many_arguments)]
fn launch<T: FlashElement>(
    dev: &Device,
    kernel: FlashKernel,
    [q32, k32, v32]: [&[f32]; 3],
    d_o: Option<(&[f32], FlashBwdKernel)>,
    s: AttentionShape,
    causal: bool,
    scale: f32,
    (reps, blocks): (usize, Option<u32>),
    to: impl Fn(f32) -> T,
    back: impl Fn(T) -> f32,
) -> Result<Launched> {
    let round = |x: &[f32]| -> Vec<T> { x.iter().map(|&v| to(v)).collect() };
    let (qh, kh, vh) = (round(q32), round(k32), round(v32));
    let (q, k, v) = (dev.upload(&qh)?, dev.upload(&kh)?, dev.upload(&vh)?);
    let mut o = dev.upload(&vec![to(f32::NAN); s.q_elems()])?;
    let mut lse = dev.upload(&vec![crate::testing::POISON_F32; s.lse_elems()])?;
    let fwd = |o: &mut _, lse: &mut _| flash_forward_blocks(dev, kernel, &q, &k, &v, o, lse, s, causal, scale, blocks);
    fwd(&mut o, &mut lse)?;
    let (got, got_lse) = (dev.download(&o)?, dev.download(&lse)?);
    let ms = timing::median_ms(dev, reps, 1, || fwd(&mut o, &mut lse))?;
    let grads = match d_o {
        None => None,
        Some((d_o, bwd)) => {
            let d_o = dev.upload(&round(d_o))?;
            let poison = |n: usize| dev.upload(&vec![to(f32::NAN); n]);
            let (mut dq, mut dk, mut dv) = (poison(s.q_elems())?, poison(s.kv_elems())?, poison(s.kv_elems())?);
            let go = |dq: &mut _, dk: &mut _, dv: &mut _| {
                flash_backward_with(dev, bwd, (&q, &k, &v, &o, &d_o), &lse, (dq, dk, dv), s, causal, scale)
            };
            go(&mut dq, &mut dk, &mut dv)?;
            let wide = |b: &crate::cuda::DeviceBuffer<T>| -> Result<Vec<f32>> {
                Ok(dev.download(b)?.into_iter().map(&back).collect())
            };
            let g = [wide(&dq)?, wide(&dk)?, wide(&dv)?];
            let bms = timing::median_ms(dev, reps, 1, || go(&mut dq, &mut dk, &mut dv))?;
            Some((g, bms))
        }
    };
    let wide = |x: &[T]| -> Vec<f64> { x.iter().map(|&e| back(e) as f64).collect() };
    let (qw, kw, vw) = (wide(&qh), wide(&kh), wide(&vh));
    Ok((got.into_iter().map(back).collect(), got_lse, qw, kw, vw, ms, grads))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_grow_with_the_rounding_each_kernel_does() {
        let p = AttentionShape { batch: 1, heads: 1, q_len: 1000, kv_len: 1000, head_dim: 128 }.params(true, 0.088);
        let (f32_o, f32_l) = forward_bound(FlashKernel::Simt, DType::F32, &p);
        let (simt_bf16, _) = forward_bound(FlashKernel::Simt, DType::BF16, &p);
        let (mma_bf16, mma_l) = forward_bound(FlashKernel::MmaSync, DType::BF16, &p);
        let (mma_f16, _) = forward_bound(FlashKernel::MmaSync, DType::F16, &p);
        assert_eq!(f32_o, f32_l);
        assert!(
            f32_o < 1e-3 && f32_o < mma_f16 && mma_f16 < simt_bf16 && simt_bf16 < mma_bf16,
            "{f32_o} {mma_f16} {simt_bf16} {mma_bf16}"
        );
        assert_eq!(mma_l, f32_l, "the log-sum-exp sums unrounded probabilities");
        assert!(mma_bf16 < 2f64.powi(-8) + 1e-3);
    }

    #[test]
    fn every_kernel_gets_the_same_inputs() {
        let s = AttentionShape { batch: 1, heads: 2, q_len: 3, kv_len: 5, head_dim: 64 };
        let (a, b) = (inputs(s, 7), inputs(s, 7));
        assert_eq!(a, b);
        assert_eq!((a.0.len(), a.1.len(), a.2.len()), (384, 640, 640));
        assert!(a.0.iter().chain(&a.1).chain(&a.2).all(|x| (-1.0..1.0).contains(x)));
    }
}
