//! Helpers the families share: the outcome type and error text, bit patterns, host rounding of
//! 16-bit and tf32 inputs, and the f64 check of a `C = A B^T` product.

use half::{bf16, f16};
use kiln::cuda::Device;
use kiln::cuda::ops::TileProductInput;
use kiln::gpu::kernels::mma_tile::GemmShape;
use kiln::testing::{self, POISON_F32, Tol, compare};

/// A test's result: `Err` carries the failure's message.
pub(crate) type Outcome = Result<(), String>;

pub(crate) fn err(e: kiln::Error) -> String {
    e.to_string()
}

pub(crate) fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Host-side rounding of an input to the type the kernel consumes, and back to f64 exactly.
pub(crate) trait TestInput: TileProductInput {
    fn from_f32(x: f32) -> Self;
    /// The value the tensor core multiplies (tf32 inputs are rounded on the device).
    fn as_f64(self) -> f64;
    /// Relative error of one product from input rounding the reference does not model.
    const INPUT_REL: f64;
}

impl TestInput for bf16 {
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn as_f64(self) -> f64 {
        self.to_f64()
    }
    const INPUT_REL: f64 = 0.0;
}

impl TestInput for f16 {
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn as_f64(self) -> f64 {
        self.to_f64()
    }
    const INPUT_REL: f64 = 0.0;
}

impl TestInput for f32 {
    fn from_f32(x: f32) -> Self {
        x
    }
    fn as_f64(self) -> f64 {
        kiln::gpu::convert::tf32_round_host(self) as f64
    }
    // The reference uses the host model of sm_90's tf32 rounding (cvt.rn: ties to even); allow
    // one tf32 ulp per operand, since sm_80 (cvt.rna) rounds a tie away from zero.
    const INPUT_REL: f64 = 2.0 / 1024.0;
}

/// Checks `got` (m x n) against the f64 product `A B^T` of `a` (m x k) and `b` (stored n x k),
/// every output within `k 2^-22 sum_p |a_ip b_jp|`: exact products of 16-bit inputs accumulated in
/// f32 over k terms (u = 2^-24, with room for the tensor cores' internal order).
pub(crate) fn check_abt(what: &str, got: &[f32], a: &[f64], b: &[f64], (m, n, k): (usize, usize, usize)) -> Outcome {
    for i in 0..m {
        for j in 0..n {
            let (want, mag) = a[i * k..(i + 1) * k]
                .iter()
                .zip(&b[j * k..(j + 1) * k])
                .fold((0.0f64, 0.0f64), |(d, g), (x, y)| (d + x * y, g + (x * y).abs()));
            let tol = k as f64 * 2f64.powi(-22) * mag + 1e-30;
            compare(&format!("{what} at ({i}, {j})"), &[got[i * n + j]], &[want], Tol { abs: tol, rel: 0.0 })?;
        }
    }
    Ok(())
}

/// f32 values rounded to bf16 (nearest-even), as f64.
pub(crate) fn bf16_round(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| bf16::from_f32(x).to_f64()).collect()
}

/// Row-major `rows x cols` transposed to `cols x rows`.
pub(crate) fn transposed(v: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    (0..rows * cols).map(|i| v[(i % rows) * cols + i / rows]).collect()
}

pub(crate) type Buf<T> = kiln::cuda::DeviceBuffer<T>;

/// One `C = A B^T` case of a bf16 kernel: fresh random operands, the output poisoned first, `run`
/// launched, every output checked against f64 ([`check_abt`]).
pub(crate) fn bf16_abt_case(
    dev: &Device,
    rng: &mut rand::rngs::StdRng,
    s: GemmShape,
    what: &str,
    run: impl FnOnce(&Buf<bf16>, &Buf<bf16>, &mut Buf<f32>, GemmShape) -> kiln::Result<()>,
) -> Outcome {
    let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
    let a: Vec<bf16> = testing::uniform(rng, m * k).into_iter().map(bf16::from_f32).collect();
    let b: Vec<bf16> = testing::uniform(rng, n * k).into_iter().map(bf16::from_f32).collect();
    let (da, db) = (dev.upload(&a).map_err(err)?, dev.upload(&b).map_err(err)?);
    let mut dc = dev.upload(&vec![POISON_F32; m * n]).map_err(err)?;
    run(&da, &db, &mut dc, s).map_err(err)?;
    let got = dev.download(&dc).map_err(err)?;
    let (a64, b64): (Vec<f64>, Vec<f64>) =
        (a.iter().map(|x| x.to_f64()).collect(), b.iter().map(|x| x.to_f64()).collect());
    check_abt(&format!("{what} {m}x{n}x{k}"), &got, &a64, &b64, (m, n, k))
}
