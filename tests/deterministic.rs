//! The fixed-association f32 tier on the CPU (the GPU suite checks the CUDA kernels against the same
//! reference, bit for bit).

use kiln::deterministic::{matmul_chain, set_deterministic};
use kiln::tensor::{DType, Tensor};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// `set_deterministic` is process-wide: tests that switch it take this lock.
static MODE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn data(rng: &mut StdRng, n: usize) -> Vec<f32> {
    // include exact zeros and negative zeros, where sign-of-zero rules matter
    (0..n)
        .map(|i| match i % 11 {
            0 => 0.0,
            1 => -0.0,
            _ => rng.random_range(-1.0f32..1.0),
        })
        .collect()
}

#[test]
fn the_chain_is_a_good_product() {
    let mut rng = StdRng::seed_from_u64(1);
    let (m, k, n) = (9, 37, 5);
    let (a, b) = (data(&mut rng, m * k), data(&mut rng, k * n));
    let c = matmul_chain(&a, &b, m, k, n);
    for i in 0..m {
        for j in 0..n {
            let (mut want, mut mag) = (0.0f64, 0.0f64);
            for p in 0..k {
                want += a[i * k + p] as f64 * b[p * n + j] as f64;
                mag += (a[i * k + p] as f64 * b[p * n + j] as f64).abs();
            }
            assert!((c[i * n + j] as f64 - want).abs() <= k as f64 * 6e-8 * mag + 1e-30);
        }
    }
}

/// The chain over `a[..k]`, `b[..k]` from +0.0, then `pad` zero-padding steps `fma(0, 0, acc)`, as a
/// tiled kernel runs it when k is not a multiple of its tile depth.
fn chain_padded(a: &[f32], b: &[f32], pad: usize) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        acc = x.mul_add(*y, acc);
    }
    for _ in 0..pad {
        acc = 0.0f32.mul_add(0.0, acc);
    }
    acc
}

#[test]
fn an_underflowing_product_leaves_minus_zero_and_padding_turns_it_into_plus_zero() {
    // The exact product -1e-60 is nonzero, so fma(-1e-30, 1e-30, +0.0) rounds it to a zero of its
    // sign: the chain from +0.0 holds -0.0.
    let acc = (-1e-30f32).mul_add(1e-30, 0.0);
    assert_eq!(acc.to_bits(), (-0.0f32).to_bits());
    assert_eq!(matmul_chain(&[-1e-30], &[1e-30], 1, 1, 1)[0].to_bits(), (-0.0f32).to_bits());
    // One padding step: (+0) + (-0) = +0 in round-to-nearest.
    assert_eq!(0.0f32.mul_add(0.0, acc).to_bits(), 0.0f32.to_bits());
    assert_eq!(chain_padded(&[-1e-30], &[1e-30], 1).to_bits(), 0.0f32.to_bits());
    // The two agree as values; only the sign of the zero differs.
    assert_eq!(chain_padded(&[-1e-30], &[1e-30], 0), chain_padded(&[-1e-30], &[1e-30], 7));
    // A chain whose underflowing products have mixed signs ends at the sign of the last one.
    assert!(chain_padded(&[1e-30, -1e-30], &[1e-30, 1e-30], 0).is_sign_negative());
    assert!(chain_padded(&[-1e-30, 1e-30], &[1e-30, 1e-30], 0).is_sign_positive());
}

/// Values whose products often underflow to zero (magnitudes near 1e-23, products near 1e-46,
/// below f32's smallest subnormal 1.4e-45), with signed zeros and, if `ordinary`, some values
/// from [-1, 1].
fn tiny_data(rng: &mut StdRng, n: usize, ordinary: bool) -> Vec<f32> {
    (0..n)
        .map(|i| match i % 7 {
            0 => 0.0,
            1 => -0.0,
            2 if ordinary => rng.random_range(-1.0f32..1.0),
            _ => rng.random_range(-1.0f32..1.0) * 1e-23,
        })
        .collect()
}

#[test]
fn zero_padding_changes_at_most_the_sign_of_a_zero_result() {
    // What holds for the tiled kernels' zero padding: a nonzero (or infinite) result keeps its
    // bits; a zero result becomes +0.0, so padded and unpadded chains agree as values, and in bits
    // up to the sign of zero.
    let mut rng = StdRng::seed_from_u64(2);
    let (mut minus_zero, mut changed) = (0, 0);
    for trial in 0..20_000 {
        let k = 1 + trial % 40;
        let (a, b) = match trial % 3 {
            0 => (data(&mut rng, k), data(&mut rng, k)),
            1 => (tiny_data(&mut rng, k, true), tiny_data(&mut rng, k, true)),
            _ => (tiny_data(&mut rng, k, false), tiny_data(&mut rng, k, false)),
        };
        let acc = chain_padded(&a, &b, 0);
        for pad in [1, 3, 8, 15] {
            let padded = chain_padded(&a, &b, pad);
            assert_eq!(padded, acc, "padding changed the value");
            if acc != 0.0 {
                assert_eq!(padded.to_bits(), acc.to_bits(), "padding changed a nonzero result");
            } else {
                assert_eq!(padded.to_bits(), 0.0f32.to_bits(), "a padded zero is +0.0");
            }
            changed += (padded.to_bits() != acc.to_bits()) as usize;
        }
        minus_zero += (acc == 0.0 && acc.is_sign_negative()) as usize;
    }
    // the data does reach -0.0 from +0.0, and padding does change those bits
    assert!(minus_zero > 0 && changed > 0, "{minus_zero} chains ended at -0.0, {changed} padded results differ");
}

#[test]
fn padding_a_whole_product_matches_the_chain_up_to_the_sign_of_zero() {
    // matmul_chain (unpadded) against the same product with k zero-padded to a tile depth, as a
    // tiled GPU kernel computes it.
    let mut rng = StdRng::seed_from_u64(5);
    let (m, k, n) = (17, 21, 13);
    let (a, b) = (tiny_data(&mut rng, m * k, true), tiny_data(&mut rng, k * n, true));
    let want = matmul_chain(&a, &b, m, k, n);
    for depth in [8usize, 16, 32] {
        let kp = k.div_ceil(depth) * depth;
        let mut ap = vec![0.0f32; m * kp];
        let mut bp = vec![0.0f32; kp * n];
        for i in 0..m {
            ap[i * kp..i * kp + k].copy_from_slice(&a[i * k..(i + 1) * k]);
        }
        bp[..k * n].copy_from_slice(&b);
        let got = matmul_chain(&ap, &bp, m, kp, n);
        let mut sign_only = 0;
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g, w);
            if g.to_bits() != w.to_bits() {
                assert!(*w == 0.0 && w.is_sign_negative() && g.is_sign_positive());
                sign_only += 1;
            }
        }
        assert!(sign_only > 0, "depth {depth}: the data should reach -0.0 somewhere");
    }
}

#[test]
fn deterministic_cpu_products_match_the_chain_bit_for_bit_and_are_batch_invariant() {
    let _mode = MODE.lock().unwrap_or_else(|p| p.into_inner());
    set_deterministic(true);
    let mut rng = StdRng::seed_from_u64(3);
    let (k, n) = (53, 19);
    let w = data(&mut rng, n * k); // (n, k) as Linear stores it
    let wt = Tensor::from_vec(w.clone(), [n, k]).unwrap().transpose(0, 1).unwrap();
    let rows = data(&mut rng, 1000 * k);
    let mut first: Option<Vec<u32>> = None;
    for batch in [1usize, 7, 32, 128, 1000] {
        let x = Tensor::from_vec(rows[..batch * k].to_vec(), [batch, k]).unwrap();
        let y = x.matmul(&wt).unwrap().to_vec_f32();
        let want = matmul_chain(&rows[..batch * k], &wt.to_vec_f32(), batch, k, n);
        assert_eq!(
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        let row0: Vec<u32> = y[..n].iter().map(|v| v.to_bits()).collect();
        match &first {
            None => first = Some(row0),
            Some(r) => assert_eq!(&row0, r, "row 0 changed with batch {batch}"),
        }
    }
    set_deterministic(false);
    let _ = DType::F32;
}

#[test]
fn typed_tier_is_the_f32_chain_rounded_once() {
    let _mode = MODE.lock().unwrap_or_else(|p| p.into_inner());
    set_deterministic(true);
    let mut rng = StdRng::seed_from_u64(4);
    let (m, k, n) = (13, 70, 9);
    for dtype in [DType::BF16, DType::F16] {
        let a32 = data(&mut rng, m * k);
        let b32 = data(&mut rng, k * n);
        let a = Tensor::from_vec(a32, [m, k]).unwrap().to_dtype(dtype).unwrap();
        let b = Tensor::from_vec(b32, [k, n]).unwrap().to_dtype(dtype).unwrap();
        let got = a.matmul(&b).unwrap();
        assert_eq!(got.dtype(), dtype);
        // upcast (exact), the f32 chain, one rounding to the storage type
        let chain = matmul_chain(&a.to_vec_f32(), &b.to_vec_f32(), m, k, n);
        let want = Tensor::from_vec(chain, [m, n]).unwrap().to_dtype(dtype).unwrap();
        assert_eq!(got.to_vec_f64(), want.to_vec_f64(), "{dtype:?}");
    }
    set_deterministic(false);
}
