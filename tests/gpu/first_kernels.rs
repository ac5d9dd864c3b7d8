//! The first kernels (the guide's level 0): `vector_add`, `reduce_sum` and the `mma.sync` tile
//! product, each against a CPU reference, with the typed errors of bad shapes.

use crate::common::{Outcome, TestInput, err};
use crate::{GpuTest, any};
use half::{bf16, f16};
use kiln::cuda::Device;
use kiln::cuda::ops;
use kiln::gpu::kernels::mma_tile::GemmShape;
use kiln::testing::{self, POISON_F32, Tol, compare};

/// This family's tests, in the order the suite lists them.
pub(crate) fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest { name: "gpu::vector_add_matches_cpu", available: any, run: vector_add_matches_cpu },
        GpuTest { name: "gpu::reduce_sum_matches_f64_and_is_deterministic", available: any, run: reduce_sum },
        GpuTest { name: "gpu::mma_tile_bf16", available: any, run: mma_tile::<bf16> },
        GpuTest { name: "gpu::mma_tile_f16", available: any, run: mma_tile::<f16> },
        GpuTest { name: "gpu::mma_tile_tf32", available: any, run: mma_tile::<f32> },
        GpuTest { name: "gpu::mma_tile_rejects_bad_shapes", available: any, run: mma_tile_rejects_bad_shapes },
    ]
}

pub(crate) fn vector_add_matches_cpu(dev: &Device) -> Outcome {
    let (mut rng, _) = testing::rng();
    for n in [1usize, 7, 1000, (1 << 20) + 3] {
        let a = testing::uniform(&mut rng, n);
        let b = testing::uniform(&mut rng, n);
        let (da, db) = (dev.upload(&a).map_err(err)?, dev.upload(&b).map_err(err)?);
        let mut out = dev.upload(&vec![POISON_F32; n]).map_err(err)?;
        ops::vector_add(dev, &da, &db, &mut out).map_err(err)?;
        let got = dev.download(&out).map_err(err)?;
        // f32 addition is correctly rounded on both sides: the CPU result is the exact reference.
        let want: Vec<f64> = a.iter().zip(&b).map(|(x, y)| (x + y) as f64).collect();
        compare(&format!("vector_add n={n}"), &got, &want, Tol::EXACT)?;
    }
    let (da, db) = (dev.upload(&[1.0f32; 4]).map_err(err)?, dev.upload(&[1.0f32; 3]).map_err(err)?);
    let mut out = dev.zeros::<f32>(4).map_err(err)?;
    match ops::vector_add(dev, &da, &db, &mut out) {
        Err(kiln::Error::Shape { op: "vector_add", .. }) => Ok(()),
        other => Err(format!("mismatched lengths should be a Shape error, got {other:?}")),
    }
}

fn reduce_sum(dev: &Device) -> Outcome {
    let (mut rng, _) = testing::rng();
    for n in [1usize, 31, 257, 100_000, 3_000_017] {
        let x = testing::uniform(&mut rng, n);
        let dx = dev.upload(&x).map_err(err)?;
        let got = ops::sum(dev, &dx).map_err(err)?;
        let again = ops::sum(dev, &dx).map_err(err)?;
        if got.to_bits() != again.to_bits() {
            return Err(format!("sum n={n} is not deterministic: {got:e} then {again:e}"));
        }
        let want: f64 = x.iter().map(|&v| v as f64).sum();
        let abs: f64 = x.iter().map(|&v| v.abs() as f64).sum();
        // Each thread adds at most ceil(n / threads) terms in sequence, then two 5-level trees
        // and a second pass add ~20 more: error <= (terms + 20) * eps * sum|x|.
        let threads = (256 * n.div_ceil(256).min(ops::MAX_GRID_STRIDE_BLOCKS as usize)) as f64;
        let terms = (n as f64 / threads).ceil() + 20.0;
        compare(&format!("sum n={n}"), &[got], &[want], Tol { abs: terms * f32::EPSILON as f64 * abs, rel: 0.0 })?;
    }
    Ok(())
}

fn mma_tile<T: TestInput>(dev: &Device) -> Outcome {
    let (mut rng, _) = testing::rng();
    let shapes: &[(u32, u32, u32)] = &[(16, 8, 16), (1, 1, 8), (7, 13, 40), (33, 17, 64), (127, 129, 200), (5, 9, 12)];
    for &(m, n, k) in shapes {
        if k % T::K_MULTIPLE != 0 {
            continue;
        }
        let a: Vec<T> = testing::uniform(&mut rng, (m * k) as usize).into_iter().map(T::from_f32).collect();
        let b: Vec<T> = testing::uniform(&mut rng, (n * k) as usize).into_iter().map(T::from_f32).collect();
        let (da, db) = (dev.upload(&a).map_err(err)?, dev.upload(&b).map_err(err)?);
        let mut dc = dev.upload(&vec![POISON_F32; (m * n) as usize]).map_err(err)?;
        ops::mma_tile(dev, &da, &db, &mut dc, GemmShape { m, n, k }).map_err(err)?;
        let got = dev.download(&dc).map_err(err)?;
        let (mut want, mut bound) = (Vec::new(), Vec::new());
        for i in 0..m as usize {
            for j in 0..n as usize {
                let (mut s, mut mag) = (0.0f64, 0.0f64);
                for p in 0..k as usize {
                    let prod = a[i * k as usize + p].as_f64() * b[j * k as usize + p].as_f64();
                    s += prod;
                    mag += prod.abs();
                }
                want.push(s);
                // f32 accumulation over k terms: k * 2^-23 * sum|a b|, plus input rounding.
                bound.push((k as f64 * 2f64.powi(-23) + T::INPUT_REL) * mag + 1e-30);
            }
        }
        for (idx, (&g, (&w, &t))) in got.iter().zip(want.iter().zip(&bound)).enumerate() {
            compare(
                &format!("mma_tile<{}> {m}x{n}x{k} element {idx}", std::any::type_name::<T>()),
                &[g],
                &[w],
                Tol { abs: t, rel: 0.0 },
            )?;
        }
    }
    Ok(())
}

fn mma_tile_rejects_bad_shapes(dev: &Device) -> Outcome {
    let a = dev.zeros::<bf16>(16 * 12).map_err(err)?;
    let mut c = dev.zeros::<f32>(16 * 16).map_err(err)?;
    match ops::mma_tile(dev, &a, &a, &mut c, GemmShape { m: 16, n: 16, k: 12 }) {
        Err(kiln::Error::Shape { op: "mma_tile", msg }) if msg.contains("multiple of 8") => {}
        other => return Err(format!("k = 12 with bf16 should be rejected, got {other:?}")),
    }
    match ops::mma_tile(dev, &a, &a, &mut c, GemmShape { m: 16, n: 16, k: 16 }) {
        Err(kiln::Error::Shape { op: "mma_tile", .. }) => Ok(()),
        other => Err(format!("wrong buffer sizes should be rejected, got {other:?}")),
    }
}
