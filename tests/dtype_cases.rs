//! bf16 and f16 test cases, each written once and run for every backend and 16-bit dtype:
//! `ops.rs` runs them on the CPU backend, `gpu/dtypes.rs` on CUDA. Each case draws fresh random
//! inputs (`kiln::testing::rng`, seed in every message; `KILN_SEED` replays it), rounds them to the
//! dtype, and compares the op's output (in the dtype) with an f64 reference computed from the same
//! rounded inputs.
//!
//! Tolerances, with `u` the dtype's unit roundoff (bf16 2^-8, f16 2^-11): one rounding of the
//! output costs `u |want|`; f32 arithmetic inside adds a few f32 ulps (2^-20 relative, or an
//! absolute term scaled by the inputs' magnitude where terms cancel); sums add `terms * 2^-22 *
//! sum |terms|` (f32 accumulation, the tensor cores' included). Ops composed of several rounded
//! steps on the CPU (the cross-entropy gradient) get one `u` per step.
#![allow(dead_code)]

use kiln::tensor::{DType, Device, Shape, Tensor};
use kiln::testing::{Tol, compare};

/// A case's result: `Err` with the failing comparison.
pub type Outcome = Result<(), String>;

/// The unit roundoff of `dt` (half an ulp of 1).
pub fn unit(dt: DType) -> f64 {
    match dt {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        DType::F32 => 2f64.powi(-24),
        DType::F64 => 2f64.powi(-53),
    }
}

/// Relative slack of f32 arithmetic inside a kernel.
const F32_SLACK: f64 = 1.0 / (1 << 20) as f64;

/// One case's device, dtype and random inputs.
pub struct Case {
    dev: Device,
    dt: DType,
    rng: rand::rngs::StdRng,
    seed: u64,
}

impl Case {
    /// A case on `dev` in `dt`, with a fresh seed.
    pub fn new(dev: &Device, dt: DType) -> Case {
        let (rng, seed) = kiln::testing::rng();
        Case { dev: dev.clone(), dt, rng, seed }
    }
    /// The tolerance of one rounded output computed in f32.
    fn one_rounding(&self) -> Tol {
        Tol { abs: 1e-6, rel: unit(self.dt) + F32_SLACK }
    }
    /// Fresh values uniform in [-scale, scale), rounded to the dtype: the tensor on the case's
    /// device and the rounded values.
    pub fn input(&mut self, shape: &[usize], scale: f64) -> (Tensor, Vec<f64>) {
        let n = shape.iter().product();
        let v: Vec<f64> = kiln::testing::uniform(&mut self.rng, n).iter().map(|&x| x as f64 * scale).collect();
        let cpu = Tensor::from_f64(&v, shape.to_vec(), self.dt).unwrap();
        let rounded = cpu.to_vec_f64();
        (cpu.to_device(&self.dev).unwrap(), rounded)
    }
    /// `got` (which must have the case's dtype and device) against `want`.
    pub fn check(&self, what: &str, got: &Tensor, want: &[f64], tol: Tol) -> Outcome {
        let what = format!("{what} ({:?} on {}, seed {})", self.dt, self.dev.name(), self.seed);
        if got.dtype() != self.dt || got.device() != self.dev {
            return Err(format!("{what}: got a {:?} tensor on {}", got.dtype(), got.device().name()));
        }
        let g = got.try_to_vec_f64().map_err(|e| format!("{what}: {e}"))?;
        let g: Vec<f32> = g.iter().map(|&x| x as f32).collect(); // exact for 16-bit values
        compare(&what, &g, want, tol)
    }
    /// `got` against `want` element by element, each allowed one rounding plus `terms * 2^-22 *
    /// bound[i]` (a sum of `terms` products whose magnitudes add to `bound[i]`).
    pub fn check_sums(&self, what: &str, got: &Tensor, want: &[f64], bound: &[f64], terms: usize) -> Outcome {
        let g = got.try_to_vec_f64().map_err(|e| format!("{what}: {e}"))?;
        if g.len() != want.len() {
            return Err(format!("{what}: {} elements, expected {}", g.len(), want.len()));
        }
        for (i, ((&g, &w), &b)) in g.iter().zip(want).zip(bound).enumerate() {
            let tol = Tol { abs: terms as f64 * 2f64.powi(-22) * b + 1e-30, rel: unit(self.dt) + F32_SLACK };
            self.check_value(&format!("{what}[{i}]"), g, w, tol)?;
        }
        if got.dtype() != self.dt {
            return Err(format!("{what}: dtype {:?}, expected {:?}", got.dtype(), self.dt));
        }
        Ok(())
    }
    fn check_value(&self, what: &str, got: f64, want: f64, tol: Tol) -> Outcome {
        compare(
            &format!("{what} ({:?} on {}, seed {})", self.dt, self.dev.name(), self.seed),
            &[got as f32],
            &[want],
            tol,
        )
    }
}

/// Shapes with odd sizes: a single element, a few, just past powers of two.
const ODD: [usize; 4] = [1, 3, 257, 1025];

/// Conversions among f32, bf16 and f16 on the backend (round to nearest-even, like `half`), and
/// uploads and downloads in the dtype (bit-exact round trips).
pub fn conversions(dev: &Device, dt: DType) -> Outcome {
    let mut c = Case::new(dev, dt);
    for n in ODD {
        let v: Vec<f64> = kiln::testing::uniform(&mut c.rng, n).iter().map(|&x| x as f64 * 1e3).collect();
        let x32 = Tensor::from_f64(&v, [n], DType::F32).unwrap().to_device(dev).unwrap();
        let v32: Vec<f64> = x32.to_vec_f64();
        let round = |d: DType, x: f64| Tensor::from_f64(&[x], [1], d).unwrap().to_vec_f64()[0];
        let y = x32.to_dtype(dt).map_err(|e| e.to_string())?;
        let want: Vec<f64> = v32.iter().map(|&x| round(dt, x)).collect();
        c.check(&format!("f32 -> {dt:?} [{n}]"), &y, &want, Tol::EXACT)?;
        let back = y.to_dtype(DType::F32).map_err(|e| e.to_string())?;
        if back.to_vec_f64() != want {
            return Err(format!("{dt:?} -> f32 [{n}] is not exact (seed {})", c.seed));
        }
        let other = if dt == DType::BF16 { DType::F16 } else { DType::BF16 };
        let z = y.to_dtype(other).map_err(|e| e.to_string())?;
        let want_other: Vec<f64> = want.iter().map(|&x| round(other, x)).collect();
        if z.dtype() != other || z.to_vec_f64() != want_other {
            return Err(format!("{dt:?} -> {other:?} [{n}] differs from rounding via f32 (seed {})", c.seed));
        }
        // the dtype's data to the host and back, unchanged
        let host = y.to_device(&Device::Cpu).unwrap();
        if host.dtype() != dt || host.to_vec_f64() != want {
            return Err(format!("download of {dt:?} [{n}] changed the data (seed {})", c.seed));
        }
        let again = host.to_device(dev).unwrap();
        c.check(&format!("upload of {dt:?} [{n}]"), &again, &want, Tol::EXACT)?;
        let full = y.full_like(0.1).map_err(|e| e.to_string())?;
        c.check(&format!("full_like [{n}]"), &full, &vec![round(dt, 0.1); n], Tol::EXACT)?;
    }
    Ok(())
}

/// Every unary function and the binary ops, flat and broadcast.
pub fn elementwise(dev: &Device, dt: DType) -> Outcome {
    let mut c = Case::new(dev, dt);
    for n in ODD {
        let (x, v) = c.input(&[n], 3.0);
        let tol = c.one_rounding();
        type F = fn(&Tensor) -> kiln::Result<Tensor>;
        type Unary = (&'static str, F, fn(f64) -> f64);
        let gelu = |x: f64| 0.5 * x * (1.0 + (0.797_884_560_802_865_4 * (x + 0.044_715 * x * x * x)).tanh());
        let cases: Vec<Unary> = vec![
            ("neg", |x| x.neg(), |x| -x),
            ("exp", |x| x.exp(), f64::exp),
            ("relu", |x| x.relu(), |x| x.max(0.0)),
            ("tanh", |x| x.tanh(), f64::tanh),
            ("sigmoid", |x| x.sigmoid(), |x| 1.0 / (1.0 + (-x).exp())),
            ("add_scalar", |x| x.add_scalar(0.75), |x| x + 0.75),
            ("mul_scalar", |x| x.mul_scalar(-1.5), |x| x * -1.5),
        ];
        for (name, f, r) in cases {
            let got = f(&x).map_err(|e| format!("{name}: {e}"))?;
            c.check(&format!("{name} [{n}]"), &got, &v.iter().map(|&x| r(x)).collect::<Vec<_>>(), tol)?;
        }
        let got = x.gelu().map_err(|e| e.to_string())?;
        c.check(&format!("gelu [{n}]"), &got, &v.iter().map(|&x| gelu(x)).collect::<Vec<_>>(), tol)?;
        // positive inputs for log and sqrt
        let (p, _) = c.input(&[n], 1.0);
        let p = p.mul(&p).unwrap().add_scalar(0.25).unwrap();
        let pv: Vec<f64> = p.to_vec_f64();
        c.check(&format!("log [{n}]"), &p.log().unwrap(), &pv.iter().map(|x| x.ln()).collect::<Vec<_>>(), tol)?;
        c.check(&format!("sqrt [{n}]"), &p.sqrt().unwrap(), &pv.iter().map(|x| x.sqrt()).collect::<Vec<_>>(), tol)?;
        // binary, same shape
        let (y, w) = c.input(&[n], 3.0);
        let pairs = |f: fn(f64, f64) -> f64| v.iter().zip(&w).map(|(&a, &b)| f(a, b)).collect::<Vec<_>>();
        c.check(&format!("add [{n}]"), &x.add(&y).unwrap(), &pairs(|a, b| a + b), tol)?;
        c.check(&format!("sub [{n}]"), &x.sub(&y).unwrap(), &pairs(|a, b| a - b), tol)?;
        c.check(&format!("mul [{n}]"), &x.mul(&y).unwrap(), &pairs(|a, b| a * b), tol)?;
        c.check(
            &format!("relu_grad [{n}]"),
            &x.relu_grad(&y).unwrap(),
            &pairs(|a, b| if b > 0.0 { a } else { 0.0 }),
            tol,
        )?;
        c.check(
            &format!("div [{n}]"),
            &x.div(&p).unwrap(),
            &v.iter().zip(&pv).map(|(a, b)| a / b).collect::<Vec<_>>(),
            tol,
        )?;
    }
    // broadcasts: rows + a row, a column times a row, a scalar-like [1]
    for (a, b) in
        [(vec![3, 257], vec![257]), (vec![5, 1, 7], vec![1, 4, 1]), (vec![1025], vec![1]), (vec![2, 3], vec![3, 2, 1])]
    {
        let (x, v) = c.input(&a, 2.0);
        let (y, w) = c.input(&b, 2.0);
        let out = Shape::broadcast("test", &Shape::from(a.clone()), &Shape::from(b.clone())).unwrap();
        let (sa, sb) = (Shape::from(a.clone()).broadcast_strides(&out), Shape::from(b.clone()).broadcast_strides(&out));
        let want_of = |f: fn(f64, f64) -> f64| {
            let mut want = Vec::with_capacity(out.elem_count());
            for i in 0..out.elem_count() {
                let (mut oa, mut ob, mut r) = (0, 0, i);
                for d in (0..out.rank()).rev() {
                    let k = r % out.dims()[d];
                    r /= out.dims()[d];
                    oa += k * sa[d];
                    ob += k * sb[d];
                }
                want.push(f(v[oa], w[ob]));
            }
            want
        };
        let tol = c.one_rounding();
        c.check(&format!("broadcast add {a:?} {b:?}"), &x.add(&y).unwrap(), &want_of(|a, b| a + b), tol)?;
        c.check(&format!("broadcast mul {a:?} {b:?}"), &x.mul(&y).unwrap(), &want_of(|a, b| a * b), tol)?;
        c.check(&format!("broadcast sub {a:?} {b:?}"), &y.sub(&x).unwrap(), &want_of(|a, b| b - a), tol)?;
    }
    Ok(())
}

/// Transposes and expands (strided copies): exact.
pub fn copies(dev: &Device, dt: DType) -> Outcome {
    let mut c = Case::new(dev, dt);
    let (x, v) = c.input(&[3, 5, 7], 4.0);
    let y = x.transpose(0, 2).unwrap();
    let mut want = vec![0.0; v.len()];
    for i in 0..3 {
        for j in 0..5 {
            for k in 0..7 {
                want[k * 15 + j * 3 + i] = v[i * 35 + j * 7 + k];
            }
        }
    }
    c.check("transpose(0, 2) [3, 5, 7]", &y, &want, Tol::EXACT)?;
    let (r, rv) = c.input(&[1, 257], 4.0);
    let e = r.expand(&Shape::from(vec![3, 257])).unwrap();
    c.check("expand [1, 257] -> [3, 257]", &e, &rv.repeat(3), Tol::EXACT)?;
    Ok(())
}

/// Sums over dimensions, of everything, and means.
pub fn sums(dev: &Device, dt: DType) -> Outcome {
    let mut c = Case::new(dev, dt);
    let (x, v) = c.input(&[3, 257], 2.0);
    let want: Vec<f64> = (0..3).map(|r| v[r * 257..(r + 1) * 257].iter().sum()).collect();
    let bound: Vec<f64> = (0..3).map(|r| v[r * 257..(r + 1) * 257].iter().map(|x| x.abs()).sum()).collect();
    c.check_sums("sum_dim(1) [3, 257]", &x.sum_dim(1, false).unwrap(), &want, &bound, 257)?;
    let want: Vec<f64> = (0..257).map(|j| (0..3).map(|r| v[r * 257 + j]).sum()).collect();
    let bound: Vec<f64> = (0..257).map(|j| (0..3).map(|r| v[r * 257 + j].abs()).sum()).collect();
    c.check_sums("sum_dim(0) [3, 257]", &x.sum_dim(0, false).unwrap(), &want, &bound, 3)?;
    for n in ODD {
        let (x, v) = c.input(&[n], 2.0);
        let (s, b) = (v.iter().sum::<f64>(), v.iter().map(|x| x.abs()).sum::<f64>());
        c.check_sums(&format!("sum_all [{n}]"), &x.sum_all().unwrap(), &[s], &[b], n)?;
        // the sum rounded, then scaled by 1 / n and rounded again
        let tol = Tol { abs: 2f64.powi(-22) * b + 1e-30, rel: 2.0 * unit(dt) + F32_SLACK };
        c.check(&format!("mean_all [{n}]"), &x.mean_all().unwrap(), &[s / n as f64], tol)?;
    }
    Ok(())
}

/// The maximum along a dimension (values exact), its gradient scattered to the argmax, and
/// `argmax_last` (the first maximum; ties are common in 16 bits).
pub fn max_and_argmax(dev: &Device, dt: DType) -> Outcome {
    let mut c = Case::new(dev, dt);
    let (x, v) = c.input(&[4, 257], 3.0);
    let x = x.detach().requires_grad();
    let first_max = |row: &[f64]| row.iter().enumerate().fold(0, |b, (i, &y)| if y > row[b] { i } else { b });
    let args: Vec<usize> = (0..4).map(|r| first_max(&v[r * 257..(r + 1) * 257])).collect();
    let m = x.max_dim(1, false).unwrap();
    let want: Vec<f64> = (0..4).map(|r| v[r * 257 + args[r]]).collect();
    c.check("max_dim(1) [4, 257]", &m, &want, Tol::EXACT)?;
    let got = x.argmax_last().unwrap();
    if got != args {
        return Err(format!("argmax_last ({dt:?} on {}, seed {}): {got:?}, expected {args:?}", dev.name(), c.seed));
    }
    m.sum_all().unwrap().backward().unwrap();
    let mut gw = vec![0.0; 4 * 257];
    for (r, &a) in args.iter().enumerate() {
        gw[r * 257 + a] = 1.0;
    }
    c.check("max_dim backward", &x.grad().unwrap(), &gw, Tol::EXACT)
}

/// Softmax and log-softmax of rows of odd lengths.
pub fn softmax_rows(dev: &Device, dt: DType) -> Outcome {
    let mut c = Case::new(dev, dt);
    for (rows, d) in [(5, 1), (3, 257), (2, 1025), (4, 3)] {
        let (x, v) = c.input(&[rows, d], 4.0);
        let (mut sm, mut lsm) = (vec![], vec![]);
        for r in 0..rows {
            let row = &v[r * d..(r + 1) * d];
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = row.iter().map(|y| (y - m).exp()).sum();
            sm.extend(row.iter().map(|y| (y - m).exp() / s));
            lsm.extend(row.iter().map(|y| y - m - s.ln()));
        }
        let tol = Tol { abs: 1e-6, rel: unit(dt) + 4.0 * F32_SLACK };
        c.check(&format!("softmax [{rows}, {d}]"), &x.softmax().unwrap(), &sm, tol)?;
        let tol = Tol { abs: 1e-5, rel: unit(dt) + 4.0 * F32_SLACK };
        c.check(&format!("log_softmax [{rows}, {d}]"), &x.log_softmax().unwrap(), &lsm, tol)?;
    }
    Ok(())
}

/// The mean cross-entropy (accumulated in f32, rounded once) and its gradient.
pub fn cross_entropy(dev: &Device, dt: DType) -> Outcome {
    let mut c = Case::new(dev, dt);
    for (n, k) in [(1, 3), (7, 257), (33, 10), (3, 1025)] {
        let (x, v) = c.input(&[n, k], 3.0);
        let x = x.detach().requires_grad();
        let targets: Vec<usize> = (0..n).map(|i| (i * 7 + 3) % k).collect();
        let loss = x.cross_entropy(&targets).unwrap();
        let (mut want, mut grad) = (0.0, vec![]);
        for (r, &t) in targets.iter().enumerate() {
            let row = &v[r * k..(r + 1) * k];
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = row.iter().map(|y| (y - m).exp()).sum();
            want += (m + s.ln() - row[t]) / n as f64;
            grad.extend(row.iter().enumerate().map(|(j, y)| ((y - m).exp() / s - (j == t) as u8 as f64) / n as f64));
        }
        // one rounding on CUDA; two on the CPU (its log-softmax is rounded before the mean)
        let tol = Tol { abs: 1e-5, rel: 2.0 * unit(dt) + 4.0 * F32_SLACK };
        c.check(&format!("cross_entropy [{n}, {k}]"), &loss, &[want], tol)?;
        loss.backward().unwrap();
        // fused on CUDA (one rounding); composed of rounded steps on the CPU (softmax, minus one-hot, scale)
        let tol = Tol { abs: 3.0 * unit(dt) / n as f64, rel: unit(dt) };
        c.check(&format!("cross_entropy backward [{n}, {k}]"), &x.grad().unwrap(), &grad, tol)?;
    }
    Ok(())
}

/// Layer norm of rows of odd lengths, with weight and bias in the dtype.
pub fn layer_norm(dev: &Device, dt: DType) -> Outcome {
    let mut c = Case::new(dev, dt);
    for (rows, d) in [(1, 3), (4, 257), (2, 1025), (3, 1)] {
        let (x, v) = c.input(&[rows, d], 3.0);
        let (w, wv) = c.input(&[d], 1.5);
        let (b, bv) = c.input(&[d], 0.5);
        let mut want = vec![];
        let mut bound = vec![];
        for r in 0..rows {
            let row = &v[r * d..(r + 1) * d];
            let mean = row.iter().sum::<f64>() / d as f64;
            let var = row.iter().map(|y| (y - mean).powi(2)).sum::<f64>() / d as f64;
            let rstd = 1.0 / (var + 1e-5).sqrt();
            for j in 0..d {
                want.push((row[j] - mean) * rstd * wv[j] + bv[j]);
                bound.push(((row[j] - mean) * rstd * wv[j]).abs() + bv[j].abs());
            }
        }
        let got = x.layer_norm(&w, &b, 1e-5).unwrap();
        let gv = got.try_to_vec_f64().map_err(|e| e.to_string())?;
        for i in 0..want.len() {
            // f32 statistics and one rounding of the output
            let tol = Tol { abs: 64.0 * F32_SLACK * bound[i] + 1e-30, rel: unit(dt) + F32_SLACK };
            c.check_value(&format!("layer_norm [{rows}, {d}] [{i}]"), gv[i], want[i], tol)?;
        }
        if got.dtype() != dt {
            return Err(format!("layer_norm: dtype {:?}", got.dtype()));
        }
    }
    Ok(())
}

/// Embedding rows (exact) and their gradient (summed per id in f32, rounded once).
pub fn embedding(dev: &Device, dt: DType) -> Outcome {
    let mut c = Case::new(dev, dt);
    let (v, d) = (11, 257);
    let (table, tv) = c.input(&[v, d], 2.0);
    let table = table.detach().requires_grad();
    let ids: Vec<usize> = (0..37).map(|i| (i * i + 3) % v).collect();
    let e = table.embedding(&ids, [37]).unwrap();
    let want: Vec<f64> = ids.iter().flat_map(|&id| tv[id * d..(id + 1) * d].to_vec()).collect();
    c.check("embedding [37] of [11, 257]", &e, &want, Tol::EXACT)?;
    let (g, gv) = c.input(&[37, d], 1.0);
    e.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
    let (mut gw, mut bound) = (vec![0.0; v * d], vec![0.0; v * d]);
    for (p, &id) in ids.iter().enumerate() {
        for j in 0..d {
            gw[id * d + j] += gv[p * d + j];
            bound[id * d + j] += gv[p * d + j].abs();
        }
    }
    c.check_sums("embedding backward", &table.grad().unwrap(), &gw, &bound, 37)
}

/// Matrix products on odd shapes (the tensor cores on CUDA, f32 accumulation), batched products,
/// and the products of the backward (the transposed layouts).
/// The naive product of `a` (m x k) and `b` (k x n) in f64, and the sum of the terms' magnitudes.
fn naive_product(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut out, mut bound) = (vec![0.0; m * n], vec![0.0; m * n]);
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                out[i * n + j] += a[i * k + p] * b[p * n + j];
                bound[i * n + j] += (a[i * k + p] * b[p * n + j]).abs();
            }
        }
    }
    (out, bound)
}

/// `a b` (NN) of m x k by k x n, its gradients `dA = G B^T` (NT) and `dB = A^T G` (TN) with G of
/// ones, and `a w^T` (NT, w stored n x k) against the f64 reference.
fn matmul_layouts_at(c: &mut Case, (m, k, n): (usize, usize, usize)) -> Outcome {
    let naive = naive_product;
    let (a, av) = c.input(&[m, k], 1.0);
    let (b, bv) = c.input(&[k, n], 1.0);
    let (a, b) = (a.detach().requires_grad(), b.detach().requires_grad());
    let p = a.matmul(&b).unwrap();
    let (want, bound) = naive(&av, &bv, m, k, n);
    c.check_sums(&format!("matmul {m}x{k}x{n}"), &p, &want, &bound, k)?;
    // backward: dA = G B^T (NT), dB = A^T G (TN), with G of ones
    p.sum_all().unwrap().backward().unwrap();
    let ga: Vec<f64> = (0..m * k).map(|i| (0..n).map(|j| bv[(i % k) * n + j]).sum()).collect();
    let gab: Vec<f64> = (0..m * k).map(|i| (0..n).map(|j| bv[(i % k) * n + j].abs()).sum()).collect();
    c.check_sums(&format!("matmul {m}x{k}x{n} dA"), &a.grad().unwrap(), &ga, &gab, n)?;
    let gb: Vec<f64> = (0..k * n).map(|i| (0..m).map(|r| av[r * k + i / n]).sum()).collect();
    let gbb: Vec<f64> = (0..k * n).map(|i| (0..m).map(|r| av[r * k + i / n].abs()).sum()).collect();
    c.check_sums(&format!("matmul {m}x{k}x{n} dB"), &b.grad().unwrap(), &gb, &gbb, m)?;
    // A W^T, W stored n x k (a Linear layer's forward)
    let (w, wv) = c.input(&[n, k], 1.0);
    let wt: Vec<f64> = (0..k * n).map(|i| wv[(i % n) * k + i / n]).collect();
    let (want, bound) = naive(&av, &wt, m, k, n);
    c.check_sums(&format!("matmul_t {m}x{k}x{n}"), &a.matmul_t(&w).unwrap(), &want, &bound, k)
}

pub fn matmul(dev: &Device, dt: DType) -> Outcome {
    let mut c = Case::new(dev, dt);
    let naive = naive_product;
    for shape in [(1, 1, 1), (3, 257, 5), (33, 100, 17), (130, 72, 257), (2, 1025, 3)] {
        matmul_layouts_at(&mut c, shape)?;
    }
    // batched: both sides batched, and a shared B
    let (bt, m, k, n) = (3, 5, 19, 7);
    let (a, av) = c.input(&[bt, m, k], 1.0);
    let (b, bv) = c.input(&[bt, k, n], 1.0);
    let (mut want, mut bound) = (vec![], vec![]);
    for i in 0..bt {
        let (w, bd) = naive(&av[i * m * k..(i + 1) * m * k], &bv[i * k * n..(i + 1) * k * n], m, k, n);
        want.extend(w);
        bound.extend(bd);
    }
    c.check_sums("batched matmul", &a.matmul(&b).unwrap(), &want, &bound, k)?;
    let (s, sv) = c.input(&[k, n], 1.0);
    let (want, bound) = naive(&av, &sv, bt * m, k, n);
    c.check_sums("batched matmul, shared B", &a.matmul(&s).unwrap(), &want, &bound, k)
}

/// Products at shapes whose every stored row is a multiple of 8 elements (on sm_90a, bf16 products
/// read their operands in place in each layout, NN, NT and TN, and write bf16 directly), beside
/// shapes where one pitch breaks that (packed instead): one row, one tile, several tiles with
/// ragged edges, a batch against a shared B. Forward and gradients against the f64 reference.
pub fn matmul_in_place(dev: &Device, dt: DType) -> Outcome {
    let mut c = Case::new(dev, dt);
    for shape in [
        (1, 8, 8),
        (40, 64, 24),
        (7, 16, 136),
        (200, 136, 72),
        (256, 128, 192),
        (65, 72, 264),
        // one pitch off a multiple of 8: NN (n), NT (k) or TN (m) packs
        (40, 64, 20),
        (40, 60, 24),
        (36, 64, 24),
    ] {
        matmul_layouts_at(&mut c, shape)?;
    }
    let (bt, m, k, n) = (3, 5, 16, 24);
    let (a, av) = c.input(&[bt, m, k], 1.0);
    let (s, sv) = c.input(&[k, n], 1.0);
    let (want, bound) = naive_product(&av, &sv, bt * m, k, n);
    c.check_sums("batched matmul in place, shared B", &a.matmul(&s).unwrap(), &want, &bound, k)
}

/// Dropout: the same seed gives the same mask on every backend, and the output is `x * mask`
/// rounded once (the same bits as the CPU backend's).
pub fn dropout(dev: &Device, dt: DType) -> Outcome {
    let mut c = Case::new(dev, dt);
    let (x, v) = c.input(&[3, 257], 2.0);
    let seed = c.seed;
    let y = x.dropout(0.25, &mut Tensor::rng(seed)).unwrap();
    let cpu = Tensor::from_f64(&v, [3, 257], dt).unwrap().dropout(0.25, &mut Tensor::rng(seed)).unwrap();
    c.check("dropout(0.25) against the CPU backend", &y, &cpu.to_vec_f64(), Tol::EXACT)?;
    let dropped = y.to_vec_f64().iter().zip(&v).filter(|(y, x)| **y == 0.0 && **x != 0.0).count();
    if !(50..=350).contains(&dropped) {
        return Err(format!("dropout(0.25) dropped {dropped} of 771 (seed {seed})"));
    }
    Ok(())
}

/// Inputs of two dtypes in one op are a typed error naming both.
pub fn mixed_dtypes(dev: &Device, dt: DType) -> Outcome {
    let mut c = Case::new(dev, dt);
    let (x, _) = c.input(&[2, 3], 1.0);
    let f32s = Tensor::zeros([2, 3], DType::F32).to_device(dev).unwrap();
    let other = if dt == DType::BF16 { DType::F16 } else { DType::BF16 };
    let y = Tensor::zeros([3, 2], other).to_device(dev).unwrap();
    let named = |r: kiln::Result<Tensor>, a: DType, b: DType, what: &str| -> Outcome {
        match r {
            Err(e @ kiln::Error::DType { .. }) => {
                let s = e.to_string();
                if s.contains(&format!("{a:?}")) && s.contains(&format!("{b:?}")) {
                    Ok(())
                } else {
                    Err(format!("{what}: the error does not name {a:?} and {b:?}: {s}"))
                }
            }
            Err(e) => Err(format!("{what}: expected a dtype error, got {e}")),
            Ok(_) => Err(format!("{what}: mixing {a:?} and {b:?} was accepted")),
        }
    };
    named(x.add(&f32s), dt, DType::F32, "add")?;
    named(f32s.mul(&x), DType::F32, dt, "mul")?;
    named(x.matmul(&y), dt, other, "matmul")?;
    let w = Tensor::ones([3], DType::F32).to_device(dev).unwrap();
    let b = Tensor::zeros([3], dt).to_device(dev).unwrap();
    named(x.layer_norm(&w, &b, 1e-5), dt, DType::F32, "layer_norm")?;
    Ok(())
}
