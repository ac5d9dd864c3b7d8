//! The flash attention forward kernels against the f64 reference (`kiln::attention`): every kernel
//! of the table (the Hopper rung `flash_fwd_wgmma_*` only on sm_90a), head dims 64 and 128, lengths 1, 17, 129 and 1000, query and key lengths that
//! differ both ways, causal and not, fresh random inputs, outputs poisoned (NaN) before each
//! launch; the same bits on a repeated launch; typed refusals. The backward (CUDA cores, f32 and
//! bf16; `mma.sync`, bf16 and f16) against the f64 reference's gradients (dQ, dK, dV poisoned,
//! lengths 1, 17, 129 and 1000, unequal both ways, head dims 64 and 128, causal and not), and the
//! same bits on a repeat (for the best kernel of the dtype the repeat goes through
//! `flash_backward`'s dispatch, so it also checks the pick). The Hopper backward
//! (`flash_bwd_*_wgmma_*`, sm_90a only) the same way, from the `mma.sync` forward's O and
//! log-sum-exp, plus its refusals. Backward tolerances:
//! `kiln::tools::attention::backward_tolerance`, relative to each gradient's largest element.
//!
//! Tolerances are `kiln::tools::attention::forward_bound`'s (the error analysis in its docs): on
//! inputs rounded to the kernel's dtype (the reference sees the rounded values), f32 scores and
//! sums, P rounded to bf16 / f16 before `P V` on `mma.sync`, and the output rounded to the dtype.

use crate::common::{Outcome, err};
use crate::{GpuTest, any};
use half::{bf16, f16};
use kiln::attention::{self as reference, AttentionParams};
use kiln::cuda::Device;
use kiln::cuda::attention::{
    AttentionShape, FLASH_KERNELS, FlashBwdKernel, FlashElement, FlashEntry, FlashKernel, flash_backward,
    flash_backward_kernel, flash_backward_with, flash_forward, flash_forward_blocks,
};
use kiln::testing::{self, POISON_F32, Tol, compare};
use kiln::{DType, Error};

pub(crate) fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest {
            name: "gpu::flash_fwd_simt_f32_matches_f64",
            available: any,
            run: |d| matches_f64(d, "flash_fwd_simt_f32"),
        },
        GpuTest {
            name: "gpu::flash_fwd_simt_bf16_matches_f64",
            available: any,
            run: |d| matches_f64(d, "flash_fwd_simt_bf16"),
        },
        GpuTest {
            name: "gpu::flash_fwd_mma_bf16_matches_f64",
            available: any,
            run: |d| matches_f64(d, "flash_fwd_mma_bf16"),
        },
        GpuTest {
            name: "gpu::flash_fwd_mma_f16_matches_f64",
            available: any,
            run: |d| matches_f64(d, "flash_fwd_mma_f16"),
        },
        GpuTest {
            name: "gpu::flash_fwd_wgmma_bf16_matches_f64_sm90",
            available: hopper,
            run: |d| matches_f64(d, "flash_fwd_wgmma_bf16"),
        },
        GpuTest {
            name: "gpu::flash_fwd_wgmma_f16_matches_f64_sm90",
            available: hopper,
            run: |d| matches_f64(d, "flash_fwd_wgmma_f16"),
        },
        GpuTest {
            name: "gpu::flash_fwd_wgmma2_bf16_matches_f64_sm90",
            available: hopper,
            run: |d| matches_f64(d, "flash_fwd_wgmma2_bf16"),
        },
        GpuTest {
            name: "gpu::flash_fwd_wgmma2_f16_matches_f64_sm90",
            available: hopper,
            run: |d| matches_f64(d, "flash_fwd_wgmma2_f16"),
        },
        GpuTest {
            name: "gpu::flash_fwd_wgmma_bf16_persistent_matches_f64_sm90",
            available: hopper,
            run: |d| persistent_matches_f64(d, "flash_fwd_wgmma_bf16"),
        },
        GpuTest {
            name: "gpu::flash_fwd_wgmma2_bf16_persistent_matches_f64_sm90",
            available: hopper,
            run: |d| persistent_matches_f64(d, "flash_fwd_wgmma2_bf16"),
        },
        GpuTest {
            name: "gpu::flash_fwd_wgmma2_f16_persistent_matches_f64_sm90",
            available: hopper,
            run: |d| persistent_matches_f64(d, "flash_fwd_wgmma2_f16"),
        },
        GpuTest {
            name: "gpu::flash_fwd_wgmma_pp_bf16_matches_f64_sm90",
            available: hopper,
            run: |d| matches_f64(d, "flash_fwd_wgmma_pp_bf16"),
        },
        GpuTest {
            name: "gpu::flash_fwd_wgmma_pp_f16_matches_f64_sm90",
            available: hopper,
            run: |d| matches_f64(d, "flash_fwd_wgmma_pp_f16"),
        },
        GpuTest { name: "gpu::flash_fwd_wgmma_pp_refused_off_sm90", available: any, run: wgmma_pp_refusals },
        GpuTest { name: "gpu::flash_fwd_wgmma_refusals", available: any, run: wgmma_refusals },
        GpuTest { name: "gpu::flash_forward_same_bits_on_repeat", available: any, run: same_bits },
        GpuTest {
            name: "gpu::flash_bwd_simt_f32_matches_f64",
            available: any,
            run: |d| backward_case::<f32>(d, FlashKernel::Simt, FlashBwdKernel::Simt),
        },
        GpuTest {
            name: "gpu::flash_bwd_simt_bf16_matches_f64",
            available: any,
            run: |d| backward_case::<bf16>(d, FlashKernel::Simt, FlashBwdKernel::Simt),
        },
        GpuTest {
            name: "gpu::flash_bwd_mma_bf16_matches_f64",
            available: any,
            run: |d| backward_case::<bf16>(d, FlashKernel::MmaSync, FlashBwdKernel::MmaSync),
        },
        GpuTest {
            name: "gpu::flash_bwd_mma_f16_matches_f64",
            available: any,
            run: |d| backward_case::<f16>(d, FlashKernel::MmaSync, FlashBwdKernel::MmaSync),
        },
        GpuTest {
            name: "gpu::flash_bwd_wgmma_bf16_matches_f64_sm90",
            available: hopper_bwd,
            run: |d| backward_case::<bf16>(d, FlashKernel::MmaSync, FlashBwdKernel::Wgmma),
        },
        GpuTest {
            name: "gpu::flash_bwd_wgmma_f16_matches_f64_sm90",
            available: hopper_bwd,
            run: |d| backward_case::<f16>(d, FlashKernel::MmaSync, FlashBwdKernel::Wgmma),
        },
        GpuTest {
            name: "gpu::flash_bwd_wgmma2_bf16_matches_f64_sm90",
            available: hopper_bwd,
            run: |d| backward_case::<bf16>(d, FlashKernel::MmaSync, FlashBwdKernel::Wgmma2),
        },
        GpuTest {
            name: "gpu::flash_bwd_wgmma2_f16_matches_f64_sm90",
            available: hopper_bwd,
            run: |d| backward_case::<f16>(d, FlashKernel::MmaSync, FlashBwdKernel::Wgmma2),
        },
        GpuTest { name: "gpu::flash_bwd_wgmma_refusals", available: any, run: wgmma_bwd_refusals },
        GpuTest { name: "gpu::flash_forward_refuses_with_typed_errors", available: any, run: refusals },
        GpuTest { name: "gpu::attention_command_runs_every_kernel", available: any, run: command },
    ]
}

/// Whether the device runs the Hopper rung (`flash_fwd_wgmma_*`, sm_90a module only).
fn hopper(d: &Device) -> bool {
    d.supports::<kiln::gpu::kernels::flash_wgmma::FlashFwdWgmmaBf16D64>()
}

/// Whether the device runs the Hopper backward (`flash_bwd_*_wgmma*_*`, sm_90a module only).
fn hopper_bwd(d: &Device) -> bool {
    d.supports::<kiln::gpu::kernels::flash_bwd_wgmma::FlashBwdDkdvWgmmaBf16D64>()
}

/// The Hopper backwards' (`Wgmma`, `Wgmma2`) refusals: off sm_90a a typed error that names the module and what to use;
/// on sm_90a a dtype it does not take (f32) and a head dim it is not built for.
fn wgmma_bwd_refusals(dev: &Device) -> Outcome {
    for kernel in [FlashBwdKernel::Wgmma, FlashBwdKernel::Wgmma2] {
        wgmma_bwd_refuses(dev, kernel)?;
    }
    Ok(())
}

fn wgmma_bwd_refuses(dev: &Device, kernel: FlashBwdKernel) -> Outcome {
    let s = AttentionShape { batch: 1, heads: 2, q_len: 17, kv_len: 33, head_dim: 64 };
    let zeros = |n: usize| dev.zeros::<bf16>(n).map_err(err);
    let lse = dev.zeros::<f32>(s.lse_elems()).map_err(err)?;
    let (q, k) = (zeros(s.q_elems())?, zeros(s.kv_elems())?);
    let (mut dq, mut dk, mut dv) = (zeros(s.q_elems())?, zeros(s.kv_elems())?, zeros(s.kv_elems())?);
    let r = flash_backward_with(dev, kernel, (&q, &k, &k, &q, &q), &lse, (&mut dq, &mut dk, &mut dv), s, false, 0.125);
    if !hopper_bwd(dev) {
        return match r {
            Err(Error::Unsupported { what, .. }) if what.contains("sm_90a") && what.contains("MmaSync") => Ok(()),
            other => Err(format!("the {kernel:?} backward off sm_90a gave {other:?}")),
        };
    }
    r.map_err(err)?;
    let fz = |n: usize| dev.zeros::<f32>(n).map_err(err);
    let (qf, kf) = (fz(s.q_elems())?, fz(s.kv_elems())?);
    let (mut dqf, mut dkf, mut dvf) = (fz(s.q_elems())?, fz(s.kv_elems())?, fz(s.kv_elems())?);
    match flash_backward_with(
        dev,
        kernel,
        (&qf, &kf, &kf, &qf, &qf),
        &lse,
        (&mut dqf, &mut dkf, &mut dvf),
        s,
        false,
        0.125,
    ) {
        Err(Error::Unsupported { what, .. }) if what.contains("flash_fwd_simt_f32") => {}
        other => return Err(format!("the {kernel:?} backward on f32 gave {other:?}")),
    }
    let s96 = AttentionShape { head_dim: 96, ..s };
    let (q96, k96) = (zeros(s96.q_elems())?, zeros(s96.kv_elems())?);
    let (mut dq96, mut dk96, mut dv96) = (zeros(s96.q_elems())?, zeros(s96.kv_elems())?, zeros(s96.kv_elems())?);
    match flash_backward_with(
        dev,
        kernel,
        (&q96, &k96, &k96, &q96, &q96),
        &lse,
        (&mut dq96, &mut dk96, &mut dv96),
        s96,
        true,
        0.1,
    ) {
        Err(Error::Unsupported { what, .. }) if what.contains("head dim 96") => {}
        other => return Err(format!("the {kernel:?} backward at head dim 96 gave {other:?}")),
    }
    Ok(())
}

/// Whether the device runs the table entry `e` (the Hopper rung only on sm_90a).
fn runs(d: &Device, e: &FlashEntry) -> bool {
    !e.kernel.is_hopper() || hopper(d)
}

/// The Hopper rung's refusals: off sm_90a a typed error that names the device's module and what to
/// use; on sm_90a a dtype it does not take (f32) and a head dim it is not built for.
fn wgmma_refusals(dev: &Device) -> Outcome {
    let s = AttentionShape { batch: 1, heads: 2, q_len: 17, kv_len: 33, head_dim: 64 };
    let mut lse = dev.zeros::<f32>(s.lse_elems()).map_err(err)?;
    let (q, k) = (dev.zeros::<bf16>(s.q_elems()).map_err(err)?, dev.zeros::<bf16>(s.kv_elems()).map_err(err)?);
    let mut o = dev.zeros::<bf16>(s.q_elems()).map_err(err)?;
    let r = flash_forward(dev, FlashKernel::Wgmma, &q, &k, &k, &mut o, &mut lse, s, false, 0.125);
    if !hopper(dev) {
        return match r {
            Err(Error::Unsupported { what, .. }) if what.contains("sm_90a") && what.contains("MmaSync") => Ok(()),
            other => Err(format!("Wgmma off sm_90a gave {other:?}")),
        };
    }
    r.map_err(err)?;
    let (qf, kf) = (dev.zeros::<f32>(s.q_elems()).map_err(err)?, dev.zeros::<f32>(s.kv_elems()).map_err(err)?);
    let mut of = dev.zeros::<f32>(s.q_elems()).map_err(err)?;
    match flash_forward(dev, FlashKernel::Wgmma, &qf, &kf, &kf, &mut of, &mut lse, s, false, 0.125) {
        Err(Error::Unsupported { what, .. }) if what.contains("flash_fwd_simt_f32") => {}
        other => return Err(format!("Wgmma on f32 gave {other:?}")),
    }
    let s96 = AttentionShape { head_dim: 96, ..s };
    let (q, k) = (dev.zeros::<bf16>(s96.q_elems()).map_err(err)?, dev.zeros::<bf16>(s96.kv_elems()).map_err(err)?);
    let mut o = dev.zeros::<bf16>(s96.q_elems()).map_err(err)?;
    match flash_forward(dev, FlashKernel::Wgmma, &q, &k, &k, &mut o, &mut lse, s96, true, 0.1) {
        Err(Error::Unsupported { what, .. }) if what.contains("head dim 96") => Ok(()),
        other => Err(format!("Wgmma at head dim 96 gave {other:?}")),
    }
}

/// The ping-pong kernel off sm_90a: a typed error that names the module and what to use; on sm_90a
/// it runs a small causal problem (two consumers, one of them past the last query row).
fn wgmma_pp_refusals(dev: &Device) -> Outcome {
    let s = AttentionShape { batch: 1, heads: 2, q_len: 17, kv_len: 33, head_dim: 128 };
    let mut lse = dev.zeros::<f32>(s.lse_elems()).map_err(err)?;
    let (q, k) = (dev.zeros::<f16>(s.q_elems()).map_err(err)?, dev.zeros::<f16>(s.kv_elems()).map_err(err)?);
    let mut o = dev.zeros::<f16>(s.q_elems()).map_err(err)?;
    let r = flash_forward(dev, FlashKernel::WgmmaPingPong, &q, &k, &k, &mut o, &mut lse, s, true, 0.125);
    match (hopper(dev), r) {
        (true, r) => r.map_err(err),
        (false, Err(Error::Unsupported { what, .. })) if what.contains("sm_90a") && what.contains("MmaSync") => Ok(()),
        (false, other) => Err(format!("WgmmaPingPong off sm_90a gave {other:?}")),
    }
}

/// Host rounding to the kernel's element type and back, and its NaN poison.
trait Elem: FlashElement {
    fn from_f32(x: f32) -> Self;
    fn to_f64(self) -> f64;
    const POISON: Self;
}
impl Elem for f32 {
    fn from_f32(x: f32) -> Self {
        x
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    const POISON: Self = POISON_F32;
}
impl Elem for bf16 {
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    const POISON: Self = bf16::from_bits(0xffff);
}
impl Elem for f16 {
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    const POISON: Self = f16::from_bits(0xffff);
}

/// (q_len, kv_len): the lengths the issue names, equal and unequal both ways.
const LENGTHS: &[(u32, u32)] =
    &[(1, 1), (17, 17), (129, 129), (1000, 1000), (17, 129), (129, 17), (1, 1000), (1000, 129)];

/// The inputs rounded to `T` (device buffers and their f64 values), and O and the log-sum-exp
/// read back from one launch into poisoned outputs.
struct Run {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    o: Vec<f64>,
    lse: Vec<f32>,
}

fn launch<T: Elem>(
    dev: &Device,
    kernel: FlashKernel,
    s: AttentionShape,
    (causal, blocks): (bool, Option<u32>),
    rng: &mut rand::rngs::StdRng,
) -> Result<Run, String> {
    let round = |n: usize, rng: &mut rand::rngs::StdRng| -> Vec<T> {
        testing::uniform(rng, n).into_iter().map(T::from_f32).collect()
    };
    let (qh, kh, vh) = (round(s.q_elems(), rng), round(s.kv_elems(), rng), round(s.kv_elems(), rng));
    let (q, k, v) = (dev.upload(&qh).map_err(err)?, dev.upload(&kh).map_err(err)?, dev.upload(&vh).map_err(err)?);
    let mut o = dev.upload(&vec![T::POISON; s.q_elems()]).map_err(err)?;
    let mut lse = dev.upload(&vec![POISON_F32; s.lse_elems()]).map_err(err)?;
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    flash_forward_blocks(dev, kernel, &q, &k, &v, &mut o, &mut lse, s, causal, scale, blocks).map_err(err)?;
    let wide = |x: &[T]| -> Vec<f64> { x.iter().map(|&e| e.to_f64()).collect() };
    let o = dev.download(&o).map_err(err)?;
    Ok(Run { q: wide(&qh), k: wide(&kh), v: wide(&vh), o: wide(&o), lse: dev.download(&lse).map_err(err)? })
}

fn run_entry(
    dev: &Device,
    e: FlashEntry,
    s: AttentionShape,
    causal: bool,
    rng: &mut rand::rngs::StdRng,
) -> Result<Run, String> {
    run_entry_blocks(dev, e, s, (causal, None), rng)
}

/// [`run_entry`] on a chosen number of blocks (the Hopper forwards; `None`: the default).
fn run_entry_blocks(
    dev: &Device,
    e: FlashEntry,
    s: AttentionShape,
    launch_as: (bool, Option<u32>),
    rng: &mut rand::rngs::StdRng,
) -> Result<Run, String> {
    match e.dtype {
        DType::F32 => launch::<f32>(dev, e.kernel, s, launch_as, rng),
        DType::BF16 => launch::<bf16>(dev, e.kernel, s, launch_as, rng),
        DType::F16 => launch::<f16>(dev, e.kernel, s, launch_as, rng),
        DType::F64 => Err("no f64 kernel".into()),
    }
}

/// Checks one run against the f64 reference: O within the bound everywhere, the log-sum-exp
/// within its bound, and exactly `-inf` on rows that see no key.
fn check(what: &str, e: FlashEntry, p: &AttentionParams, r: &Run) -> Outcome {
    let want = reference::forward(p, &r.q, &r.k, &r.v);
    let (o_bound, lse_bound) = kiln::tools::attention::forward_bound(e.kernel, e.dtype, p);
    let o32: Vec<f32> = r.o.iter().map(|&x| x as f32).collect();
    compare(&format!("{what}: O"), &o32, &want.o, Tol { abs: o_bound, rel: 0.0 })?;
    for (i, (&got, &w)) in r.lse.iter().zip(&want.lse).enumerate() {
        if w == f64::NEG_INFINITY {
            if got != f32::NEG_INFINITY {
                return Err(format!("{what}: lse[{i}] = {got:e} for a row that sees no key (expected -inf)"));
            }
        } else {
            compare(&format!("{what}: lse[{i}]"), &[got], &[w], Tol { abs: lse_bound, rel: 0.0 })?;
        }
    }
    Ok(())
}

fn matches_f64(dev: &Device, name: &str) -> Outcome {
    cases_match_f64(dev, name, |_| None)
}

/// The Hopper forwards run persistent: on 1, 3 and 7 blocks for problems of up to 64 query tiles,
/// so that each block walks many tiles of several heads (the Q buffers and the K/V ring carrying
/// on from tile to tile, the causal tiles of unequal length), every length pair, both head dims,
/// causal and not, against the f64 reference on poisoned outputs.
fn persistent_matches_f64(dev: &Device, name: &str) -> Outcome {
    cases_match_f64(dev, name, |case| Some([1, 3, 7][case % 3]))
}

/// Kernel `name` on every length pair of [`LENGTHS`], both head dims, causal and not, against the
/// f64 reference; `blocks(case)`: the block count of the case-th launch (`None`: the default).
fn cases_match_f64(dev: &Device, name: &str, blocks: impl Fn(usize) -> Option<u32>) -> Outcome {
    let e = kiln::cuda::attention::flash_entry(name).map_err(err)?;
    let (mut rng, seed) = testing::rng();
    let mut cases = 0;
    for &d in &[64u32, 128] {
        for &(sq, skv) in LENGTHS {
            for causal in [false, true] {
                // several heads and batches where the reference stays cheap
                let (batch, heads) = if sq.max(skv) >= 1000 { (1, 2) } else { (2, 3) };
                let s = AttentionShape { batch, heads, q_len: sq, kv_len: skv, head_dim: d };
                let p = s.params(causal, 1.0 / (d as f32).sqrt());
                let b = blocks(cases);
                let r = run_entry_blocks(dev, e, s, (causal, b), &mut rng)?;
                let on = b.map(|b| format!(" on {b} blocks")).unwrap_or_default();
                check(&format!("{name} {s:?} causal {causal}{on} (seed {seed})"), e, &p, &r)?;
                cases += 1;
            }
        }
    }
    if cases != 2 * LENGTHS.len() * 2 {
        return Err(format!("{cases} cases ran"));
    }
    Ok(())
}

fn same_bits(dev: &Device) -> Outcome {
    let (mut rng, seed) = testing::rng();
    for e in FLASH_KERNELS.iter().filter(|e| runs(dev, e)) {
        for d in [64u32, 128] {
            let s = AttentionShape { batch: 2, heads: 3, q_len: 129, kv_len: 200, head_dim: d };
            // the same inputs twice: a generator cloned before each launch
            let mut again = rng.clone();
            let a = run_entry(dev, *e, s, true, &mut rng)?;
            let b = run_entry(dev, *e, s, true, &mut again)?;
            let bits = |x: &[f64]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            let lbits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            if a.q != b.q || bits(&a.o) != bits(&b.o) || lbits(&a.lse) != lbits(&b.lse) {
                return Err(format!("{} d {d}: a repeated launch gave different bits (seed {seed})", e.name));
            }
        }
    }
    Ok(())
}

fn refusals(dev: &Device) -> Outcome {
    let s = AttentionShape { batch: 1, heads: 2, q_len: 17, kv_len: 33, head_dim: 64 };
    let mut lse = dev.zeros::<f32>(s.lse_elems()).map_err(err)?;
    // a dtype the kernel does not take
    let (q, k) = (dev.zeros::<f32>(s.q_elems()).map_err(err)?, dev.zeros::<f32>(s.kv_elems()).map_err(err)?);
    let mut o = dev.zeros::<f32>(s.q_elems()).map_err(err)?;
    match flash_forward(dev, FlashKernel::MmaSync, &q, &k, &k, &mut o, &mut lse, s, false, 0.125) {
        Err(Error::Unsupported { what, .. }) if what.contains("flash_fwd_simt_f32") => {}
        other => return Err(format!("MmaSync on f32 gave {other:?}")),
    }
    let (qh, kh) = (dev.zeros::<f16>(s.q_elems()).map_err(err)?, dev.zeros::<f16>(s.kv_elems()).map_err(err)?);
    let mut oh = dev.zeros::<f16>(s.q_elems()).map_err(err)?;
    match flash_forward(dev, FlashKernel::Simt, &qh, &kh, &kh, &mut oh, &mut lse, s, false, 0.125) {
        Err(Error::Unsupported { what, .. }) if what.contains("flash_fwd_mma_f16") => {}
        other => return Err(format!("Simt on f16 gave {other:?}")),
    }
    // the backward: MmaSync refuses f32, Simt refuses f16 (each naming what to use)
    let (mut dq, mut dk) = (dev.zeros::<f16>(s.q_elems()).map_err(err)?, dev.zeros::<f16>(s.kv_elems()).map_err(err)?);
    let mut dv = dev.zeros::<f16>(s.kv_elems()).map_err(err)?;
    match flash_backward_with(
        dev,
        FlashBwdKernel::Simt,
        (&qh, &kh, &kh, &qh, &qh),
        &lse,
        (&mut dq, &mut dk, &mut dv),
        s,
        false,
        0.1,
    ) {
        Err(Error::Unsupported { what, .. }) if what.contains("flash_fwd_mma_f16") => {}
        other => return Err(format!("the Simt backward on f16 gave {other:?}")),
    }
    let (mut dq, mut dk) = (dev.zeros::<f32>(s.q_elems()).map_err(err)?, dev.zeros::<f32>(s.kv_elems()).map_err(err)?);
    let mut dv = dev.zeros::<f32>(s.kv_elems()).map_err(err)?;
    match flash_backward_with(
        dev,
        FlashBwdKernel::MmaSync,
        (&q, &k, &k, &o, &q),
        &lse,
        (&mut dq, &mut dk, &mut dv),
        s,
        false,
        0.1,
    ) {
        Err(Error::Unsupported { what, .. }) if what.contains("flash_fwd_simt_f32") => {}
        other => return Err(format!("the MmaSync backward on f32 gave {other:?}")),
    }
    // a head dim no kernel is built for
    let s96 = AttentionShape { head_dim: 96, ..s };
    let (q, k) = (dev.zeros::<bf16>(s96.q_elems()).map_err(err)?, dev.zeros::<bf16>(s96.kv_elems()).map_err(err)?);
    let mut o = dev.zeros::<bf16>(s96.q_elems()).map_err(err)?;
    for kernel in [FlashKernel::Simt, FlashKernel::MmaSync] {
        match flash_forward(dev, kernel, &q, &k, &k, &mut o, &mut lse, s96, true, 0.1) {
            Err(Error::Unsupported { what, .. }) if what.contains("head dim 96") => {}
            other => return Err(format!("{kernel:?} at head dim 96 gave {other:?}")),
        }
    }
    // buffers of the wrong size
    match flash_forward(dev, FlashKernel::MmaSync, &q, &k, &k, &mut o, &mut lse, s, true, 0.1) {
        Err(Error::Shape { .. }) => Ok(()),
        other => Err(format!("mismatched buffers gave {other:?}")),
    }
}

fn command(dev: &Device) -> Outcome {
    let s = AttentionShape { batch: 2, heads: 2, q_len: 129, kv_len: 200, head_dim: 64 };
    for e in FLASH_KERNELS.iter().filter(|e| runs(dev, e)) {
        for causal in [false, true] {
            // every rung runs the backward `kiln attention --backward` pairs with it too, checked
            // against the f64 reference
            let bwd = FlashBwdKernel::of_forward(e.kernel);
            let r = kiln::tools::attention::run(dev, e.name, s, causal, 2, 7, Some(bwd), None)
                .map_err(|x| format!("{}: {x}", e.name))?;
            let bwd_checked = r.backward.as_ref().is_some_and(|b| b.errors.is_some() && b.kernel == bwd);
            if !r.passed() || r.rows_checked != 2 * 2 * 129 || r.tflops.is_nan() || r.tflops <= 0.0 {
                return Err(format!("{r}"));
            }
            if !bwd_checked {
                return Err(format!("backward {bwd:?} not run and checked: {r}"));
            }
        }
    }
    match kiln::tools::attention::run(dev, "flash_fwd_nope", s, false, 1, 7, None, None) {
        Err(Error::Unsupported { .. }) => Ok(()),
        other => Err(format!("an unknown kernel gave {other:?}")),
    }
}

fn backward_case<T: Elem>(dev: &Device, fwd: FlashKernel, bwd: FlashBwdKernel) -> Outcome {
    let (mut rng, seed) = testing::rng();
    let lengths: &[(u32, u32)] =
        &[(1, 1), (17, 17), (129, 129), (1000, 1000), (17, 129), (129, 17), (1, 1000), (1000, 200)];
    let best = flash_backward_kernel(T::DTYPE, 64, dev.arch()) == Some(bwd);
    // the tolerances and their reasoning: `kiln::tools::attention::backward_tolerance`
    let (elem_tol, l2_tol) = kiln::tools::attention::backward_tolerance(T::DTYPE);
    for &d in &[64u32, 128] {
        for &(sq, skv) in lengths {
            for causal in [false, true] {
                let (batch, heads) = if sq.max(skv) >= 1000 { (1, 2) } else { (2, 3) };
                let s = AttentionShape { batch, heads, q_len: sq, kv_len: skv, head_dim: d };
                let scale = 1.0 / (d as f32).sqrt();
                let what = format!("backward {bwd:?} {:?} {s:?} causal {causal} (seed {seed})", T::DTYPE);
                let make = |n: usize, rng: &mut rand::rngs::StdRng| -> Vec<T> {
                    testing::uniform(rng, n).into_iter().map(T::from_f32).collect()
                };
                let (qh, kh, vh, doh) = (
                    make(s.q_elems(), &mut rng),
                    make(s.kv_elems(), &mut rng),
                    make(s.kv_elems(), &mut rng),
                    make(s.q_elems(), &mut rng),
                );
                let up = |x: &[T]| dev.upload(x).map_err(err);
                let (q, k, v, d_o) = (up(&qh)?, up(&kh)?, up(&vh)?, up(&doh)?);
                let mut o = up(&vec![T::POISON; s.q_elems()])?;
                let mut lse = dev.upload(&vec![POISON_F32; s.lse_elems()]).map_err(err)?;
                flash_forward(dev, fwd, &q, &k, &v, &mut o, &mut lse, s, causal, scale).map_err(err)?;
                let mut grads = Vec::new();
                for rep in 0..2 {
                    let mut dq = up(&vec![T::POISON; s.q_elems()])?;
                    let mut dk = up(&vec![T::POISON; s.kv_elems()])?;
                    let mut dv = up(&vec![T::POISON; s.kv_elems()])?;
                    let ins = (&q, &k, &v, &o, &d_o);
                    let outs = (&mut dq, &mut dk, &mut dv);
                    if rep == 1 && best {
                        flash_backward(dev, fwd, ins, &lse, outs, s, causal, scale)
                    } else {
                        flash_backward_with(dev, bwd, ins, &lse, outs, s, causal, scale)
                    }
                    .map_err(err)?;
                    let down = |b: &kiln::cuda::DeviceBuffer<T>| -> Result<Vec<f32>, String> {
                        Ok(dev.download(b).map_err(err)?.into_iter().map(|x| x.to_f64() as f32).collect())
                    };
                    grads.push([down(&dq)?, down(&dk)?, down(&dv)?]);
                }
                let bits = |g: &[Vec<f32>; 3]| g.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
                if bits(&grads[0]) != bits(&grads[1]) {
                    return Err(format!("{what}: a repeated backward gave different bits"));
                }
                let wide = |x: &[T]| -> Vec<f64> { x.iter().map(|&e| e.to_f64()).collect() };
                let p = s.params(causal, scale);
                let want = reference::backward(&p, &wide(&qh), &wide(&kh), &wide(&vh), &wide(&doh));
                for (name, got, want) in
                    [("dQ", &grads[0][0], &want.dq), ("dK", &grads[0][1], &want.dk), ("dV", &grads[0][2], &want.dv)]
                {
                    // A gradient that is zero in exact arithmetic (one key: dS = dP - dO.O = 0) comes
                    // out as rounding noise; its scale is the inputs' (|x| <= 1), not its own maximum.
                    let max = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
                    let scale_floor = 2f64.powi(-10);
                    let tol = Tol { abs: elem_tol * max.max(scale_floor), rel: 0.0 };
                    compare(&format!("{what}: {name}"), got, want, tol)?;
                    let l2 = testing::relative_l2(got, want);
                    if max > scale_floor && l2 > l2_tol {
                        return Err(format!("{what}: {name} relative L2 error {l2:e} over {l2_tol:e}"));
                    }
                }
            }
        }
    }
    Ok(())
}
