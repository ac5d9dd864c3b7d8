//! The attention op's cases (`Tensor::scaled_dot_product_attention` and `Tensor::naive_attention`),
//! each taking the device and dtype to run on and comparing the output and the three gradients
//! (through `backward()` of a loss) with the f64 reference of `kiln::attention`, on fresh random
//! inputs rounded to the dtype (the reference sees the rounded values). `attention_op.rs` runs them
//! on the CPU; `gpu/attention_op.rs` runs the same functions on CUDA.
#![allow(dead_code)]

use kiln::attention::{self as reference, AttentionParams};
use kiln::tensor::{DType, Device, Tensor};
use kiln::testing::{Tol, compare, relative_l2};

/// One problem: batch, query heads, key/value heads, query length, key length, head dim, causal,
/// and whether q arrives as a view (stored `[B, Sq, H, D]`, heads split by `permute`).
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub b: usize,
    pub h: usize,
    pub hkv: usize,
    pub sq: usize,
    pub skv: usize,
    pub d: usize,
    pub causal: bool,
    pub q_view: bool,
}

/// Which path: the public op (flash where the backend takes the case) or the naive composition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    Op,
    Naive,
}

/// Tolerances: the output elementwise (`|got - want| <= abs + rel |want|`), each gradient by its
/// relative L2 error (the gradients are sums over a whole row or column of keys, whose size
/// varies too much for one elementwise bound across lengths 1 to 1000).
#[derive(Clone, Copy, Debug)]
pub struct Tols {
    pub out: Tol,
    pub grad_l2: f64,
}

/// f64: the same formulas in another order.
pub const F64: Tols = Tols { out: Tol { abs: 1e-12, rel: 1e-10 }, grad_l2: 1e-10 };
/// f32: scores, softmax and products in f32.
pub const F32: Tols = Tols { out: Tol { abs: 2e-5, rel: 1e-4 }, grad_l2: 1e-4 };
/// bf16: the output (a convex combination of values in [-1, 1]) stored in bf16 (2^-8 relative) on
/// the flash path; on the naive path scores and probabilities are rounded to bf16 as well.
pub const BF16: Tols = Tols { out: Tol { abs: 2e-2, rel: 2e-2 }, grad_l2: 3e-2 };
/// f16: 2^-11 relative rounding (finer than bf16), the same bound as bf16 kept for margin.
pub const F16: Tols = Tols { out: Tol { abs: 1e-2, rel: 1e-2 }, grad_l2: 2e-2 };

pub fn tols(dtype: DType) -> Tols {
    match dtype {
        DType::F64 => F64,
        DType::F32 => F32,
        DType::BF16 => BF16,
        DType::F16 => F16,
    }
}

fn uniform(n: usize, seed: u64) -> Vec<f64> {
    Tensor::rand(-1.0, 1.0, [n], DType::F64, &mut Tensor::rng(seed)).to_vec_f64()
}

/// `v` rounded to `dtype` and back.
fn rounded(v: &[f64], dtype: DType) -> Vec<f64> {
    Tensor::from_f64(v, [v.len()], dtype).unwrap().to_vec_f64()
}

/// `x` `[B, Hkv, S, D]` with each head repeated `group` times: `[B, Hkv * group, S, D]`.
fn repeat_heads(x: &[f64], (b, hkv, s, d): (usize, usize, usize, usize), group: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len() * group);
    for bi in 0..b {
        for hi in 0..hkv {
            let head = &x[(bi * hkv + hi) * s * d..(bi * hkv + hi + 1) * s * d];
            for _ in 0..group {
                out.extend_from_slice(head);
            }
        }
    }
    out
}

/// The gradient of repeated heads summed back over each group.
fn sum_groups(x: &[f64], (b, hkv, s, d): (usize, usize, usize, usize), group: usize) -> Vec<f64> {
    let mut out = vec![0.0; b * hkv * s * d];
    for bi in 0..b {
        for hi in 0..hkv {
            for gi in 0..group {
                let src = ((bi * hkv + hi) * group + gi) * s * d;
                let dst = (bi * hkv + hi) * s * d;
                for e in 0..s * d {
                    out[dst + e] += x[src + e];
                }
            }
        }
    }
    out
}

/// `[B, H, S, D]` values stored as `[B, S, H, D]`.
fn to_bshd(x: &[f64], (b, h, s, d): (usize, usize, usize, usize)) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for bi in 0..b {
        for hi in 0..h {
            for si in 0..s {
                let src = ((bi * h + hi) * s + si) * d;
                let dst = ((bi * s + si) * h + hi) * d;
                out[dst..dst + d].copy_from_slice(&x[src..src + d]);
            }
        }
    }
    out
}

/// The op's output and gradients (each `[B, heads, S, D]`, in f64) for `c` on `dev` in `dtype`.
pub struct Run {
    pub out: Vec<f64>,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
}

/// The inputs of `c` (seeded by `seed`, rounded to `dtype`): q, k, v and the output's gradient.
pub fn inputs(c: &Case, dtype: DType, seed: u64) -> [Vec<f64>; 4] {
    let (nq, nkv) = (c.b * c.h * c.sq * c.d, c.b * c.hkv * c.skv * c.d);
    [
        rounded(&uniform(nq, seed), dtype),
        rounded(&uniform(nkv, seed + 1), dtype),
        rounded(&uniform(nkv, seed + 2), dtype),
        rounded(&uniform(nq, seed + 3), dtype),
    ]
}

/// Runs the op (forward, then `backward()` of `sum(out * d_o)`) on `dev` in `dtype`.
pub fn run(c: &Case, dtype: DType, dev: &Device, path: Path, ins: &[Vec<f64>; 4]) -> Result<Run, String> {
    let e = |x: kiln::Error| format!("{c:?} {dtype:?}: {x}");
    let leaf = |v: &[f64], shape: [usize; 4]| -> Result<Tensor, String> {
        Ok(Tensor::from_f64(v, shape, dtype).and_then(|t| t.to_device(dev)).map_err(e)?.requires_grad())
    };
    let q_leaf = if c.q_view {
        leaf(&to_bshd(&ins[0], (c.b, c.h, c.sq, c.d)), [c.b, c.sq, c.h, c.d])?
    } else {
        leaf(&ins[0], [c.b, c.h, c.sq, c.d])?
    };
    let q = if c.q_view { q_leaf.permute(&[0, 2, 1, 3]).map_err(e)? } else { q_leaf.clone() };
    let k = leaf(&ins[1], [c.b, c.hkv, c.skv, c.d])?;
    let v = leaf(&ins[2], [c.b, c.hkv, c.skv, c.d])?;
    let d_o = Tensor::from_f64(&ins[3], [c.b, c.h, c.sq, c.d], dtype).and_then(|t| t.to_device(dev)).map_err(e)?;
    // the reference's scale is an f32 (the kernels' parameter): 1 / sqrt(d) rounded to f32
    let scale = Some(scale_of(c) as f64);
    let out = match path {
        Path::Op => q.scaled_dot_product_attention(&k, &v, c.causal, scale),
        Path::Naive => q.naive_attention(&k, &v, c.causal, scale),
    }
    .map_err(e)?;
    out.mul(&d_o).and_then(|l| l.sum_all()).and_then(|l| l.backward()).map_err(e)?;
    let grad = |t: &Tensor, what: &str| -> Result<Vec<f64>, String> {
        t.grad().ok_or_else(|| format!("{c:?} {dtype:?}: no gradient for {what}"))?.try_to_vec_f64().map_err(e)
    };
    let mut dq = grad(&q_leaf, "q")?;
    if c.q_view {
        // back from [B, Sq, H, D]
        let g = Tensor::from_f64(&dq, [c.b, c.sq, c.h, c.d], DType::F64).map_err(e)?;
        dq = g.permute(&[0, 2, 1, 3]).and_then(|g| g.contiguous()).map_err(e)?.to_vec_f64();
    }
    Ok(Run { out: out.try_to_vec_f64().map_err(e)?, dq, dk: grad(&k, "k")?, dv: grad(&v, "v")? })
}

/// The default scale, `1 / sqrt(head_dim)`, as the f32 the reference and the kernels take.
fn scale_of(c: &Case) -> f32 {
    (1.0 / (c.d as f64).sqrt()) as f32
}

/// The f64 reference's output and gradients for `c` on `ins`.
pub fn reference(c: &Case, ins: &[Vec<f64>; 4]) -> Run {
    let group = c.h / c.hkv;
    let kv = (c.b, c.hkv, c.skv, c.d);
    let (k, v) = (repeat_heads(&ins[1], kv, group), repeat_heads(&ins[2], kv, group));
    let p = AttentionParams {
        batch: c.b as u32,
        heads: c.h as u32,
        q_len: c.sq as u32,
        kv_len: c.skv as u32,
        head_dim: c.d as u32,
        scale: scale_of(c),
        causal: c.causal as u32,
    };
    let f = reference::forward(&p, &ins[0], &k, &v);
    let g = reference::backward(&p, &ins[0], &k, &v, &ins[3]);
    Run { out: f.o, dq: g.dq, dk: sum_groups(&g.dk, kv, group), dv: sum_groups(&g.dv, kv, group) }
}

/// Compares a run with the reference under `tols`.
pub fn check(what: &str, got: &Run, want: &Run, tols: Tols) -> Result<(), String> {
    let f32s = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    if tols.out.abs < 1e-9 {
        // f64: compare in f64 directly (compare takes f32)
        for (i, (g, w)) in got.out.iter().zip(&want.out).enumerate() {
            if (g - w).abs() > tols.out.abs + tols.out.rel * w.abs() || g.is_nan() {
                return Err(format!("{what}: out[{i}] = {g:e}, expected {w:e}"));
            }
        }
    } else {
        compare(&format!("{what}: out"), &f32s(&got.out), &want.out, tols.out)?;
    }
    for (name, g, w) in [("dq", &got.dq, &want.dq), ("dk", &got.dk, &want.dk), ("dv", &got.dv, &want.dv)] {
        if g.len() != w.len() {
            return Err(format!("{what}: {name} has {} elements, expected {}", g.len(), w.len()));
        }
        if w.iter().all(|x| *x == 0.0) {
            // Zero in exact arithmetic: every row masked (the kernels write exact zeros), or one
            // key (dQ = 0 since dS = dP - dO.O = 0), which rounding leaves as noise at the
            // inputs' scale (|x| <= 1): bounded by the output's absolute tolerance.
            let floor = if tols.out.abs < 1e-9 { tols.out.abs } else { 1e-4 };
            if let Some(i) = g.iter().position(|x| x.abs() > floor || x.is_nan()) {
                return Err(format!("{what}: {name}[{i}] = {:e}, expected 0 (within {floor:e})", g[i]));
            }
            continue;
        }
        let err = if tols.out.abs < 1e-9 {
            let num: f64 = g.iter().zip(w.iter()).map(|(a, b)| (a - b).powi(2)).sum();
            let den: f64 = w.iter().map(|b| b * b).sum();
            (num / den).sqrt()
        } else {
            relative_l2(&f32s(g), w)
        };
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        if !(err <= tols.grad_l2) {
            return Err(format!("{what}: {name} relative L2 error {err:e} > {:e}", tols.grad_l2));
        }
    }
    Ok(())
}

/// Runs every case of `cases` on `dev` in `dtype` by `path` against the reference.
pub fn cases_match_reference(dev: &Device, dtype: DType, path: Path, cases: &[Case]) -> Result<(), String> {
    for (i, c) in cases.iter().enumerate() {
        let ins = inputs(c, dtype, 1000 + 10 * i as u64);
        let got = run(c, dtype, dev, path, &ins)?;
        check(&format!("{path:?} {dtype:?} {c:?}"), &got, &reference(c, &ins), tols(dtype))?;
    }
    Ok(())
}

const fn case(h: usize, hkv: usize, sq: usize, skv: usize, d: usize, causal: bool) -> Case {
    Case { b: 1, h, hkv, sq, skv, d, causal, q_view: false }
}

/// Lengths 1, 17, 129 (equal and crossed both ways, so causal rows that see nothing occur), head
/// dims 64 and small odd ones, causal and not, grouped heads, a batch of 2, q as a permuted view.
pub fn cpu_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for causal in [false, true] {
        for &(sq, skv) in &[(1, 1), (17, 17), (129, 129), (1, 17), (17, 1), (17, 129), (129, 17)] {
            v.push(case(2, 2, sq, skv, 64, causal));
        }
        for d in [1, 3, 5] {
            v.push(case(2, 1, 17, 9, d, causal));
        }
        v.push(Case { b: 2, h: 4, hkv: 2, sq: 17, skv: 33, d: 8, causal, q_view: true });
        v.push(Case { b: 2, h: 6, hkv: 1, sq: 33, skv: 17, d: 64, causal, q_view: false });
    }
    v
}

/// The GPU cases: lengths 1, 17, 129 and 1000, head dims 64 and 128 (the flash kernels'), causal
/// and not, crossed lengths both ways, grouped heads, q as a permuted view.
pub fn gpu_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for causal in [false, true] {
        for d in [64, 128] {
            for &(sq, skv) in &[(1, 1), (17, 17), (129, 129), (1000, 1000), (17, 129), (129, 17), (1000, 129)] {
                // one head at 1000 x 1000 (the f64 reference's time in a debug build)
                let h = if sq * skv > 200_000 { 1 } else { 2 };
                v.push(case(h, 1, sq, skv, d, causal));
            }
        }
        v.push(Case { b: 2, h: 4, hkv: 2, sq: 129, skv: 129, d: 64, causal, q_view: true });
        v.push(Case { b: 1, h: 8, hkv: 1, sq: 17, skv: 1000, d: 128, causal, q_view: false });
    }
    v
}

/// Small odd head dims the flash kernels do not take: the op runs its naive path on any backend.
pub fn odd_head_dim_cases() -> Vec<Case> {
    vec![case(2, 1, 17, 33, 5, true), case(4, 2, 33, 17, 96, false), case(2, 2, 129, 129, 40, true)]
}

/// The op's typed refusals: each message names what to change.
pub fn refusals(dev: &Device) -> Result<(), String> {
    let t = |shape: &[usize], dtype: DType| Tensor::zeros(shape.to_vec(), dtype).to_device(dev).unwrap();
    let dt = if matches!(dev, Device::Cpu) { DType::F64 } else { DType::F32 };
    let q = t(&[1, 4, 5, 8], dt);
    let expect = |r: kiln::Result<Tensor>, what: &str| -> Result<(), String> {
        match r {
            Ok(_) => Err(format!("expected a refusal naming {what:?}")),
            Err(e) if e.to_string().contains(what) => Ok(()),
            Err(e) => Err(format!("refusal {e} does not name {what:?}")),
        }
    };
    let kv = t(&[1, 2, 7, 8], dt);
    expect(t(&[4, 5, 8], dt).scaled_dot_product_attention(&kv, &kv, false, None), "[batch, heads, seq, head_dim]")?;
    expect(q.scaled_dot_product_attention(&t(&[2, 2, 7, 8], dt), &t(&[2, 2, 7, 8], dt), false, None), "one batch")?;
    expect(q.scaled_dot_product_attention(&t(&[1, 2, 7, 4], dt), &t(&[1, 2, 7, 4], dt), false, None), "one head dim")?;
    expect(q.scaled_dot_product_attention(&t(&[1, 3, 7, 8], dt), &t(&[1, 3, 7, 8], dt), false, None), "multiple")?;
    expect(q.scaled_dot_product_attention(&kv, &t(&[1, 2, 6, 8], dt), false, None), "one shape")?;
    let other = if dt == DType::F64 { DType::F32 } else { DType::BF16 };
    expect(q.scaled_dot_product_attention(&t(&[1, 2, 7, 8], other), &kv, false, None), &format!("{other:?}"))?;
    expect(q.naive_attention(&kv, &kv, false, Some(f64::NAN)), "finite scale")?;
    Ok(())
}
