//! Backend test cases: each takes the device to run on and compares with straightforward f64
//! references (or, for gradients, with the CPU reference backend). `ops.rs` runs them on the CPU;
//! `gpu/tensor.rs` runs the same functions on CUDA.
#![allow(dead_code)]

use kiln::tensor::{DType, Device, Targets, Tensor};
use kiln::testing::{Tol, compare};

fn t(v: &[f64], shape: &[usize], dev: &Device) -> Tensor {
    Tensor::from_f64(v, shape.to_vec(), DType::F32).unwrap().to_device(dev).unwrap()
}
fn rnd(n: usize, seed: u64) -> Vec<f64> {
    let r = Tensor::randn([n], DType::F64, &mut Tensor::rng(seed));
    r.to_vec_f64()
}
fn f32s(v: &[f64]) -> Vec<f64> {
    v.iter().map(|&x| x as f32 as f64).collect()
}
const F32: Tol = Tol { abs: 1e-5, rel: 1e-5 };

pub fn matmul_matches_naive(dev: &Device) {
    for &(m, k, n) in &[(1, 1, 1), (7, 13, 5), (33, 64, 17), (130, 300, 70)] {
        let (a, b) = (f32s(&rnd(m * k, 1)), f32s(&rnd(k * n, 2)));
        let got = t(&a, &[m, k], dev).matmul(&t(&b, &[k, n], dev)).unwrap().to_vec_f32();
        let mut want = vec![0.0; m * n];
        let mut bound = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    want[i * n + j] += a[i * k + p] * b[p * n + j];
                    bound[i * n + j] += (a[i * k + p] * b[p * n + j]).abs();
                }
            }
        }
        for (idx, ((&g, &w), &bd)) in got.iter().zip(&want).zip(&bound).enumerate() {
            compare(
                &format!("matmul {m}x{k}x{n} [{idx}]"),
                &[g],
                &[w],
                Tol { abs: k as f64 * 6e-8 * bd + 1e-30, rel: 0.0 },
            )
            .unwrap();
        }
    }
    // batched equals per-batch
    let (a, b) = (f32s(&rnd(2 * 3 * 4, 3)), f32s(&rnd(2 * 4 * 5, 4)));
    let batched = t(&a, &[2, 3, 4], dev).matmul(&t(&b, &[2, 4, 5], dev)).unwrap().to_vec_f32();
    for bi in 0..2 {
        let one = t(&a[bi * 12..(bi + 1) * 12], &[3, 4], dev)
            .matmul(&t(&b[bi * 20..(bi + 1) * 20], &[4, 5], dev))
            .unwrap()
            .to_vec_f32();
        assert_eq!(&batched[bi * 15..(bi + 1) * 15], &one[..]);
    }
}

/// `x.matmul_t(w)` (a Linear layer's product, `w` read in place where the backend can) gives the
/// bits of `x.matmul(w^T)`, and so do both gradients, at 2-D and batched 3-D `x`, with row lengths
/// that the in-place GPU path takes (multiples of 4) and ones it declines.
pub fn matmul_t_matches_matmul_of_transpose(dev: &Device) {
    let bits = |t: &Tensor| t.to_vec_f32().iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    for (i, &(xs, n)) in
        [(&[6usize, 8][..], 12usize), (&[7, 13], 5), (&[2, 33, 64], 20), (&[130, 300], 70)].iter().enumerate()
    {
        let k = *xs.last().unwrap();
        let rows: usize = xs.iter().product::<usize>() / k;
        let seed = 100 + 4 * i as u64;
        let (xv, wv, gv) = (f32s(&rnd(rows * k, seed)), f32s(&rnd(n * k, seed + 1)), f32s(&rnd(rows * n, seed + 2)));
        let mut out_shape = xs.to_vec();
        *out_shape.last_mut().unwrap() = n;
        let run = |fused: bool| {
            let (x, w) = (t(&xv, xs, dev).requires_grad(), t(&wv, &[n, k], dev).requires_grad());
            let y = if fused { x.matmul_t(&w) } else { x.matmul(&w.transpose(0, 1).unwrap()) }.unwrap();
            y.mul(&t(&gv, &out_shape, dev)).unwrap().sum_all().unwrap().backward().unwrap();
            (bits(&y), bits(&x.grad().unwrap()), bits(&w.grad().unwrap()))
        };
        let (fused, plain) = (run(true), run(false));
        assert!(fused.0 == plain.0, "matmul_t {xs:?} x {n}: y differs from matmul of the transpose");
        assert!(fused.1 == plain.1, "matmul_t {xs:?} x {n}: dx differs");
        assert!(fused.2 == plain.2, "matmul_t {xs:?} x {n}: dw differs");
    }
    // a width mismatch is a typed error naming the op
    let e = t(&[0.0; 6], &[2, 3], dev).matmul_t(&t(&[0.0; 8], &[2, 4], dev)).unwrap_err().to_string();
    assert!(e.contains("matmul_t"), "{e}");
}

pub fn broadcast_binary(dev: &Device) {
    let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], dev);
    let row = t(&[10.0, 20.0, 30.0], &[3], dev);
    let col = t(&[100.0, 200.0], &[2, 1], dev);
    assert_eq!(a.add(&row).unwrap().to_vec_f64(), vec![11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
    assert_eq!(a.mul(&col).unwrap().to_vec_f64(), vec![100.0, 200.0, 300.0, 800.0, 1000.0, 1200.0]);
    assert_eq!(col.sub(&row).unwrap().to_vec_f64(), vec![90.0, 80.0, 70.0, 190.0, 180.0, 170.0]);
    assert_eq!(a.div(&row).unwrap().dims(), &[2, 3]);
    // Same-shape operands (CUDA's flat kernel: quads of 4, then a tail of n % 4) and unary ops,
    // at lengths around multiples of 4; every result is exact in f32.
    for n in [1usize, 2, 3, 4, 5, 7, 8, 1027, 4096 + 3] {
        let (x, y) = (f32s(&rnd(n, 40 + n as u64)), f32s(&rnd(n, 41 + n as u64)));
        let (a, b) = (t(&x, &[n], dev), t(&y, &[n], dev));
        let f32_of = |v: f64| v as f32 as f64;
        let want = |f: fn(f32, f32) -> f32| -> Vec<f64> {
            x.iter().zip(&y).map(|(&p, &q)| f(p as f32, q as f32) as f64).collect()
        };
        compare(&format!("add n={n}"), &a.add(&b).unwrap().to_vec_f32(), &want(|p, q| p + q), Tol::EXACT).unwrap();
        compare(&format!("sub n={n}"), &a.sub(&b).unwrap().to_vec_f32(), &want(|p, q| p - q), Tol::EXACT).unwrap();
        compare(&format!("mul n={n}"), &a.mul(&b).unwrap().to_vec_f32(), &want(|p, q| p * q), Tol::EXACT).unwrap();
        compare(&format!("div n={n}"), &a.div(&b).unwrap().to_vec_f32(), &want(|p, q| p / q), Tol::EXACT).unwrap();
        let relu: Vec<f64> = x.iter().map(|&v| f32_of(v.max(0.0))).collect();
        compare(&format!("relu n={n}"), &a.relu().unwrap().to_vec_f32(), &relu, Tol::EXACT).unwrap();
        // ReLU's backward in one pass: the bits of the product with the step mask it replaces
        let fused = a.relu_grad(&b).unwrap().to_vec_f32();
        let step: Vec<f64> = y.iter().map(|&q| if q > 0.0 { 1.0 } else { 0.0 }).collect();
        let composed = a.mul(&t(&step, &[n], dev)).unwrap().to_vec_f32();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fused), bits(&composed), "relu_grad n={n}: not the bits of a * step(b)");
    }
    // signed zeros, a NaN and infinities on either side, and a broadcast mask
    let a = t(&[-1.5, 2.0, f64::NAN, -0.0, f64::INFINITY, 3.0], &[2, 3], dev);
    let m = t(&[0.0, -2.0, 1.0, 5.0, f64::NAN, f64::NEG_INFINITY], &[2, 3], dev);
    let got: Vec<u32> = a.relu_grad(&m).unwrap().to_vec_f32().iter().map(|x| x.to_bits()).collect();
    let step = t(&[0.0, 0.0, 1.0, 1.0, 0.0, 0.0], &[2, 3], dev);
    let want: Vec<u32> = a.mul(&step).unwrap().to_vec_f32().iter().map(|x| x.to_bits()).collect();
    assert_eq!(got, want, "relu_grad on signed zeros, NaN and infinities");
    let rowmask = t(&[1.0, -1.0, 0.5], &[3], dev);
    assert_eq!(a.relu_grad(&rowmask).unwrap().to_vec_f64()[..2], [-1.5, 0.0]);
}

pub fn reductions_and_max(dev: &Device) {
    let v: Vec<f64> = (0..24).map(|i| ((i * 7) % 11) as f64 - 5.0).collect();
    let x = t(&v, &[2, 3, 4], dev);
    assert_eq!(x.sum_all().unwrap().item().unwrap(), v.iter().sum::<f64>());
    let s1 = x.sum_dim(1, false).unwrap();
    assert_eq!(s1.dims(), &[2, 4]);
    for b in 0..2 {
        for k in 0..4 {
            let want: f64 = (0..3).map(|j| v[b * 12 + j * 4 + k]).sum();
            assert_eq!(s1.to_vec_f64()[b * 4 + k], want);
        }
    }
    assert_eq!(x.mean_dim(-1, true).unwrap().dims(), &[2, 3, 1]);
    let m = x.max_dim(-1, false).unwrap().to_vec_f64();
    for (r, row) in v.chunks(4).enumerate() {
        assert_eq!(m[r], row.iter().cloned().fold(f64::MIN, f64::max));
    }
    assert_eq!(x.argmax_last().unwrap().len(), 6);
}

pub fn softmax_and_cross_entropy(dev: &Device) {
    // Large logits: a stable softmax subtracts the row maximum.
    let v = [1000.0, 1001.0, 1002.0, -5.0, 0.0, 5.0];
    let x = t(&v, &[2, 3], dev);
    let sm = x.softmax().unwrap().to_vec_f32();
    let lsm = x.log_softmax().unwrap().to_vec_f32();
    for r in 0..2 {
        let row = &v[r * 3..r * 3 + 3];
        let mx = row.iter().cloned().fold(f64::MIN, f64::max);
        let z: f64 = row.iter().map(|x| (x - mx).exp()).sum();
        let want: Vec<f64> = row.iter().map(|x| (x - mx).exp() / z).collect();
        let want_log: Vec<f64> = row.iter().map(|x| x - mx - z.ln()).collect();
        compare("softmax", &sm[r * 3..r * 3 + 3], &want, F32).unwrap();
        compare("log_softmax", &lsm[r * 3..r * 3 + 3], &want_log, F32).unwrap();
    }
    let ce = x.cross_entropy(&[2, 0]).unwrap().item().unwrap();
    let want = -(lsm[2] as f64 + lsm[3] as f64) / 2.0;
    assert!((ce - want).abs() < 1e-5, "{ce} vs {want}");
    let mse = x.mse(&t(&[1000.0, 1000.0, 1000.0, -5.0, 0.0, 5.0], &[2, 3], dev)).unwrap().item().unwrap();
    assert!((mse - 5.0 / 6.0).abs() < 1e-6);
    // Widths on both sides of the CUDA row kernels' register-cached path (d % 4 == 0, d <= 8192),
    // against f64: softmax, log-softmax, the mean cross-entropy and its gradient.
    for (i, &d) in [3usize, 8, 100, 4096, 8192, 8196, 9001].iter().enumerate() {
        let rows = 3;
        let v = f32s(&rnd(rows * d, 20 + i as u64).iter().map(|x| 4.0 * x).collect::<Vec<_>>());
        let targets: Vec<usize> = (0..rows).map(|r| (r * 7919 + d / 2) % d).collect();
        let x = t(&v, &[rows, d], dev).detach().requires_grad();
        let (sm, lsm) = (x.softmax().unwrap().to_vec_f32(), x.log_softmax().unwrap().to_vec_f32());
        let ce = x.cross_entropy(&targets).unwrap();
        ce.backward().unwrap();
        let grad = x.grad().unwrap().to_vec_f32();
        let mut want_ce = 0.0;
        for r in 0..rows {
            let row = &v[r * d..(r + 1) * d];
            let mx = row.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = row.iter().map(|x| (x - mx).exp()).sum();
            let p: Vec<f64> = row.iter().map(|x| (x - mx).exp() / z).collect();
            let lp: Vec<f64> = row.iter().map(|x| x - mx - z.ln()).collect();
            let g: Vec<f64> = (0..d).map(|c| (p[c] - if c == targets[r] { 1.0 } else { 0.0 }) / rows as f64).collect();
            want_ce -= lp[targets[r]] / rows as f64;
            compare(&format!("softmax d={d}"), &sm[r * d..(r + 1) * d], &p, F32).unwrap();
            compare(&format!("log_softmax d={d}"), &lsm[r * d..(r + 1) * d], &lp, Tol { abs: 1e-5, rel: 1e-5 })
                .unwrap();
            compare(&format!("cross_entropy grad d={d}"), &grad[r * d..(r + 1) * d], &g, F32).unwrap();
        }
        let got = ce.item().unwrap();
        assert!((got - want_ce).abs() < 1e-5 * want_ce.abs().max(1.0), "cross_entropy d={d}: {got} vs {want_ce}");
    }
}

/// The mean over many rows (more than the mean kernel's 1024 threads, not a multiple of them), with
/// one `Targets` reused by two losses and their gradients: the same value each time, against f64.
pub fn cross_entropy_many_rows_reused_targets(dev: &Device) {
    let (rows, d) = (3001, 5);
    let v = f32s(&rnd(rows * d, 77).iter().map(|x| 3.0 * x).collect::<Vec<_>>());
    let y = Targets::new((0..rows).map(|r| (r * 13) % d).collect());
    let mut want = 0.0;
    for r in 0..rows {
        let row = &v[r * d..(r + 1) * d];
        let mx = row.iter().cloned().fold(f64::MIN, f64::max);
        let z: f64 = row.iter().map(|x| (x - mx).exp()).sum();
        want -= (row[y.as_slice()[r]] - mx - z.ln()) / rows as f64;
    }
    let mut seen = vec![];
    for _ in 0..2 {
        let x = t(&v, &[rows, d], dev).detach().requires_grad();
        let ce = x.cross_entropy(&y).unwrap();
        ce.backward().unwrap();
        let got = ce.item().unwrap();
        compare("cross_entropy mean of 3001 rows", &[got as f32], &[want], Tol { abs: 1e-6, rel: 1e-6 }).unwrap();
        seen.push((got.to_bits(), x.grad().unwrap().to_vec_f32().iter().map(|g| g.to_bits()).collect::<Vec<_>>()));
    }
    assert_eq!(seen[0], seen[1], "a reused Targets changed the loss or its gradient");
    // A target past the last class is refused before anything runs.
    let bad = Targets::new(vec![d; rows]);
    let e = t(&v, &[rows, d], dev).cross_entropy(&bad).unwrap_err().to_string();
    assert!(e.contains("cross_entropy") && e.contains("out of range"), "{e}");
}

pub fn layer_norm_matches_two_pass(dev: &Device) {
    // Widths on both sides of the CUDA kernel's register-cached path (d % 4 == 0, d <= 8192).
    for &(rows, d) in &[(5, 37), (3, 64), (2, 4096), (2, 8192), (2, 8196)] {
        layer_norm_case(dev, rows, d);
    }
}

fn layer_norm_case(dev: &Device, rows: usize, d: usize) {
    let v: Vec<f64> = f32s(&rnd(rows * d, 9).iter().map(|x| 100.0 + 3.0 * x).collect::<Vec<_>>());
    let (w, b) = (f32s(&rnd(d, 10)), f32s(&rnd(d, 11)));
    let got = t(&v, &[rows, d], dev).layer_norm(&t(&w, &[d], dev), &t(&b, &[d], dev), 1e-5).unwrap().to_vec_f32();
    for r in 0..rows {
        let row = &v[r * d..(r + 1) * d];
        let mean = row.iter().sum::<f64>() / d as f64;
        let var = row.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / d as f64;
        let want: Vec<f64> = (0..d).map(|c| (row[c] - mean) / (var + 1e-5).sqrt() * w[c] + b[c]).collect();
        compare(&format!("layer_norm d={d}"), &got[r * d..(r + 1) * d], &want, Tol { abs: 1e-4, rel: 1e-4 }).unwrap();
    }
}

pub fn gelu_and_friends(dev: &Device) {
    let v = [-3.0, -1.0, -0.1, 0.0, 0.5, 2.0];
    let x = t(&v, &[6], dev);
    let gelu: Vec<f64> = v
        .iter()
        .map(|&x: &f64| 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh()))
        .collect();
    compare("gelu", &x.gelu().unwrap().to_vec_f32(), &gelu, F32).unwrap();
    compare("relu", &x.relu().unwrap().to_vec_f32(), &v.map(|x| x.max(0.0)), F32).unwrap();
    compare("sigmoid", &x.sigmoid().unwrap().to_vec_f32(), &v.map(|x| 1.0 / (1.0 + (-x).exp())), F32).unwrap();
    compare("tanh", &x.tanh().unwrap().to_vec_f32(), &v.map(f64::tanh), F32).unwrap();
    compare("exp", &x.exp().unwrap().to_vec_f32(), &v.map(f64::exp), F32).unwrap();
}

pub fn embedding_and_transpose(dev: &Device) {
    let table = t(&[0.0, 1.0, 10.0, 11.0, 20.0, 21.0], &[3, 2], dev);
    let e = table.embedding(&[2, 0, 2], [3]).unwrap();
    assert_eq!(e.dims(), &[3, 2]);
    assert_eq!(e.to_vec_f64(), vec![20.0, 21.0, 0.0, 1.0, 20.0, 21.0]);
    let x = t(&(0..24).map(|i| i as f64).collect::<Vec<_>>(), &[2, 3, 4], dev);
    let y = x.transpose(0, 2).unwrap();
    assert_eq!(y.dims(), &[4, 3, 2]);
    let (xv, yv) = (x.to_vec_f64(), y.to_vec_f64());
    for i in 0..2 {
        for j in 0..3 {
            for k in 0..4 {
                assert_eq!(yv[k * 6 + j * 2 + i], xv[i * 12 + j * 4 + k]);
            }
        }
    }
}

pub fn dtypes_round_trip(dev: &Device) {
    let x = t(&[1.0, -2.5, 3.140625], &[3], dev);
    if *dev != Device::Cpu {
        // CUDA tensors are f32, bf16 or f16: f64 is a typed error, not a silent conversion.
        assert!(matches!(x.to_dtype(DType::F64), Err(kiln::Error::Unsupported { op: "to_dtype", .. })));
        let f64s = Tensor::from_f64(&[1.0], [1], DType::F64).unwrap();
        assert!(matches!(f64s.to_device(dev), Err(kiln::Error::Unsupported { op: "to_device", .. })));
    }
    let dtypes: &[DType] =
        if *dev == Device::Cpu { &[DType::BF16, DType::F16, DType::F64] } else { &[DType::BF16, DType::F16] };
    for &d in dtypes {
        let y = x.to_dtype(d).unwrap();
        assert_eq!(y.dtype(), d);
        assert_eq!(y.to_dtype(DType::F32).unwrap().to_vec_f64(), vec![1.0, -2.5, 3.140625]);
    }
    // bf16 matrix products accumulate in f32 and round once
    let a = x.reshape([1, 3]).unwrap().to_dtype(DType::BF16).unwrap();
    let b = x.reshape([3, 1]).unwrap().to_dtype(DType::BF16).unwrap();
    let p = a.matmul(&b).unwrap();
    assert_eq!(p.dtype(), DType::BF16);
    let exact = 1.0 + 6.25 + 3.140625f64 * 3.140625;
    assert!((p.item().unwrap() - exact).abs() <= exact * 2f64.powi(-8));
    let _ = Tensor::zeros([2, 2], DType::F32).to_string();
}

fn cpu_and(dev: &Device, v: &[f64], shape: &[usize]) -> (Tensor, Tensor) {
    let c = Tensor::from_f64(v, shape.to_vec(), DType::F32).unwrap().requires_grad();
    let d = Tensor::from_f64(v, shape.to_vec(), DType::F32).unwrap().to_device(dev).unwrap().detach().requires_grad();
    (c, d)
}

/// Every op's backward on `dev` against the CPU reference backend (f32 on both), through a small
/// graph per op ending in a weighted sum.
pub fn gradients_match_cpu(dev: &Device) {
    type Graph = fn(&[Tensor]) -> kiln::Result<Tensor>;
    let cases: Vec<(&str, Vec<Vec<usize>>, Graph)> = vec![
        ("linear+relu+ce", vec![vec![4, 3], vec![5, 3], vec![5]], |x| {
            x[0].matmul(&x[1].transpose(0, 1)?)?.add(&x[2])?.relu()?.cross_entropy(&[0, 4, 2, 1])
        }),
        ("gelu tanh sigmoid", vec![vec![3, 5]], |x| x[0].gelu()?.add(&x[0].tanh()?)?.mul(&x[0].sigmoid()?)),
        ("exp log sqrt", vec![vec![2, 4]], |x| {
            let p = x[0].mul(&x[0])?.add_scalar(1.0)?;
            p.log()?.add(&p.sqrt()?)?.add(&x[0].mul_scalar(0.3)?.exp()?)
        }),
        ("softmax log_softmax", vec![vec![3, 6]], |x| x[0].softmax()?.add(&x[0].log_softmax()?)),
        ("layer_norm", vec![vec![4, 7], vec![7], vec![7]], |x| x[0].layer_norm(&x[1], &x[2], 1e-5)),
        ("embedding", vec![vec![5, 3]], |x| x[0].embedding(&[4, 0, 4, 2, 4], [5])),
        ("max", vec![vec![3, 4, 2]], |x| x[0].max_dim(1, false)),
        ("shapes", vec![vec![2, 3, 4], vec![3, 1]], |x| {
            x[0].transpose(0, 2)?
                .reshape([4, 6])?
                .sum_to(&[1, 6].into())?
                .add(&x[1].expand(&[3, 6].into())?.sum_dim(0, true)?)
        }),
        ("div mean", vec![vec![3, 4], vec![4]], |x| x[0].div(&x[1].mul(&x[1])?.add_scalar(0.5)?)?.mean_dim(0, true)),
        ("mse", vec![vec![3, 4], vec![3, 4]], |x| x[0].mse(&x[1])),
    ];
    for (i, (name, shapes, f)) in cases.into_iter().enumerate() {
        let mut rng = Tensor::rng(100 + i as u64);
        let (mut cpu, mut gpu) = (vec![], vec![]);
        for s in &shapes {
            let v = Tensor::randn(s.clone(), DType::F64, &mut rng).to_vec_f64();
            let (c, d) = cpu_and(dev, &v, s);
            cpu.push(c);
            gpu.push(d);
        }
        let oc = f(&cpu).unwrap();
        let w = Tensor::rand(0.5, 1.5, oc.shape().clone(), DType::F32, &mut rng);
        oc.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
        let og = f(&gpu).unwrap();
        assert_eq!(og.device(), *dev, "{name}: output left the device");
        compare(&format!("{name}: forward"), &og.to_vec_f32(), &oc.to_vec_f64(), Tol { abs: 1e-5, rel: 1e-4 }).unwrap();
        og.mul(&w.to_device(dev).unwrap()).unwrap().sum_all().unwrap().backward().unwrap();
        for (j, (c, g)) in cpu.iter().zip(&gpu).enumerate() {
            let gc = c.grad().map(|t| t.to_vec_f64()).unwrap_or_else(|| vec![0.0; c.elem_count()]);
            let gg = g.grad().map(|t| t.to_vec_f32()).unwrap_or_else(|| vec![0.0; g.elem_count()]);
            if let Some(t) = g.grad() {
                assert_eq!(t.device(), *dev, "{name}: gradient of input {j} left the device");
            }
            compare(&format!("{name}: gradient of input {j}"), &gg, &gc, Tol { abs: 1e-5, rel: 1e-4 }).unwrap();
        }
    }
}

/// Five Adam steps of the main job's MLP on `dev` against the same on the CPU backend.
pub fn training_step_matches_cpu(dev: &Device) {
    use kiln::nn::{Activation, Module, mlp};
    use kiln::optim::{Adam, Optimizer};
    let make = || mlp(2, 32, 3, 3, Activation::Relu, DType::F32, &mut Tensor::rng(5)).unwrap();
    let (mc, mg) = (make(), make());
    for (_, p) in mg.named_parameters() {
        p.move_to(dev).unwrap();
    }
    let mut oc = Adam::adam(mc.named_parameters(), 1e-2, 0.0);
    let mut og = Adam::adam(mg.named_parameters(), 1e-2, 0.0);
    let mut rng = Tensor::rng(6);
    for step in 0..5 {
        let x = Tensor::randn([16, 2], DType::F32, &mut rng);
        let y: Vec<usize> = (0..16).map(|i| (i * 7 + step) % 3).collect();
        let lc = mc.forward(&x).unwrap().cross_entropy(&y).unwrap();
        let lg = mg.forward(&x.to_device(dev).unwrap()).unwrap().cross_entropy(&y).unwrap();
        let (a, b) = (lc.item().unwrap(), lg.item().unwrap());
        assert!((a - b).abs() <= 1e-4 * (1.0 + a.abs()), "step {step}: loss {a} on the CPU, {b} on {}", dev.name());
        lc.backward().unwrap();
        lg.backward().unwrap();
        oc.step().unwrap();
        og.step().unwrap();
        oc.zero_grad();
        og.zero_grad();
    }
    for ((n, pc), (_, pg)) in mc.named_parameters().iter().zip(mg.named_parameters()) {
        assert_eq!(pg.device(), *dev);
        compare(
            &format!("parameter {n} after 5 steps"),
            &pg.to_vec_f32(),
            &pc.to_vec_f64(),
            Tol { abs: 1e-4, rel: 1e-3 },
        )
        .unwrap();
    }
}
