//! Blackwell (sm_100a): TMEM allocation, a `tcgen05.mma` smoke test and the tcgen05 GEMM. Every
//! test here is ignored below compute capability 10.0.

use crate::GpuTest;
use crate::common::{Outcome, bf16_abt_case, err};
use half::bf16;
use kiln::cuda::Device;
use kiln::gpu::Kernel;
use kiln::gpu::kernels::mma_tile::GemmShape;
use kiln::gpu::kernels::tmem::TmemAllocRoundtrip;
use kiln::testing;

/// This family's tests, in the order the suite lists them.
pub(crate) fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest {
            name: "gpu::tmem_alloc_roundtrip_sm100",
            available: |d| d.supports::<TmemAllocRoundtrip>(),
            run: tmem_roundtrip,
        },
        GpuTest {
            name: "gpu::tmem_mma_smoke_sm100",
            available: |d| d.supports::<kiln::gpu::kernels::tmem::TmemMmaSmoke>(),
            run: tmem_mma_smoke,
        },
        GpuTest {
            name: "gpu::gemm_tcgen05_bf16_sm100",
            available: |d| d.supports::<kiln::gpu::kernels::gemm_tcgen05::GemmTcgen05Bf16>(),
            run: tcgen05_case,
        },
    ]
}

fn tmem_roundtrip(dev: &Device) -> Outcome {
    use kiln::cuda::LaunchConfig;
    let mut out = dev.upload(&[u32::MAX, 0]).map_err(err)?;
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 16 };
    unsafe { dev.launch(TmemAllocRoundtrip, cfg, (out.ptr_mut(),)) }.map_err(err)?;
    let got = dev.download(&out).map_err(err)?;
    if got[1] != 1 || got[0] == u32::MAX {
        return Err(format!("{}: expected a TMEM address and the flag 1, got {got:?}", TmemAllocRoundtrip::NAME));
    }
    Ok(())
}

fn tmem_mma_smoke(dev: &Device) -> Outcome {
    use kiln::cuda::LaunchConfig;
    let mut out = dev.upload(&[0u32]).map_err(err)?;
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 16384 + 16 };
    unsafe { dev.launch(kiln::gpu::kernels::tmem::TmemMmaSmoke, cfg, (out.ptr_mut(),)) }.map_err(err)?;
    match dev.download(&out).map_err(err)?[..] {
        [1] => Ok(()),
        ref other => Err(format!("tcgen05.mma did not complete: {other:?}")),
    }
}

/// The Blackwell GEMM (`gemm_tcgen05_bf16`) against f64 on the wgmma test's shapes (odd edges, more
/// tiles than SMs at the largest, so each CTA's accumulators alternate and their parities turn),
/// output poisoned first; k off the TMA grid refused. Skips below compute capability 10.0: it has
/// never run, as no Blackwell GPU is lent here.
fn tcgen05_case(dev: &Device) -> Outcome {
    use kiln::cuda::gemm::gemm_tcgen05;
    let (mut rng, _) = testing::rng();
    let (one, bad) = (dev.upload(&vec![bf16::ONE; 64 * 12]).map_err(err)?, GemmShape { m: 64, n: 64, k: 12 });
    let mut c = dev.upload(&vec![0f32; 64 * 64]).map_err(err)?;
    if gemm_tcgen05(dev, &one, &one, &mut c, bad).is_ok() {
        return Err("k = 12 must be refused (TMA needs 16-byte row pitches)".into());
    }
    for &(m, n, k) in
        &[(128u32, 256u32, 64u32), (1, 1, 8), (256, 384, 512), (1000, 130, 264), (129, 257, 72), (4100, 2100, 200)]
    {
        bf16_abt_case(dev, &mut rng, GemmShape { m, n, k }, "tcgen05", |a, b, c, s| gemm_tcgen05(dev, a, b, c, s))?;
    }
    Ok(())
}
