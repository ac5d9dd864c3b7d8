//! Hardware probes of the asynchronous data movers: `mbarrier` phases, TMA tile loads and stores
//! (edges, swizzle, pitches TMA cannot describe) and a launch with more than 48 KB of dynamic
//! shared memory.

use crate::GpuTest;
use crate::common::{Outcome, err};
use kiln::cuda::Device;
use kiln::cuda::ops::{self, MatrixLayout};
use kiln::gpu::kernels::barrier::MbarrierPhases;
use kiln::gpu::kernels::tma_tile::{TileTransform, TmaTileTransform};
use kiln::gpu::swizzle::Swizzle;
use kiln::testing::{self, POISON_F32, Tol, compare};

/// This family's tests, in the order the suite lists them.
pub(crate) fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest { name: "gpu::mbarrier_phases", available: |d| d.supports::<MbarrierPhases>(), run: mbarrier_phases },
        GpuTest {
            name: "gpu::tma_tile_round_trip_with_edges",
            available: |d| d.supports::<TmaTileTransform>(),
            run: tma_round_trip,
        },
        GpuTest {
            name: "gpu::large_dynamic_smem_launch",
            available: |d| d.supports::<TmaTileTransform>(),
            run: large_dynamic_smem,
        },
    ]
}

fn mbarrier_phases(dev: &Device) -> Outcome {
    use kiln::cuda::LaunchConfig;
    for (threads, rounds) in [(32u32, 1u32), (128, 5), (1024, 64)] {
        let mut out = dev.upload(&vec![u32::MAX; rounds as usize]).map_err(err)?;
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 8 };
        unsafe { dev.launch(MbarrierPhases, cfg, (out.ptr_mut(), rounds)) }.map_err(err)?;
        let got = dev.download(&out).map_err(err)?;
        let want: Vec<u32> = (1..=rounds).collect();
        if got != want {
            return Err(format!("mbarrier_phases {threads} threads x {rounds} rounds: got {got:?}"));
        }
    }
    Ok(())
}

fn tma_round_trip(dev: &Device) -> Outcome {
    let (mut rng, _) = testing::rng();
    // (100, 40, 64): the box at x = 32 covers columns 32..64, of which 40..64 lie outside the tensor
    // and past the last column's 16-byte granule: the store must leave them untouched.
    let cases = [(64usize, 32usize, 32usize), (1001, 77, 80), (5, 3, 4), (130, 200, 200), (1, 1, 4), (100, 40, 64)];
    for (swizzle, (rows, cols, pitch)) in [Swizzle::None, Swizzle::B128].into_iter().flat_map(|s| cases.map(|c| (s, c)))
    {
        let t = TileTransform { alpha: 0.5, col_scale: 1.0, swizzle };
        let len = (rows - 1) * pitch + cols;
        let src = testing::uniform(&mut rng, len);
        let dsrc = dev.upload(&src).map_err(err)?;
        let mut ddst = dev.upload(&vec![POISON_F32; len]).map_err(err)?;
        let layout = MatrixLayout { rows, cols, row_pitch: pitch };
        ops::tma_tile_transform(dev, &dsrc, &mut ddst, layout, t).map_err(err)?;
        let got = dev.download(&ddst).map_err(err)?;
        for r in 0..rows {
            for c in 0..pitch {
                let i = r * pitch + c;
                if i >= len {
                    break;
                }
                if c < cols {
                    let want = t.alpha as f64 * src[i] as f64 + t.col_scale as f64 * c as f64;
                    let tol = 2.0 * f32::EPSILON as f64 * (want.abs() + 1.0);
                    compare(
                        &format!("tma {swizzle:?} {rows}x{cols} (pitch {pitch}) at row {r} col {c}"),
                        &[got[i]],
                        &[want],
                        Tol { abs: tol, rel: 0.0 },
                    )?;
                } else if c < cols.next_multiple_of(4) {
                    // A TMA store clipped at the tensor's last column can also write the padding
                    // in that column's 16-byte granule (the H200 does). Those elements are not
                    // checked.
                } else if got[i].to_bits() != POISON_F32.to_bits() {
                    return Err(format!(
                        "tma {rows}x{cols}: padding at row {r} col {c} was written ({}); the store must clip to the tensor beyond the last column's 16-byte granule",
                        got[i]
                    ));
                }
            }
        }
    }
    // A row pitch TMA cannot describe is a typed error, not a driver failure.
    let dsrc = dev.zeros::<f32>(77 * 3).map_err(err)?;
    let mut ddst = dev.zeros::<f32>(77 * 3).map_err(err)?;
    let t = TileTransform { alpha: 1.0, col_scale: 0.0, swizzle: Swizzle::B128 };
    match ops::tma_tile_transform(dev, &dsrc, &mut ddst, MatrixLayout { rows: 3, cols: 77, row_pitch: 77 }, t) {
        Err(kiln::Error::Shape { msg, .. }) if msg.contains("multiple of 16") => Ok(()),
        other => Err(format!("a 308-byte row pitch should be rejected, got {other:?}")),
    }
}

fn large_dynamic_smem(dev: &Device) -> Outcome {
    // The TMA kernel uses 8 KB; launching it with 200 KB of dynamic shared memory makes the runtime
    // raise the kernel's attribute past the 48 KB default, which must then succeed.
    use kiln::cuda::LaunchConfig;
    let spec = kiln::cuda::TensorMapSpec {
        dtype: kiln::cuda::TmaDtype::F32,
        rows: 64,
        cols: 32,
        row_pitch: 32,
        box_rows: 64,
        box_cols: 32,
        swizzle: kiln::gpu::swizzle::Swizzle::B128,
    };
    let (mut rng, _) = testing::rng();
    let src = testing::uniform(&mut rng, 64 * 32);
    let dsrc = dev.upload(&src).map_err(err)?;
    let ddst = dev.upload(&vec![POISON_F32; 64 * 32]).map_err(err)?;
    let (ms, md) = (dev.tensor_map(dsrc.addr(), &spec).map_err(err)?, dev.tensor_map(ddst.addr(), &spec).map_err(err)?);
    eprintln!("tensor maps at {:?} and {:?}, data at {:#x} and {:#x}", ms.ptr(), md.ptr(), dsrc.addr(), ddst.addr());
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 200 * 1024 };
    let t = TileTransform { alpha: 1.0, col_scale: 0.0, swizzle: Swizzle::B128 };
    unsafe { dev.launch(TmaTileTransform, cfg, (ms.ptr(), md.ptr(), t)) }.map_err(err)?;
    let got = dev.download(&ddst).map_err(err)?;
    let want: Vec<f64> = src.iter().map(|&v| v as f64).collect();
    compare("tma copy with 200 KB dynamic shared memory", &got, &want, Tol::EXACT)
}
