//! One rung, one command: run any GEMM kernel of the ladder by name on fresh random inputs, check
//! it against an f64 reference, and time it (`kiln gemm --kernel NAME --shape MxNxK`; the guide's
//! chapters each start with one).

use crate::cuda::gemm::{self, Layout, WgmmaGemm, WgmmaTile};
use crate::cuda::{Device, DeviceBuffer, timing};
use crate::error::{Error, Result};
use half::prelude::{HalfFloatSliceExt, HalfFloatVecExt};
use half::{bf16, f16};
use kiln_gpu::kernels::hgemm_mma::{HGEMM_NARROW, HGEMM_WIDE, HgemmTile};
use kiln_gpu::kernels::mma_tile::GemmShape;
use kiln_gpu::{Arch, Kernel, KernelTarget};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// What `name` runs: an FP32 rung (in its layout), the `mma.sync` GEMM, a Hopper `wgmma` tile, the
/// Blackwell `tcgen05` kernel, or f32 operands in a layout through the bf16 tensor-core path.
#[derive(Clone, Copy, Debug)]
enum Entry {
    F32(&'static gemm::Rung),
    Mma { tile: HgemmTile, f16: bool },
    Wgmma(WgmmaTile),
    Tcgen05,
    Bf16Of(Layout),
}

/// The Blackwell kernel's name (runs only on compute capability 10.x).
pub const TCGEN05: &str = "gemm_tcgen05_bf16";

/// f32 operands stored in each layout, packed to bf16 and multiplied on the tensor cores
/// ([`gemm::gemm_bf16`], what `MatmulPrecision::Bf16` runs), the packing included in the time.
const BF16_OF_F32: &[(&str, Layout)] =
    &[("gemm_bf16_nn", Layout::NN), ("gemm_bf16_nt", Layout::NT), ("gemm_bf16_tn", Layout::TN)];

const MMA: &[(&str, HgemmTile, bool)] = &[
    ("hgemm_mma_bf16", HGEMM_NARROW, false),
    ("hgemm_mma_f16", HGEMM_NARROW, true),
    ("hgemm_mma_bf16_wide", HGEMM_WIDE, false),
    ("hgemm_mma_f16_wide", HGEMM_WIDE, true),
];

const WGMMA: &[(&str, WgmmaTile)] = &[
    ("gemm_wgmma_bf16", WgmmaTile::T128x128),
    ("gemm_wgmma_bf16_wide", WgmmaTile::T128x256),
    ("gemm_wgmma_bf16_persistent", WgmmaTile::Persistent),
    ("gemm_wgmma_bf16_persistent_unicast", WgmmaTile::PersistentUnicast),
    ("gemm_wgmma_bf16_persistent_regstore", WgmmaTile::PersistentRegisterStore),
    ("hgemm_mma_bf16_tma", WgmmaTile::MmaSyncTma),
];

/// Every kernel name `run` takes, in ladder order.
pub fn kernel_names() -> Vec<&'static str> {
    let f32s = gemm::RUNGS.iter().chain(gemm::LAYOUT_RUNGS).map(|r| r.name);
    let tensor_cores = MMA.iter().map(|m| m.0).chain(WGMMA.iter().map(|w| w.0)).chain([TCGEN05]);
    f32s.chain(tensor_cores).chain(BF16_OF_F32.iter().map(|b| b.0)).collect()
}

fn entry(name: &str) -> Result<Entry> {
    if let Some(r) = gemm::RUNGS.iter().chain(gemm::LAYOUT_RUNGS).find(|r| r.name == name) {
        return Ok(Entry::F32(r));
    }
    if let Some(&(_, tile, f16)) = MMA.iter().find(|m| m.0 == name) {
        return Ok(Entry::Mma { tile, f16 });
    }
    if let Some(&(_, tile)) = WGMMA.iter().find(|w| w.0 == name) {
        return Ok(Entry::Wgmma(tile));
    }
    if name == TCGEN05 {
        return Ok(Entry::Tcgen05);
    }
    if let Some(&(_, layout)) = BF16_OF_F32.iter().find(|b| b.0 == name) {
        return Ok(Entry::Bf16Of(layout));
    }
    Err(Error::Unsupported { op: "gemm", what: format!("kernel `{name}`; known: {}", kernel_names().join(", ")) })
}

/// The random inputs [`run`] draws for `s` from `seed`, uniform in [-1, 1): `m k` values for A and
/// `k n` for B, in the order the kernel's layout stores them (the 16-bit kernels round them first).
/// Every kernel gets the same values for the same shape and seed.
pub fn inputs(s: GemmShape, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut uniform = |len: usize| -> Vec<f32> { (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect() };
    let a = uniform(m * k);
    (a, uniform(k * n))
}

/// The operands a kernel multiplies, which decides what cuBLAS runs beside it in the ladder's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operands {
    /// f32 operands stored as the layout says (cuBLAS SGEMM in the same layout).
    F32(Layout),
    /// bf16 A (m x k) and B (n x k), f32 out (cuBLAS GemmEx, bf16 in, f32 compute and out). The
    /// `gemm_bf16_*` kernels take f32 operands and pack them to bf16 in each call; cuBLAS gets the
    /// packed operands.
    Bf16,
    /// f16 A (m x k) and B (n x k), f32 out (cuBLAS GemmEx, f16 in, f32 compute and out).
    F16,
}

/// What kernel `name` multiplies (`None` for a name [`kernel_names`] lacks).
pub fn operands(name: &str) -> Option<Operands> {
    Some(match entry(name).ok()? {
        Entry::F32(r) => Operands::F32(r.layout),
        Entry::Mma { f16: true, .. } => Operands::F16,
        Entry::Mma { f16: false, .. } | Entry::Wgmma(_) | Entry::Tcgen05 | Entry::Bf16Of(_) => Operands::Bf16,
    })
}

/// The guide's rung (chapter) for kernel `name`: the FP32 rungs' levels 1 to 7, 8 for `mma.sync`
/// (and its TMA-fed twin), 9 to 12 for the Hopper kernels, 13 for the FP32 rungs reading a
/// transposed operand in place, 14 for `tcgen05`, 15 for f32 operands on the tensor cores.
pub fn rung(name: &str) -> Option<u32> {
    Some(match entry(name).ok()? {
        Entry::F32(r) if gemm::LAYOUT_RUNGS.iter().any(|l| l.name == r.name) => 13,
        Entry::F32(r) => r.level,
        Entry::Mma { .. } | Entry::Wgmma(WgmmaTile::MmaSyncTma) => 8,
        Entry::Wgmma(WgmmaTile::T128x128) => 9,
        Entry::Wgmma(WgmmaTile::T128x256) => 10,
        Entry::Wgmma(WgmmaTile::PersistentUnicast | WgmmaTile::PersistentRegisterStore) => 11,
        Entry::Wgmma(WgmmaTile::Persistent) => 12,
        Entry::Tcgen05 => 14,
        Entry::Bf16Of(_) => 15,
    })
}

/// The modules kernel `name` is compiled into (`None` for a name [`kernel_names`] lacks). The FP32
/// rungs and the `mma.sync` kernels are in every module; `gemm_bf16_*` picks the tensor cores the
/// device has.
pub fn target(name: &str) -> Option<KernelTarget> {
    use kiln_gpu::kernels::{gemm_tcgen05::GemmTcgen05Bf16, gemm_wgmma, hgemm_mma::HgemmMmaBf16Tma};
    Some(match entry(name).ok()? {
        Entry::F32(_) | Entry::Mma { .. } | Entry::Bf16Of(_) => KernelTarget::Any,
        Entry::Wgmma(WgmmaTile::MmaSyncTma) => HgemmMmaBf16Tma::TARGET,
        Entry::Wgmma(WgmmaTile::T128x128) => gemm_wgmma::GemmWgmmaBf16::TARGET,
        Entry::Wgmma(WgmmaTile::T128x256) => gemm_wgmma::GemmWgmmaBf16Wide::TARGET,
        Entry::Wgmma(_) => gemm_wgmma::GemmWgmmaBf16Persistent::TARGET,
        Entry::Tcgen05 => GemmTcgen05Bf16::TARGET,
    })
}

/// Why a device that loads `arch`'s module cannot run kernel `name`, or `None` when it can (and
/// for unknown names, which [`run`] refuses itself): the `wgmma` kernels and `hgemm_mma_bf16_tma`
/// are only in the sm_90a module (compute capability 9.0), `tcgen05` only in sm_100a (10.x).
pub fn unavailable(name: &str, arch: Arch) -> Option<String> {
    let t = target(name)?;
    if t.available_on(arch) {
        return None;
    }
    let needs = match t {
        KernelTarget::Any => "every module".to_string(),
        KernelTarget::MinSm(sm) => format!("the sm_{sm} module or newer"),
        KernelTarget::Exact(Arch::Sm90a) => "the sm_90a module (compute capability 9.0, Hopper)".to_string(),
        KernelTarget::Exact(Arch::Sm100a) => "the sm_100a module (compute capability 10.x, Blackwell)".to_string(),
        KernelTarget::Exact(a) => format!("the {} module", a.name()),
    };
    Some(format!("built only into {needs}; this device loads {}", arch.name()))
}

/// The outcome of one run.
#[derive(Clone, Debug)]
pub struct RungRun {
    /// The kernel.
    pub kernel: &'static str,
    /// The product.
    pub shape: GemmShape,
    /// What the kernel computes with which types, e.g. "C = A B^T, bf16 in, f32 out".
    pub what: String,
    /// Median milliseconds per launch.
    pub ms: f64,
    /// `2 m n k / time`.
    pub tflops: f64,
    /// Outputs compared with the f64 reference (all of them, or a random sample of large products).
    pub checked: usize,
    /// The largest `|got - want| / sum_p |a_ip b_pj|` over the checked outputs (NaN where an
    /// output was never written: outputs are poisoned before the launch).
    pub max_error: f64,
    /// The bound it must stay under: `k u` with `u` the unit roundoff of f32 accumulation
    /// (2^-23 after f32 products, 2^-22 after exact 16-bit products, as the GPU tests use).
    pub bound: f64,
}

impl RungRun {
    /// Whether every checked output is within the bound.
    pub fn passed(&self) -> bool {
        self.max_error <= self.bound
    }
}

impl std::fmt::Display for RungRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let GemmShape { m, n, k } = self.shape;
        writeln!(f, "{} {m}x{n}x{k}: {}", self.kernel, self.what)?;
        writeln!(
            f,
            "  error: max |got - want| / sum |a b| = {:.3e} over {} outputs, bound k u = {:.3e}: {}",
            self.max_error,
            self.checked,
            self.bound,
            if self.passed() { "ok" } else { "FAILED" }
        )?;
        write!(f, "  time: {:.4} ms (median), {:.1} TFLOP/s", self.ms, self.tflops)
    }
}

/// Outputs checked in full up to this many; beyond, a random sample of `FULL_CHECK / 16` of them and
/// the four corners.
pub const FULL_CHECK: usize = 1 << 16;

/// Runs kernel `name` on `s` with random inputs in [-1, 1) from `seed`: once on poisoned output
/// for the check, then `reps` timed launches (median).
/// `split_k`: the k parts of a persistent `wgmma` kernel (default 1; refused for other kernels).
pub fn run(dev: &Device, name: &str, s: GemmShape, reps: usize, seed: u64, split_k: Option<u32>) -> Result<RungRun> {
    let kernel = kernel_names().into_iter().find(|n| *n == name).unwrap_or("");
    let e = entry(name)?;
    if split_k.is_some_and(|sp| sp != 1) && !matches!(e, Entry::Wgmma(t) if t.is_persistent()) {
        return Err(Error::Unsupported {
            op: "gemm",
            what: format!("--split-k with {name}: only the persistent wgmma kernels split k"),
        });
    }
    let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
    if m * n == 0 || k == 0 {
        return Err(Error::shape("gemm", format!("empty product {m}x{n}x{k}")));
    }
    let (a32, b32) = inputs(s, seed);
    let poison = vec![crate::testing::POISON_F32; m * n];
    let mut c = dev.upload(&poison)?;
    // a(i, p) and b(p, j) as the kernel reads them, and the timed launch
    let (got, what, ms, bound, a, b): (Vec<f32>, String, f64, f64, Vec<f64>, Vec<f64>);
    match e {
        Entry::F32(r) => {
            let (da, db) = (dev.upload(&a32)?, dev.upload(&b32)?);
            (got, ms) = check_and_time(dev, &mut c, reps, |c| r.run(dev, &da, &db, c, s))?;
            what = format!("{}, f32", layout_words(r.layout));
            (a, b) = as_stored(r.layout, &a32, &b32, s, |v| v as f64);
            bound = k as f64 * 2f64.powi(-23);
        }
        Entry::Bf16Of(layout) => {
            let (da, db) = (dev.upload(&a32)?, dev.upload(&b32)?);
            (got, ms) = check_and_time(dev, &mut c, reps, |c| gemm::gemm_bf16(dev, &da, &db, c, s, layout))?;
            what = format!(
                "{}, f32 operands rounded to bf16 (packed in each call), f32 accumulate and out",
                layout_words(layout)
            );
            // the reference multiplies the rounded operands: the bound is the accumulation's
            (a, b) = as_stored(layout, &a32, &b32, s, |v| bf16::from_f32(v).to_f64());
            bound = k as f64 * 2f64.powi(-22);
        }
        Entry::Tcgen05 => {
            let (da, db, ra, rb) = upload_rounded::<bf16>(dev, &a32, &b32, s)?;
            (got, ms) = check_and_time(dev, &mut c, reps, |c| gemm::gemm_tcgen05(dev, &da, &db, c, s))?;
            (a, b) = (ra, rb);
            what = "C = A B^T, bf16 in (A m x k, B n x k), f32 accumulate in tensor memory, f32 out".into();
            bound = k as f64 * 2f64.powi(-22);
        }
        Entry::Mma { tile, f16 } => {
            let run = if f16 { mma_run::<f16> } else { mma_run::<bf16> };
            (got, ms, a, b) = run(dev, tile, &a32, &b32, &mut c, s, reps)?;
            what = format!(
                "C = A B^T, {} in (A m x k, B n x k), f32 accumulate and out",
                if f16 { "f16" } else { "bf16" }
            );
            bound = k as f64 * 2f64.powi(-22);
        }
        Entry::Wgmma(tile) => {
            let (da, db, ra, rb) = upload_rounded::<bf16>(dev, &a32, &b32, s)?;
            // tensor maps encoded once, outside the timed launches
            let g = WgmmaGemm::with_tile(dev, &da, &db, s, tile)?.with_split_k(split_k.unwrap_or(1))?;
            (got, ms) = check_and_time(dev, &mut c, reps, |c| g.run(c))?;
            (a, b) = (ra, rb);
            what = format!(
                "C = A B^T, bf16 in (A m x k, B n x k), f32 accumulate and out{}",
                if g.split_k() > 1 { format!(", k in {} parts", g.split_k()) } else { String::new() }
            );
            bound = k as f64 * 2f64.powi(-22);
        }
    }
    // the outputs to check: all of a small product, else a sample and the four corners
    let picks: Vec<(usize, usize)> = if m * n <= FULL_CHECK {
        (0..m * n).map(|x| (x / n, x % n)).collect()
    } else {
        let mut pick = StdRng::seed_from_u64(seed ^ 0x9e37_79b9);
        let mut v: Vec<(usize, usize)> =
            (0..FULL_CHECK / 16).map(|_| (pick.random_range(0..m), pick.random_range(0..n))).collect();
        v.extend([(0, 0), (0, n - 1), (m - 1, 0), (m - 1, n - 1)]);
        v
    };
    let mut max_error = 0.0f64;
    for &(i, j) in &picks {
        let (mut want, mut mag) = (0.0f64, 0.0f64);
        for p in 0..k {
            let x = a[i * k + p] * b[p * n + j];
            want += x;
            mag += x.abs();
        }
        let g = got[i * n + j] as f64;
        let err = if mag > 0.0 { (g - want).abs() / mag } else { (g - want).abs() };
        max_error = if err.is_nan() {
            f64::NAN
        } else if max_error.is_nan() {
            max_error
        } else {
            max_error.max(err)
        };
    }
    let tflops = 2.0 * m as f64 * n as f64 * k as f64 / ms / 1e9;
    Ok(RungRun { kernel, shape: s, what, ms, tflops, checked: picks.len(), max_error, bound })
}

/// The product a layout computes, in words.
fn layout_words(layout: Layout) -> &'static str {
    match layout {
        Layout::NN => "C = A B (A m x k, B k x n)",
        Layout::NT => "C = A B^T (A m x k, B stored n x k)",
        Layout::TN => "C = A^T B (A stored k x m, B k x n)",
    }
}

/// Element (i, p) of A as `a[i k + p]` and (p, j) of B as `b[p n + j]`, read from operands stored
/// as `layout` says, through `conv`.
fn as_stored(
    layout: Layout,
    a32: &[f32],
    b32: &[f32],
    s: GemmShape,
    conv: impl Fn(f32) -> f64,
) -> (Vec<f64>, Vec<f64>) {
    let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
    let a = match layout {
        Layout::TN => (0..m * k).map(|x| conv(a32[(x % k) * m + x / k])).collect(),
        _ => a32.iter().map(|&v| conv(v)).collect(),
    };
    let b = match layout {
        Layout::NT => (0..k * n).map(|x| conv(b32[(x % n) * k + x / n])).collect(),
        _ => b32.iter().map(|&v| conv(v)).collect(),
    };
    (a, b)
}

/// Launches once into the poisoned `c` and downloads it, then times `reps` launches (median).
fn check_and_time(
    dev: &Device,
    c: &mut DeviceBuffer<f32>,
    reps: usize,
    mut launch: impl FnMut(&mut DeviceBuffer<f32>) -> Result<()>,
) -> Result<(Vec<f32>, f64)> {
    launch(c)?;
    let got = dev.download(c)?;
    let ms = timing::median_ms(dev, reps, 1, || launch(c))?;
    Ok((got, ms))
}

/// The output, the median milliseconds, and A and B^T in f64.
type MmaOut = (Vec<f32>, f64, Vec<f64>, Vec<f64>);

/// The `mma.sync` GEMM with `tile` on the inputs rounded to `T`: the output, the median
/// milliseconds, and the rounded inputs for the reference.
#[allow(clippy::too_many_arguments)]
fn mma_run<T: gemm::HgemmInput>(
    dev: &Device,
    tile: HgemmTile,
    a32: &[f32],
    b32: &[f32],
    c: &mut DeviceBuffer<f32>,
    s: GemmShape,
    reps: usize,
) -> Result<MmaOut>
where
    Vec<T>: HalfFloatVecExt,
    [T]: HalfFloatSliceExt,
{
    let (da, db, a, b) = upload_rounded::<T>(dev, a32, b32, s)?;
    let (got, ms) = check_and_time(dev, c, reps, |c| gemm::hgemm_with_tile(dev, tile, &da, &db, c, s))?;
    Ok((got, ms, a, b))
}

type Rounded<T> = (DeviceBuffer<T>, DeviceBuffer<T>, Vec<f64>, Vec<f64>);

/// Rounds the inputs to `T` (bf16 or f16) and uploads them (A m x k, B n x k); also returns the
/// rounded values as A (m x k) and B^T (k x n) in f64 for the reference.
fn upload_rounded<T>(dev: &Device, a32: &[f32], b32: &[f32], s: GemmShape) -> Result<Rounded<T>>
where
    T: cudarc::driver::DeviceRepr,
    Vec<T>: HalfFloatVecExt,
    [T]: HalfFloatSliceExt,
{
    let (n, k) = (s.n as usize, s.k as usize);
    let (ah, bh) = (Vec::<T>::from_f32_slice(a32), Vec::<T>::from_f32_slice(b32));
    let (da, db) = (dev.upload(&ah)?, dev.upload(&bh)?);
    // B stored n x k; the check reads b(p, j) at p * n + j
    let b_nk = bh.to_f64_vec();
    let b: Vec<f64> = (0..k * n).map(|x| b_nk[(x % n) * k + x / n]).collect();
    Ok((da, db, ah.to_f64_vec(), b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_are_in_ladder_order_and_each_has_a_rung_and_operands() {
        let names = kernel_names();
        let fp32: Vec<&str> = gemm::RUNGS.iter().chain(gemm::LAYOUT_RUNGS).map(|r| r.name).collect();
        // the FP32 rungs first, in their tables' order, then the tensor cores, then f32 on them
        assert_eq!(names[..fp32.len()], fp32[..]);
        assert_eq!(names[0], "sgemm_naive");
        assert_eq!(names[fp32.len()], "hgemm_mma_bf16");
        assert_eq!(names[names.len() - 4], TCGEN05);
        assert_eq!(names[names.len() - 3..], ["gemm_bf16_nn", "gemm_bf16_nt", "gemm_bf16_tn"]);
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "a name twice");
        for n in &names {
            assert!(rung(n).is_some() && operands(n).is_some() && target(n).is_some(), "{n}");
        }
        // the NN FP32 rungs climb 1 to 7
        let levels: Vec<u32> = gemm::RUNGS.iter().map(|r| rung(r.name).unwrap()).collect();
        assert!(levels.windows(2).all(|w| w[0] <= w[1]) && levels[0] == 1 && levels[levels.len() - 1] == 7);
        let expect = [
            ("sgemm_smem", 3),
            ("sgemm_warptile_128x256x8_8x16_db_nt", 13),
            ("hgemm_mma_f16_wide", 8),
            ("hgemm_mma_bf16_tma", 8),
            ("gemm_wgmma_bf16", 9),
            ("gemm_wgmma_bf16_wide", 10),
            ("gemm_wgmma_bf16_persistent_regstore", 11),
            ("gemm_wgmma_bf16_persistent", 12),
            (TCGEN05, 14),
            ("gemm_bf16_tn", 15),
        ];
        for (n, r) in expect {
            assert_eq!(rung(n), Some(r), "{n}");
        }
        assert_eq!(rung("sgemm_nope"), None);
        assert_eq!(operands("sgemm_warptile_64x128x8_4x8_db_tn"), Some(Operands::F32(Layout::TN)));
        assert_eq!(operands("hgemm_mma_f16"), Some(Operands::F16));
        assert_eq!(operands("gemm_bf16_nt"), Some(Operands::Bf16));
    }

    #[test]
    fn the_device_module_decides_which_kernels_are_skipped() {
        let skipped =
            |arch| -> Vec<&str> { kernel_names().into_iter().filter(|n| unavailable(n, arch).is_some()).collect() };
        let hopper: Vec<&str> =
            kernel_names().into_iter().filter(|n| n.starts_with("gemm_wgmma") || *n == "hgemm_mma_bf16_tma").collect();
        assert_eq!(hopper.len(), 6);
        // Ampere (and every device that JITs sm_80): no wgmma, no TMA-fed mma.sync, no tcgen05
        let mut sm80 = hopper.clone();
        sm80.push(TCGEN05);
        assert_eq!(skipped(Arch::Sm80), sm80);
        assert_eq!(skipped(Arch::Sm90a), [TCGEN05]);
        // Blackwell's module has tcgen05 and not the sm_90a-only wgmma
        assert_eq!(skipped(Arch::Sm100a), hopper);
        let why = unavailable(TCGEN05, Arch::Sm90a).unwrap();
        assert!(why.contains("sm_100a") && why.contains("10.x") && why.contains("loads sm_90a"), "{why}");
        let why = unavailable("gemm_wgmma_bf16", Arch::Sm80).unwrap();
        assert!(why.contains("sm_90a") && why.contains("9.0") && why.contains("loads sm_80"), "{why}");
        assert_eq!(unavailable("sgemm_nope", Arch::Sm80), None);
    }

    /// The skipping rule agrees with the modules the build embeds: the kernel a name launches is in
    /// a module's PTX exactly where [`unavailable`] lets it run (the persistent `wgmma` names are
    /// configurations of one entry; `gemm_bf16_*` are host paths that pick their kernels).
    #[test]
    fn the_skipping_rule_matches_the_embedded_modules() {
        for arch in Arch::ALL {
            let entries = crate::ptx::entries(crate::ptx::embedded(arch));
            for n in kernel_names() {
                let launched = match entry(n).unwrap() {
                    Entry::Bf16Of(_) => continue,
                    Entry::Wgmma(t) if t.is_persistent() => "gemm_wgmma_bf16_persistent",
                    _ => n,
                };
                assert_eq!(entries.contains(&launched), unavailable(n, arch).is_none(), "{n} in {}", arch.name());
            }
        }
    }

    #[test]
    fn every_kernel_gets_the_same_inputs() {
        let s = GemmShape { m: 3, n: 5, k: 7 };
        let (a, b) = inputs(s, 9);
        assert_eq!((a.len(), b.len()), (21, 35));
        assert_eq!(inputs(s, 9), (a.clone(), b));
        assert!(a.iter().all(|v| (-1.0..1.0).contains(v)));
        assert_ne!(inputs(s, 10).0, a);
    }
}
