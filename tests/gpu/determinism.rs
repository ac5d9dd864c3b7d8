//! The bit-exact guarantees: the f32 tier is the CPU's FMA chain, the typed tier that chain rounded
//! once, outputs do not depend on the batch, launches and training runs repeat, and a second
//! process computes the same bits.

use crate::common::{Outcome, bits, err};
use crate::{GpuTest, any};
use half::{bf16, f16};
use kiln::cuda::Device;
use kiln::gpu::kernels::mma_tile::GemmShape;
use kiln::testing::{self, POISON_F32};

/// This family's tests, in the order the suite lists them.
pub(crate) fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest { name: "gpu::f32_tier_bits_match_the_cpu_chain", available: any, run: f32_tier_bits },
        GpuTest {
            name: "gpu::f32_tier_underflow_matches_the_chain_up_to_zero_sign",
            available: any,
            run: f32_tier_underflow,
        },
        GpuTest {
            name: "gpu::f32_tier_batch_invariant_and_reproducible",
            available: any,
            run: f32_tier_batch_invariance,
        },
        GpuTest { name: "gpu::typed_tier_bf16_is_the_f32_chain_rounded_once", available: any, run: typed_tier::<bf16> },
        GpuTest { name: "gpu::typed_tier_f16_is_the_f32_chain_rounded_once", available: any, run: typed_tier::<f16> },
        GpuTest {
            name: "gpu::tensor_core_tier_batch_invariant_and_reproducible",
            available: any,
            run: tensor_core_tier,
        },
        GpuTest { name: "gpu::eval_outputs_do_not_depend_on_the_batch", available: any, run: eval_batch_invariance },
        GpuTest { name: "gpu::training_twice_gives_identical_weights", available: any, run: training_twice_identical },
        GpuTest { name: "gpu::triad_bits_match_across_processes", available: any, run: triad_across_processes },
    ]
}

/// Every GEMM rung and the batched tile kernel give exactly the CPU's fixed FMA chain.
fn f32_tier_bits(dev: &Device) -> Outcome {
    use kiln::cuda::gemm::RUNGS;
    use kiln::deterministic::matmul_chain;
    let (mut rng, _) = testing::rng();
    for &(m, n, k) in &[(1u32, 1u32, 1u32), (7, 13, 5), (129, 127, 200), (64, 132, 36), (300, 260, 1024)] {
        let a = testing::uniform(&mut rng, (m * k) as usize);
        let b = testing::uniform(&mut rng, (k * n) as usize);
        let want = bits(&matmul_chain(&a, &b, m as usize, k as usize, n as usize));
        let (da, db) = (dev.upload(&a).map_err(err)?, dev.upload(&b).map_err(err)?);
        for r in RUNGS {
            if r.vec4 && (k % 4 != 0 || n % 4 != 0) {
                continue;
            }
            let mut dc = dev.upload(&vec![POISON_F32; (m * n) as usize]).map_err(err)?;
            r.run(dev, &da, &db, &mut dc, GemmShape { m, n, k }).map_err(err)?;
            if bits(&dev.download(&dc).map_err(err)?) != want {
                return Err(format!("{} at {m}x{n}x{k} differs from the CPU chain", r.name));
            }
        }
        // the batched tile kernel (two identical batches)
        let td = kiln::tensor::Device::Cuda(Device::shared().map_err(err)?);
        let a2: Vec<f32> = a.iter().chain(a.iter()).copied().collect();
        let b2: Vec<f32> = b.iter().chain(b.iter()).copied().collect();
        let ta = kiln::Tensor::from_vec(a2, [2, m as usize, k as usize]).map_err(err)?.to_device(&td).map_err(err)?;
        let tb = kiln::Tensor::from_vec(b2, [2, k as usize, n as usize]).map_err(err)?.to_device(&td).map_err(err)?;
        let got = ta.matmul(&tb).map_err(err)?.to_vec_f32();
        if bits(&got[..(m * n) as usize]) != want || bits(&got[(m * n) as usize..]) != want {
            return Err(format!("batched matmul at {m}x{n}x{k} differs from the CPU chain"));
        }
    }
    Ok(())
}

/// Products that underflow (the contract's one exception): every rung gives the CPU chain's bits
/// for every result that is not zero, and a zero for every zero, whose sign may differ (a rung that
/// pads k with `fma(0, 0, -0.0) = +0.0` steps turns the chain's -0.0 into +0.0). The inputs mix
/// ordinary values, values whose products are subnormal, and values whose products round to zero,
/// with both signs, so that the chain really ends at -0.0 for some outputs (checked).
fn f32_tier_underflow(dev: &Device) -> Outcome {
    use kiln::cuda::gemm::RUNGS;
    use kiln::deterministic::matmul_chain;
    let (mut rng, _) = testing::rng();
    let mut negative_zeros = 0usize;
    for &(m, n, k) in &[(7u32, 13u32, 5u32), (33, 64, 13), (129, 132, 36), (64, 128, 8)] {
        // magnitudes: 1 (ordinary), 1e-20 (products 1e-40: subnormal), 1e-24 (products 1e-48: zero)
        let scale = [1.0f32, 1e-20, 1e-24, 1e-24, 1e-24];
        let mut tiny = |len: usize| -> Vec<f32> {
            testing::uniform(&mut rng, len)
                .iter()
                .enumerate()
                .map(|(i, &x)| if i % 3 == 0 { x * 1e-24 } else { x * scale[(i / 7) % scale.len()] })
                .collect()
        };
        let (a, b) = (tiny((m * k) as usize), tiny((k * n) as usize));
        let want = matmul_chain(&a, &b, m as usize, k as usize, n as usize);
        negative_zeros += want.iter().filter(|x| x.to_bits() == (-0.0f32).to_bits()).count();
        let (da, db) = (dev.upload(&a).map_err(err)?, dev.upload(&b).map_err(err)?);
        for r in RUNGS {
            if r.vec4 && (k % 4 != 0 || n % 4 != 0) {
                continue;
            }
            let mut dc = dev.upload(&vec![POISON_F32; (m * n) as usize]).map_err(err)?;
            r.run(dev, &da, &db, &mut dc, GemmShape { m, n, k }).map_err(err)?;
            let got = dev.download(&dc).map_err(err)?;
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let same = g.to_bits() == w.to_bits() || (*g == 0.0 && *w == 0.0);
                if !same {
                    return Err(format!(
                        "{} at {m}x{n}x{k}: element {i} is {g:e} ({:#010x}), the chain gives {w:e} ({:#010x})",
                        r.name,
                        g.to_bits(),
                        w.to_bits()
                    ));
                }
            }
        }
    }
    if negative_zeros == 0 {
        return Err("no chain ended at -0.0: the inputs do not exercise the contract's exception".into());
    }
    Ok(())
}

/// Row i of X W^T (and of dX = dY W) has the same bits for batches of 1, 7, 32, 128, 1000 and 4096,
/// and 20 repeated launches give the same bits.
fn f32_tier_batch_invariance(_: &Device) -> Outcome {
    let td = kiln::tensor::Device::Cuda(Device::shared().map_err(err)?);
    let (mut rng, _) = testing::rng();
    for &(k, n) in &[(64usize, 96usize), (37, 129), (1024, 512)] {
        let w = kiln::Tensor::from_vec(testing::uniform(&mut rng, n * k), [n, k])
            .map_err(err)?
            .to_device(&td)
            .map_err(err)?;
        let rows = testing::uniform(&mut rng, 4096 * k);
        let dys = testing::uniform(&mut rng, 4096 * n);
        let (mut y0, mut dx0): (Option<Vec<u32>>, Option<Vec<u32>>) = (None, None);
        for batch in [1usize, 7, 32, 128, 1000, 4096] {
            let x = kiln::Tensor::from_vec(rows[..batch * k].to_vec(), [batch, k])
                .map_err(err)?
                .to_device(&td)
                .map_err(err)?;
            let dy = kiln::Tensor::from_vec(dys[..batch * n].to_vec(), [batch, n])
                .map_err(err)?
                .to_device(&td)
                .map_err(err)?;
            let y = x.matmul(&w.transpose(0, 1).map_err(err)?).map_err(err)?.to_vec_f32();
            let dx = dy.matmul(&w).map_err(err)?.to_vec_f32();
            let (yr, dxr) = (bits(&y[..n]), bits(&dx[..k]));
            match (&y0, &dx0) {
                (Some(a), Some(b)) => {
                    if &yr != a || &dxr != b {
                        return Err(format!("row 0 changed at batch {batch} (k {k}, n {n})"));
                    }
                }
                _ => (y0, dx0) = (Some(yr), Some(dxr)),
            }
        }
        let x = kiln::Tensor::from_vec(rows[..128 * k].to_vec(), [128, k]).map_err(err)?.to_device(&td).map_err(err)?;
        let wt = w.transpose(0, 1).map_err(err)?;
        let first = bits(&x.matmul(&wt).map_err(err)?.to_vec_f32());
        for rep in 0..20 {
            if bits(&x.matmul(&wt).map_err(err)?.to_vec_f32()) != first {
                return Err(format!("launch {rep} differs (k {k}, n {n})"));
            }
        }
    }
    Ok(())
}

/// A 16-bit type with its host conversions, for the typed-tier test.
trait Half16: kiln::cuda::gemm::TypedTier + PartialEq + std::fmt::Debug {
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
    fn bits(self) -> u16;
}

impl Half16 for bf16 {
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn bits(self) -> u16 {
        self.to_bits()
    }
}

impl Half16 for f16 {
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn bits(self) -> u16 {
        self.to_bits()
    }
}

/// Guarantee 4: the typed tier's bits are the f32 chain on the widened inputs, rounded once
/// (nearest-even), on every run, at odd shapes and with k = 0.
fn typed_tier<T: Half16>(dev: &Device) -> Outcome {
    use kiln::deterministic::matmul_chain;
    let (mut rng, _) = testing::rng();
    for &(m, n, k) in &[(1u32, 1u32, 1u32), (13, 9, 70), (129, 127, 200), (1, 512, 1000), (64, 132, 36), (5, 7, 0)] {
        let (mu, nu, ku) = (m as usize, n as usize, k as usize);
        let a: Vec<T> = testing::uniform(&mut rng, mu * ku).into_iter().map(T::from_f32).collect();
        let b: Vec<T> = testing::uniform(&mut rng, ku * nu).into_iter().map(T::from_f32).collect();
        let chain = matmul_chain(
            &a.iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
            &b.iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
            mu,
            ku,
            nu,
        );
        let want: Vec<u16> = chain.iter().map(|&x| T::from_f32(x).bits()).collect();
        let (da, db) = (dev.upload(&a).map_err(err)?, dev.upload(&b).map_err(err)?);
        let mut dc = dev.upload(&vec![T::from_f32(f32::NAN); mu * nu]).map_err(err)?;
        for rep in 0..20 {
            kiln::cuda::gemm::typed_gemm(dev, &da, &db, &mut dc, GemmShape { m, n, k }).map_err(err)?;
            let got: Vec<u16> = dev.download(&dc).map_err(err)?.into_iter().map(|x| x.bits()).collect();
            if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
                return Err(format!(
                    "{m}x{n}x{k} run {rep}: element {i} is {:#06x}, the rounded chain {:#06x}",
                    got[i], want[i]
                ));
            }
        }
    }
    Ok(())
}

/// The tensor-core GEMMs (mma.sync, and wgmma on sm_90a) reduce each output over k in a fixed
/// order inside one warp or warpgroup: row i of C must not depend on m, and launches must repeat.
fn tensor_core_tier(dev: &Device) -> Outcome {
    let (mut rng, _) = testing::rng();
    let (n, k) = (200usize, 264usize);
    let b: Vec<bf16> = testing::uniform(&mut rng, n * k).into_iter().map(bf16::from_f32).collect();
    let a_all: Vec<bf16> = testing::uniform(&mut rng, 1000 * k).into_iter().map(bf16::from_f32).collect();
    let db = dev.upload(&b).map_err(err)?;
    let wgmma_here = dev.supports::<kiln::gpu::kernels::gemm_wgmma::GemmWgmmaBf16>();
    let (mut mma_row0, mut wg_row0): (Option<Vec<u32>>, [Option<Vec<u32>>; 3]) = (None, [None, None, None]);
    for m in [1usize, 7, 128, 1000] {
        let da = dev.upload(&a_all[..m * k]).map_err(err)?;
        let s = GemmShape { m: m as u32, n: n as u32, k: k as u32 };
        let mut dc = dev.upload(&vec![POISON_F32; m * n]).map_err(err)?;
        kiln::cuda::gemm::hgemm(dev, &da, &db, &mut dc, s).map_err(err)?;
        let first = bits(&dev.download(&dc).map_err(err)?);
        for _ in 0..20 {
            kiln::cuda::gemm::hgemm(dev, &da, &db, &mut dc, s).map_err(err)?;
            if bits(&dev.download(&dc).map_err(err)?) != first {
                return Err(format!("hgemm m={m}: a repeated launch changed bits"));
            }
        }
        match &mma_row0 {
            None => mma_row0 = Some(first[..n].to_vec()),
            Some(r) if r[..] != first[..n] => return Err(format!("hgemm: row 0 changed at m={m}")),
            _ => {}
        }
        // both block tiles run the same k16 chain per output
        let wide = kiln::gpu::kernels::hgemm_mma::HGEMM_WIDE;
        dev.write(&mut dc, &vec![POISON_F32; m * n]).map_err(err)?;
        kiln::cuda::gemm::hgemm_with_tile(dev, wide, &da, &db, &mut dc, s).map_err(err)?;
        if bits(&dev.download(&dc).map_err(err)?) != first {
            return Err(format!("hgemm m={m}: the wide tile's bits differ from the narrow tile's"));
        }
        if wgmma_here {
            use kiln::cuda::gemm::WgmmaTile;
            for (ti, tile) in [WgmmaTile::T128x128, WgmmaTile::T128x256, WgmmaTile::Persistent].into_iter().enumerate()
            {
                let plan = kiln::cuda::gemm::WgmmaGemm::with_tile(dev, &da, &db, s, tile).map_err(err)?;
                plan.run(&mut dc).map_err(err)?;
                let w = bits(&dev.download(&dc).map_err(err)?);
                for _ in 0..20 {
                    plan.run(&mut dc).map_err(err)?;
                    if bits(&dev.download(&dc).map_err(err)?) != w {
                        return Err(format!("wgmma {tile:?} m={m}: a repeated launch changed bits"));
                    }
                }
                match &wg_row0[ti] {
                    None => wg_row0[ti] = Some(w[..n].to_vec()),
                    Some(r) if r[..] != w[..n] => return Err(format!("wgmma {tile:?}: row 0 changed at m={m}")),
                    _ => {}
                }
            }
        }
    }
    Ok(())
}

/// A model's per-sample outputs on the GPU are the same bits whether the sample is evaluated alone,
/// in a batch of 7 or in a batch of 1000 (Linear with bias, ReLU, GELU, two layers).
fn eval_batch_invariance(dev: &Device) -> Outcome {
    use kiln::nn::{GELU, Linear, Module, ReLU, Sequential};
    let td = kiln::tensor::Device::Cuda(Device::shared().map_err(err)?);
    let _ = dev;
    let mut rng = kiln::Tensor::rng(5);
    let model = Sequential::new()
        .push(Linear::new(37, 130, true, kiln::DType::F32, &mut rng).map_err(err)?)
        .push(ReLU)
        .push(Linear::new(130, 64, true, kiln::DType::F32, &mut rng).map_err(err)?)
        .push(GELU)
        .push(Linear::new(64, 10, true, kiln::DType::F32, &mut rng).map_err(err)?);
    for p in model.parameters() {
        p.move_to(&td).map_err(err)?;
    }
    let _g = kiln::tensor::no_grad();
    let (mut r2, _) = testing::rng();
    let x = testing::uniform(&mut r2, 1000 * 37);
    let run = |rows: std::ops::Range<usize>| -> Result<Vec<u32>, String> {
        let xt = kiln::Tensor::from_vec(x[rows.start * 37..rows.end * 37].to_vec(), [rows.len(), 37])
            .map_err(err)?
            .to_device(&td)
            .map_err(err)?;
        Ok(bits(&model.forward(&xt).map_err(err)?.to_vec_f32()))
    };
    let all = run(0..1000)?;
    for (lo, hi) in [(0, 1), (500, 501), (999, 1000), (3, 10), (990, 997)] {
        if run(lo..hi)? != all[lo * 10..hi * 10] {
            return Err(format!("rows {lo}..{hi} evaluated alone differ from the batch of 1000"));
        }
    }
    Ok(())
}

/// The main job's model trained twice from one seed on the GPU ends with identical weights.
fn training_twice_identical(_: &Device) -> Outcome {
    use kiln::nn::Module;
    use kiln::train::{DataSource, DeviceChoice, TrainConfig};
    let cfg = TrainConfig {
        data: DataSource::Spirals { per_class: 200, classes: 3, noise: 0.2 },
        epochs: 3,
        device: DeviceChoice::Cuda,
        checkpoint: None,
        progress: false,
        ..TrainConfig::default()
    };
    let a = kiln::train::train(&cfg, |_| {}).map_err(err)?.model.named_parameters();
    let b = kiln::train::train(&cfg, |_| {}).map_err(err)?.model.named_parameters();
    for ((n, x), (_, y)) in a.iter().zip(&b) {
        if bits(&x.to_vec_f32()) != bits(&y.to_vec_f32()) {
            return Err(format!("parameter {n} differs between two runs from the same seed"));
        }
    }
    Ok(())
}

pub(crate) const TRIAD_CHILD_ENV: &str = "KILN_TRIAD_CHILD";

/// FNV-1a over the bits of a product.
fn digest(v: &[f32]) -> u64 {
    v.iter()
        .flat_map(|x| x.to_bits().to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// Digests of every kernel the triad can pick, over the shape classes (tiny, narrow, a one-row
/// batch, a long reduction, large), from fixed inputs (seed 1234, not the run's seed).
pub(crate) fn triad_digests(dev: &Device) -> Result<Vec<(String, u64)>, String> {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(1234);
    let mut out = Vec::new();
    let shapes = [(1u32, 1u32, 1u32), (7, 13, 5), (1, 512, 1024), (64, 8, 4096), (300, 260, 1024), (1024, 1024, 512)];
    for &(m, n, k) in &shapes {
        let a = testing::uniform(&mut rng, (m * k) as usize);
        let b = testing::uniform(&mut rng, (k * n) as usize);
        let (da, db) = (dev.upload(&a).map_err(err)?, dev.upload(&b).map_err(err)?);
        let s = GemmShape { m, n, k };
        for r in kiln::cuda::gemm::RUNGS {
            if r.vec4 && (k % 4 != 0 || n % 4 != 0) {
                continue;
            }
            let mut dc = dev.upload(&vec![POISON_F32; (m * n) as usize]).map_err(err)?;
            r.run(dev, &da, &db, &mut dc, s).map_err(err)?;
            out.push((format!("{}:{m}x{n}x{k}", r.name), digest(&dev.download(&dc).map_err(err)?)));
        }
        if k % 8 != 0 {
            continue; // the tensor-core kernels copy rows in 16-byte chunks (a typed error otherwise)
        }
        let ab: Vec<bf16> = a.iter().map(|&x| bf16::from_f32(x)).collect();
        let bb: Vec<bf16> = b.iter().map(|&x| bf16::from_f32(x)).collect(); // read as n x k
        let (dab, dbb) = (dev.upload(&ab).map_err(err)?, dev.upload(&bb).map_err(err)?);
        let mut dc = dev.upload(&vec![POISON_F32; (m * n) as usize]).map_err(err)?;
        kiln::cuda::gemm::hgemm(dev, &dab, &dbb, &mut dc, s).map_err(err)?;
        out.push((format!("hgemm_mma_bf16:{m}x{n}x{k}"), digest(&dev.download(&dc).map_err(err)?)));
        let ah: Vec<f16> = a.iter().map(|&x| f16::from_f32(x)).collect();
        let bh: Vec<f16> = b.iter().map(|&x| f16::from_f32(x)).collect();
        let (dah, dbh) = (dev.upload(&ah).map_err(err)?, dev.upload(&bh).map_err(err)?);
        kiln::cuda::gemm::hgemm(dev, &dah, &dbh, &mut dc, s).map_err(err)?;
        out.push((format!("hgemm_mma_f16:{m}x{n}x{k}"), digest(&dev.download(&dc).map_err(err)?)));
        // the typed tier (b read as k x n here)
        let mut c16 = dev.upload(&vec![bf16::ZERO; (m * n) as usize]).map_err(err)?;
        kiln::cuda::gemm::typed_gemm(dev, &dab, &dbb, &mut c16, s).map_err(err)?;
        let c16: Vec<f32> = dev.download(&c16).map_err(err)?.into_iter().map(|x| x.to_f32()).collect();
        out.push((format!("typed_bf16:{m}x{n}x{k}"), digest(&c16)));
        if dev.supports::<kiln::gpu::kernels::gemm_wgmma::GemmWgmmaBf16>() {
            use kiln::cuda::gemm::{WgmmaGemm, WgmmaTile};
            for tile in [WgmmaTile::T128x128, WgmmaTile::T128x256, WgmmaTile::Persistent] {
                WgmmaGemm::with_tile(dev, &dab, &dbb, s, tile).map_err(err)?.run(&mut dc).map_err(err)?;
                out.push((format!("wgmma {tile:?}:{m}x{n}x{k}"), digest(&dev.download(&dc).map_err(err)?)));
            }
        }
    }
    Ok(out)
}

/// Guarantee 1 across processes: a second process (this binary, re-run as a child) computes every
/// triad kernel's products on the same inputs and must produce the same bits.
fn triad_across_processes(dev: &Device) -> Outcome {
    let mine = triad_digests(dev)?;
    let path = std::env::temp_dir().join(format!("kiln-triad-{}.txt", std::process::id()));
    let io = |e: std::io::Error| e.to_string();
    let exe = std::env::current_exe().map_err(io)?;
    let status = std::process::Command::new(exe).env(TRIAD_CHILD_ENV, &path).status().map_err(io)?;
    if !status.success() {
        return Err(format!("the child process failed: {status}"));
    }
    let theirs = std::fs::read_to_string(&path).map_err(io)?;
    let _ = std::fs::remove_file(&path);
    let theirs: Vec<&str> = theirs.lines().collect();
    if theirs.len() != mine.len() {
        return Err(format!("child computed {} products, parent {}", theirs.len(), mine.len()));
    }
    for ((k, d), line) in mine.iter().zip(theirs) {
        let want = format!("{k} {d:016x}");
        if line != want {
            return Err(format!("{k}: parent {want}, child {line}"));
        }
    }
    Ok(())
}
