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

#[test]
fn zero_padding_cannot_change_a_chain_that_starts_at_plus_zero() {
    // The GPU kernels pad k with zeros to their tile depth; the chain's bits must not notice.
    let mut rng = StdRng::seed_from_u64(2);
    for trial in 0..20_000 {
        let k = 1 + trial % 40;
        let (a, b) = (data(&mut rng, k), data(&mut rng, k));
        let mut acc = 0.0f32;
        for p in 0..k {
            acc = a[p].mul_add(b[p], acc);
        }
        assert!(!(acc == 0.0 && acc.is_sign_negative()), "a chain from +0.0 reached -0.0");
        let padded = 0.0f32.mul_add(0.0, acc);
        let padded_neg = (-0.0f32).mul_add(0.0, acc);
        assert_eq!(padded.to_bits(), acc.to_bits());
        assert_eq!(padded_neg.to_bits(), acc.to_bits());
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
