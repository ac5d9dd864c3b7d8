//! The GEMMs: every rung of the FP32 ladder and its transposed-layout rungs, the `mma.sync` hgemm,
//! `gemm_bf16` over f32 operands, the `kiln gemm --kernel` and `--ladder` commands, and the Hopper
//! `wgmma` kernels (plain, persistent with the fused epilogue and split k, strided batches), each
//! against f64.

use crate::common::{Outcome, TestInput, bf16_abt_case, bf16_round, bits, check_abt, err, transposed};
use crate::{GpuTest, any};
use half::{bf16, f16};
use kiln::cuda::Device;
use kiln::gpu::kernels::mma_tile::GemmShape;
use kiln::testing::{self, POISON_F32, Tol, compare};

/// This family's tests, in the order the suite lists them.
pub(crate) fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest { name: "gpu::sgemm_ladder_matches_f64", available: any, run: sgemm_ladder },
        GpuTest { name: "gpu::sgemm_layouts_read_transposes_in_place", available: any, run: sgemm_layouts_case },
        GpuTest { name: "gpu::cublas_reference_matches_and_checks_sizes", available: any, run: cublas_reference_case },
        GpuTest { name: "gpu::hgemm_mma_bf16", available: any, run: hgemm_case::<bf16> },
        GpuTest { name: "gpu::hgemm_mma_f16", available: any, run: hgemm_case::<f16> },
        GpuTest { name: "gpu::gemm_bf16_of_f32_operands_every_layout", available: any, run: gemm_bf16_case },
        GpuTest { name: "gpu::gemm_ladder_command_runs_every_kernel", available: any, run: ladder_command },
        GpuTest { name: "gpu::gemm_ladder_table_every_row_within_its_bound", available: any, run: ladder_table },
        GpuTest {
            name: "gpu::gemm_wgmma_bf16_sm90",
            available: |d| d.supports::<kiln::gpu::kernels::gemm_wgmma::GemmWgmmaBf16>(),
            run: wgmma_case,
        },
        GpuTest {
            name: "gpu::gemm_wgmma_persistent_epilogue_sm90",
            available: |d| d.supports::<kiln::gpu::kernels::gemm_wgmma::GemmWgmmaBf16Persistent>(),
            run: wgmma_persistent_epilogue_case,
        },
        GpuTest {
            name: "gpu::gemm_wgmma_strided_batches_sm90",
            available: |d: &Device| d.supports::<kiln::gpu::kernels::gemm_wgmma::GemmWgmmaBf16Persistent>(),
            run: wgmma_batched_case,
        },
    ]
}

/// Every rung of the FP32 GEMM ladder against an f64 reference, at aligned and odd shapes, output
/// poisoned first. Rungs that need 16-byte rows get only shapes with k and n multiples of 4, and must
/// reject the others with a typed error.
fn sgemm_ladder(dev: &Device) -> Outcome {
    use kiln::cuda::gemm::RUNGS;
    let (mut rng, _) = testing::rng();
    let shapes: &[(u32, u32, u32)] = &[
        (1, 1, 1),
        (7, 13, 5),
        (127, 129, 65),
        (129, 127, 200),
        (256, 256, 256),
        (1000, 17, 33),
        (64, 132, 36),
        (257, 260, 1024),
        // one k tile, every block inside C: the tile loop's last-tile path alone
        (256, 256, 8),
        (256, 256, 16),
    ];
    for r in RUNGS {
        for &(m, n, k) in shapes {
            let a = testing::uniform(&mut rng, (m * k) as usize);
            let b = testing::uniform(&mut rng, (k * n) as usize);
            let (da, db) = (dev.upload(&a).map_err(err)?, dev.upload(&b).map_err(err)?);
            let mut dc = dev.upload(&vec![POISON_F32; (m * n) as usize]).map_err(err)?;
            let s = GemmShape { m, n, k };
            if r.vec4 && (k % 4 != 0 || n % 4 != 0) {
                match r.run(dev, &da, &db, &mut dc, s) {
                    Err(kiln::Error::Unsupported { .. }) => continue,
                    other => {
                        return Err(format!("{} at {m}x{n}x{k} should refuse unaligned rows, got {other:?}", r.name));
                    }
                }
            }
            r.run(dev, &da, &db, &mut dc, s).map_err(err)?;
            let got = dev.download(&dc).map_err(err)?;
            for i in 0..m as usize {
                for j in 0..n as usize {
                    let (mut want, mut mag) = (0.0f64, 0.0f64);
                    for p in 0..k as usize {
                        let x = a[i * k as usize + p] as f64 * b[p * n as usize + j] as f64;
                        want += x;
                        mag += x.abs();
                    }
                    let tol = k as f64 * 2f64.powi(-23) * mag + 1e-30;
                    compare(
                        &format!("{} {m}x{n}x{k} at ({i}, {j})", r.name),
                        &[got[i * n as usize + j]],
                        &[want],
                        Tol { abs: tol, rel: 0.0 },
                    )?;
                }
            }
        }
    }
    // k = 0: C is all zeros (written without a launch: the tuned rungs' unchecked body needs
    // k > 0). Its operands are empty buffers; where the driver refuses an empty allocation, no
    // such product can be asked for, and there is nothing to check.
    let (m, n) = (264u32, 520u32);
    let (Ok(da), Ok(db)) = (dev.zeros::<f32>(0), dev.zeros::<f32>(0)) else {
        println!("sgemm_ladder: the driver refuses empty buffers, so k = 0 products cannot be made");
        return Ok(());
    };
    for r in RUNGS {
        let mut dc = dev.upload(&vec![POISON_F32; (m * n) as usize]).map_err(err)?;
        r.run(dev, &da, &db, &mut dc, GemmShape { m, n, k: 0 }).map_err(err)?;
        if let Some(i) = dev.download(&dc).map_err(err)?.iter().position(|&x| x != 0.0) {
            return Err(format!("{} {m}x{n}x0: element {i} is not zero", r.name));
        }
    }
    Ok(())
}

/// The NT and TN rungs read a transposed operand in place and give exactly the bits of their NN
/// twin on a transposed copy (same tiles, same chains), at odd aligned shapes with poisoned
/// outputs; unaligned rows are refused with a typed error, never read wrongly.
fn sgemm_layouts_case(dev: &Device) -> Outcome {
    use kiln::cuda::gemm::{LAYOUT_RUNGS, Layout, rung};
    let (mut rng, _) = testing::rng();
    let transpose = |x: &[f32], rows: usize, cols: usize| -> Vec<f32> {
        (0..cols * rows).map(|i| x[(i % rows) * cols + i / rows]).collect()
    };
    for r in LAYOUT_RUNGS {
        let nn = rung(r.name.trim_end_matches("_nt").trim_end_matches("_tn")).map_err(err)?;
        for &(m, n, k) in &[(4u32, 4u32, 4u32), (132, 260, 68), (1000, 36, 516), (68, 1028, 12), (264, 516, 128)] {
            let s = GemmShape { m, n, k };
            let (mu, nu, ku) = (m as usize, n as usize, k as usize);
            let a = testing::uniform(&mut rng, mu * ku); // m x k
            let b = testing::uniform(&mut rng, ku * nu); // k x n
            let (dan, dbn) = (dev.upload(&a).map_err(err)?, dev.upload(&b).map_err(err)?);
            let mut want = dev.upload(&vec![POISON_F32; mu * nu]).map_err(err)?;
            nn.run(dev, &dan, &dbn, &mut want, s).map_err(err)?;
            let (da, db) = match r.layout {
                Layout::NT => (dev.upload(&a).map_err(err)?, dev.upload(&transpose(&b, ku, nu)).map_err(err)?),
                Layout::TN => (dev.upload(&transpose(&a, mu, ku)).map_err(err)?, dev.upload(&b).map_err(err)?),
                Layout::NN => unreachable!("the layout table has no NN rung"),
            };
            let mut got = dev.upload(&vec![POISON_F32; mu * nu]).map_err(err)?;
            r.run(dev, &da, &db, &mut got, s).map_err(err)?;
            let (got, want) = (dev.download(&got).map_err(err)?, dev.download(&want).map_err(err)?);
            if let Some(i) = (0..mu * nu).find(|&i| got[i].to_bits() != want[i].to_bits()) {
                return Err(format!(
                    "{} {m}x{n}x{k} at ({}, {}): got {:e}, the NN rung on a transposed copy gave {:e}",
                    r.name,
                    i / nu,
                    i % nu,
                    got[i],
                    want[i]
                ));
            }
        }
        // rows that are not 16-byte multiples in this layout
        let s = if r.layout == Layout::TN { GemmShape { m: 6, n: 8, k: 8 } } else { GemmShape { m: 8, n: 8, k: 6 } };
        let (a, b) = (
            dev.zeros::<f32>((s.m * s.k) as usize).map_err(err)?,
            dev.zeros::<f32>((s.k * s.n) as usize).map_err(err)?,
        );
        let mut c = dev.zeros::<f32>((s.m * s.n) as usize).map_err(err)?;
        match r.run(dev, &a, &b, &mut c, s) {
            Err(kiln::Error::Unsupported { .. }) => {}
            other => return Err(format!("{} must refuse {s:?}, got {other:?}", r.name)),
        }
    }
    Ok(())
}

/// The cuBLAS reference (`kiln::cuda::cublas`, what `kiln gemm --ladder` and the benchmarks time
/// kiln against) computes the same products as kiln's kernels: SGEMM in every layout against the
/// f32 tier within a few ulps of the sum of |a b|, GemmEx with bf16 and f16 inputs against the
/// `mma.sync` kernel; buffers too small for the shape are a shape error, not a launch. Skips (passes
/// with a message) where libcublas is not on the machine.
fn cublas_reference_case(dev: &Device) -> Outcome {
    use kiln::cuda::cublas;
    use kiln::cuda::gemm::{Layout, hgemm, sgemm_layout};
    if !cublas::available() {
        eprintln!("cublas_reference_matches_and_checks_sizes: libcublas not found; nothing to check");
        return Ok(());
    }
    let blas = kiln::cudarc::cublas::CudaBlas::new(dev.stream().clone()).map_err(|e| format!("{e:?}"))?;
    cublas::set_math_mode(&blas, kiln::cudarc::cublas::sys::cublasMath_t::CUBLAS_DEFAULT_MATH).map_err(err)?;
    let (mut rng, _) = testing::rng();
    // k a multiple of 8: the mma.sync kernel copies 16-byte rows
    let s = GemmShape { m: 132, n: 260, k: 72 };
    let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
    let (a, b) = (testing::uniform(&mut rng, m * k), testing::uniform(&mut rng, k * n));
    let (da, db) = (dev.upload(&a).map_err(err)?, dev.upload(&b).map_err(err)?);
    let tol = Tol { abs: 1e-4, rel: 1e-4 };
    let wide = |x: &[f32]| -> Vec<f64> { x.iter().map(|&v| v as f64).collect() };
    for layout in [Layout::NN, Layout::NT, Layout::TN] {
        let mut want = dev.upload(&vec![POISON_F32; m * n]).map_err(err)?;
        sgemm_layout(dev, &da, &db, &mut want, s, layout).map_err(err)?;
        let mut got = dev.upload(&vec![POISON_F32; m * n]).map_err(err)?;
        cublas::sgemm(&blas, &da, &db, &mut got, s, layout).map_err(err)?;
        let (got, want) = (dev.download(&got).map_err(err)?, dev.download(&want).map_err(err)?);
        compare(&format!("cuBLAS SGEMM {layout:?}"), &got, &wide(&want), tol).map_err(|e| e.to_string())?;
    }
    // bf16 and f16 inputs, a m x k and b n x k, against the mma.sync kernel on the same values
    let b_nk: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect(); // n x k
    let (a16, b16) = (
        Vec::<bf16>::from_iter(a.iter().map(|&x| bf16::from_f32(x))),
        Vec::<bf16>::from_iter(b_nk.iter().map(|&x| bf16::from_f32(x))),
    );
    let (da16, db16) = (dev.upload(&a16).map_err(err)?, dev.upload(&b16).map_err(err)?);
    let compute = kiln::cudarc::cublas::sys::cublasComputeType_t::CUBLAS_COMPUTE_32F;
    let mut want = dev.upload(&vec![POISON_F32; m * n]).map_err(err)?;
    hgemm(dev, &da16, &db16, &mut want, s).map_err(err)?;
    let mut got = dev.upload(&vec![POISON_F32; m * n]).map_err(err)?;
    cublas::gemm_ex_abt(&blas, &da16, &db16, &mut got, s, compute).map_err(err)?;
    let (g, w) = (dev.download(&got).map_err(err)?, dev.download(&want).map_err(err)?);
    compare("cuBLAS GemmEx bf16", &g, &wide(&w), tol).map_err(|e| e.to_string())?;
    let (a16, b16) = (
        Vec::<f16>::from_iter(a.iter().map(|&x| f16::from_f32(x))),
        Vec::<f16>::from_iter(b_nk.iter().map(|&x| f16::from_f32(x))),
    );
    let (da16, db16) = (dev.upload(&a16).map_err(err)?, dev.upload(&b16).map_err(err)?);
    hgemm(dev, &da16, &db16, &mut want, s).map_err(err)?;
    cublas::gemm_ex_abt(&blas, &da16, &db16, &mut got, s, compute).map_err(err)?;
    let (g, w) = (dev.download(&got).map_err(err)?, dev.download(&want).map_err(err)?);
    compare("cuBLAS GemmEx f16", &g, &wide(&w), tol).map_err(|e| e.to_string())?;
    // a c one element short is refused before cuBLAS runs
    let mut short = dev.zeros::<f32>(m * n - 1).map_err(err)?;
    match cublas::sgemm(&blas, &da, &db, &mut short, s, Layout::NN) {
        Err(kiln::Error::Shape { .. }) => {}
        other => return Err(format!("a short c must be a shape error, got {other:?}")),
    }
    match cublas::gemm_ex_abt(&blas, &da16, &db16, &mut short, s, compute) {
        Err(kiln::Error::Shape { .. }) => {}
        other => return Err(format!("a short c must be a shape error, got {other:?}")),
    }
    Ok(())
}

/// The `mma.sync` GEMM (cp.async pipeline, swizzled ldmatrix, both block tiles) against f64, at
/// odd m and n (odd n: scalar stores), k past the pipeline's depth, and more tile rows than one
/// group of the block order.
fn hgemm_case<T: TestInput + kiln::cuda::gemm::HgemmInput>(dev: &Device) -> Outcome {
    use kiln::gpu::kernels::hgemm_mma::{HGEMM_NARROW, HGEMM_WIDE};
    let (mut rng, _) = testing::rng();
    for &(m, n, k) in &[
        (1u32, 1u32, 8u32),
        (127, 129, 64),
        (256, 256, 256),
        (1000, 130, 264),
        (129, 301, 40),
        (300, 260, 1032),
        (1100, 520, 136),
    ] {
        let a: Vec<T> = testing::uniform(&mut rng, (m * k) as usize).into_iter().map(T::from_f32).collect();
        let b: Vec<T> = testing::uniform(&mut rng, (n * k) as usize).into_iter().map(T::from_f32).collect();
        let (da, db) = (dev.upload(&a).map_err(err)?, dev.upload(&b).map_err(err)?);
        let (a64, b64): (Vec<f64>, Vec<f64>) =
            (a.iter().map(|x| x.as_f64()).collect(), b.iter().map(|x| x.as_f64()).collect());
        for tile in [HGEMM_NARROW, HGEMM_WIDE] {
            let mut dc = dev.upload(&vec![POISON_F32; (m * n) as usize]).map_err(err)?;
            kiln::cuda::gemm::hgemm_with_tile(dev, tile, &da, &db, &mut dc, GemmShape { m, n, k }).map_err(err)?;
            let got = dev.download(&dc).map_err(err)?;
            let what = format!("hgemm<{}> {}x{} tile {m}x{n}x{k}", std::any::type_name::<T>(), tile.bm, tile.bn);
            check_abt(&what, &got, &a64, &b64, (m as usize, n as usize, k as usize))?;
        }
    }
    let a = dev.upload(&[T::from_f32(0.0); 8 * 12]).map_err(err)?;
    let mut c = dev.zeros::<f32>(64).map_err(err)?;
    match kiln::cuda::gemm::hgemm(dev, &a, &a, &mut c, GemmShape { m: 8, n: 8, k: 12 }) {
        Err(kiln::Error::Unsupported { op: "hgemm", .. }) => Ok(()),
        other => Err(format!("k = 12 must be refused, got {other:?}")),
    }
}

/// `gemm_bf16`: f32 operands in each stored layout, packed to bf16 (rounded, transposed, k padded to
/// a multiple of 8) and multiplied by every tensor-core kernel the device has (`mma.sync` always,
/// `wgmma` on sm_90a, `tcgen05` on 10.x, and the default choice), each against f64 over the rounded
/// inputs, at odd m, n and k and at 2.1 million rows (packed in two launches), output poisoned. The default path must repeat
/// its bits, and row 0 must keep them when m changes (batch invariance).
fn gemm_bf16_case(dev: &Device) -> Outcome {
    use kiln::cuda::gemm::{Layout, TensorCores, gemm_bf16, gemm_bf16_on};
    let (mut rng, _) = testing::rng();
    // every tensor-core kernel this device has behind the packing, and the default choice
    let mut cores = vec![TensorCores::Best, TensorCores::MmaSync];
    if dev.supports::<kiln::gpu::kernels::gemm_wgmma::GemmWgmmaBf16Persistent>() {
        cores.push(TensorCores::Wgmma);
    }
    if dev.supports::<kiln::gpu::kernels::gemm_tcgen05::GemmTcgen05Bf16>() {
        cores.push(TensorCores::Tcgen05);
    }
    // the last: more rows than one grid's y dimension can tile (65535 x 32), packed in two slices
    let shapes =
        [(1usize, 1usize, 1usize), (7, 127, 129), (129, 7, 1000), (300, 260, 1032), (1000, 130, 17), (2_100_000, 3, 9)];
    for &(m, n, k) in &shapes {
        // (the huge product tests the packing: A packed as stored (NT) and transposed (TN), with the
        // default kernel only)
        let huge = m >= 1 << 20;
        for layout in [Layout::NN, Layout::NT, Layout::TN].into_iter().filter(|&l| !huge || l != Layout::NN) {
            let (av, bv) = (testing::uniform(&mut rng, m * k), testing::uniform(&mut rng, k * n));
            // the rounded operands as m x k and n x k rows, whatever the stored layout
            let a_rows = if layout == Layout::TN { transposed(&bf16_round(&av), k, m) } else { bf16_round(&av) };
            let b_rows = if layout == Layout::NT { bf16_round(&bv) } else { transposed(&bf16_round(&bv), k, n) };
            let (da, db) = (dev.upload(&av).map_err(err)?, dev.upload(&bv).map_err(err)?);
            let s = GemmShape { m: m as u32, n: n as u32, k: k as u32 };
            let mut dc = dev.upload(&vec![POISON_F32; m * n]).map_err(err)?;
            for &tc in cores.iter().filter(|&&tc| !huge || tc == TensorCores::Best) {
                dev.write(&mut dc, &vec![POISON_F32; m * n]).map_err(err)?;
                gemm_bf16_on(dev, tc, &da, &db, &mut dc, s, layout).map_err(err)?;
                let got = dev.download(&dc).map_err(err)?;
                check_abt(&format!("gemm_bf16 {tc:?} {layout:?} {m}x{n}x{k}"), &got, &a_rows, &b_rows, (m, n, k))?;
            }
            // the default path twice: the same bits
            let mut runs = vec![];
            for _ in 0..2 {
                dev.write(&mut dc, &vec![POISON_F32; m * n]).map_err(err)?;
                gemm_bf16(dev, &da, &db, &mut dc, s, layout).map_err(err)?;
                runs.push(bits(&dev.download(&dc).map_err(err)?));
            }
            if runs[0] != runs[1] {
                return Err(format!("gemm_bf16 {layout:?} {m}x{n}x{k}: a repeated product changed bits"));
            }
            let again = &runs[1];
            if layout == Layout::NT && (2..=1000).contains(&m) {
                // the first row alone: the same bits as inside the m-row product
                let da1 = dev.upload(&av[..k]).map_err(err)?;
                let mut dc1 = dev.upload(&vec![POISON_F32; n]).map_err(err)?;
                gemm_bf16(dev, &da1, &db, &mut dc1, GemmShape { m: 1, ..s }, layout).map_err(err)?;
                if bits(&dev.download(&dc1).map_err(err)?) != again[..n] {
                    return Err(format!("gemm_bf16 {m}x{n}x{k}: row 0 changed with m"));
                }
            }
        }
    }
    // shape mistakes are typed errors
    let (da, db) = (dev.upload(&[0f32; 6]).map_err(err)?, dev.upload(&[0f32; 6]).map_err(err)?);
    let mut dc = dev.upload(&[0f32; 4]).map_err(err)?;
    let bad = GemmShape { m: 2, n: 2, k: 4 };
    match gemm_bf16(dev, &da, &db, &mut dc, bad, Layout::NT) {
        Err(kiln::Error::Shape { .. }) => Ok(()),
        other => Err(format!("a 2x2x4 product of 6-element operands gave {other:?}, not a shape error")),
    }
}

/// `kiln gemm --kernel NAME` (the guide's one command per rung): every kernel of the ladder this
/// device runs, on an unaligned-but-legal shape, checked in full against f64 and within its bound;
/// an unknown name is a typed error listing the kernels.
fn ladder_command(dev: &Device) -> Outcome {
    let wgmma_here = dev.supports::<kiln::gpu::kernels::gemm_wgmma::GemmWgmmaBf16>();
    let s = GemmShape { m: 200, n: 132, k: 72 }; // n, k multiples of 4 (and k of 8), m odd-sized tiles
    let mut ran = 0;
    for name in kiln::tools::gemm_ladder::kernel_names() {
        if (name.starts_with("gemm_wgmma") || name.ends_with("_tma")) && !wgmma_here {
            continue;
        }
        if name == kiln::tools::gemm_ladder::TCGEN05
            && !dev.supports::<kiln::gpu::kernels::gemm_tcgen05::GemmTcgen05Bf16>()
        {
            // below 10.0 the command refuses it with a typed error instead
            match kiln::tools::gemm_ladder::run(dev, name, s, 2, 7, None) {
                Err(kiln::Error::KernelUnavailable { .. }) => continue,
                other => return Err(format!("{name} below compute capability 10.0 gave {other:?}")),
            }
        }
        let r = kiln::tools::gemm_ladder::run(dev, name, s, 2, 7, None).map_err(|e| format!("{name}: {e}"))?;
        if !r.passed() || r.checked != 200 * 132 {
            return Err(format!("{r}"));
        }
        ran += 1;
    }
    if ran < 20 {
        return Err(format!("only {ran} kernels ran"));
    }
    if wgmma_here {
        // a k split through the command: k = 72 is 2 k tiles of 64, one per part
        let r = kiln::tools::gemm_ladder::run(dev, "gemm_wgmma_bf16_persistent", s, 2, 7, Some(2)).map_err(err)?;
        if !r.passed() || !r.what.contains("2 parts") {
            return Err(format!("{r}"));
        }
    }
    match kiln::tools::gemm_ladder::run(dev, "sgemm_nope", s, 1, 7, None) {
        Err(kiln::Error::Unsupported { what, .. }) if what.contains("sgemm_smem") => Ok(()),
        other => Err(format!("an unknown kernel must be refused with the list, got {other:?}")),
    }
}

/// `kiln gemm --ladder` at a small product: a row per kernel in ladder order, skipped exactly where
/// the device's module lacks the kernel, every other row run and within its error bound, cuBLAS
/// timed around each where it loads, and the printed table naming every kernel.
fn ladder_table(dev: &Device) -> Outcome {
    use kiln::tools::gemm_ladder::{kernel_names, unavailable};
    use kiln::tools::ladder_table::{Outcome as Row, run_ladder};
    let s = GemmShape { m: 200, n: 132, k: 72 }; // n, k multiples of 4 (and k of 8), m odd-sized tiles
    let t = run_ladder(dev, s, 2, 7).map_err(err)?;
    let text = t.to_string();
    let names: Vec<&str> = t.rows.iter().map(|r| r.kernel).collect();
    if names != kernel_names() {
        return Err(format!("rows {names:?} are not the kernels in ladder order\n{text}"));
    }
    let mut ran = 0;
    for r in &t.rows {
        let skip = unavailable(r.kernel, dev.arch());
        match (&r.outcome, skip) {
            (Row::Skipped(why), Some(reason)) if why == &reason => {}
            (Row::Ran { run, cublas_ms }, None) => {
                if !run.passed() || run.checked != 200 * 132 {
                    return Err(format!("{run}\n{text}"));
                }
                if t.cublas.is_ok() && !cublas_ms.is_some_and(|ms| ms > 0.0) {
                    return Err(format!("`{}`: cuBLAS loaded but not timed around it\n{text}", r.kernel));
                }
                ran += 1;
            }
            (other, skip) => return Err(format!("`{}`: {other:?} (skip rule: {skip:?})\n{text}", r.kernel)),
        }
        if !text.contains(&format!("`{}`", r.kernel)) {
            return Err(format!("the table lacks `{}`\n{text}", r.kernel));
        }
    }
    if ran < 20 || !t.passed() {
        return Err(format!("{ran} kernels ran\n{text}"));
    }
    println!("{text}");
    Ok(())
}

/// The Hopper wgmma GEMMs (TMA ring, producer and consumer warpgroups; both block tiles) against
/// f64. Shapes cover edge tiles in m and n, odd n (scalar stores), k past the ring's depth, and more
/// tile rows than one group of the wide kernel's block order.
fn wgmma_case(dev: &Device) -> Outcome {
    use kiln::cuda::gemm::WgmmaTile;
    let (mut rng, _) = testing::rng();
    let shapes = [
        (128u32, 128u32, 64u32),
        (1, 1, 8),
        (256, 384, 512),
        (1000, 130, 264),
        (129, 257, 72),
        (300, 200, 1032),
        (1100, 520, 520),
    ];
    // No silent fallback: k that TMA cannot address is a typed error before any launch.
    {
        let (a, b) =
            (dev.upload(&vec![bf16::ONE; 64 * 12]).map_err(err)?, dev.upload(&vec![bf16::ONE; 64 * 12]).map_err(err)?);
        match kiln::cuda::gemm::WgmmaGemm::new(dev, &a, &b, GemmShape { m: 64, n: 64, k: 12 }) {
            Err(kiln::Error::Unsupported { op: "wgmma gemm", .. }) => {}
            Err(e) => return Err(format!("k = 12: expected Unsupported, got {e}")),
            Ok(_) => return Err("k = 12 must be refused (TMA needs 16-byte row pitches)".into()),
        }
    }
    let tiles = [
        WgmmaTile::T128x128,
        WgmmaTile::T128x256,
        WgmmaTile::Persistent,
        WgmmaTile::PersistentUnicast,
        WgmmaTile::PersistentRegisterStore,
        WgmmaTile::MmaSyncTma,
    ];
    for (&(m, n, k), tile) in shapes.iter().flat_map(|s| tiles.map(|t| (s, t))) {
        bf16_abt_case(dev, &mut rng, GemmShape { m, n, k }, &format!("wgmma {tile:?}"), |a, b, c, s| {
            kiln::cuda::gemm::WgmmaGemm::with_tile(dev, a, b, s, tile)?.run(c)
        })?;
    }
    Ok(())
}

/// The persistent wgmma GEMM with its fused epilogue (bias, then ReLU or GELU) against f64, on a
/// product with more cluster tiles than clusters fit (every cluster takes several tiles, so the
/// ring's parity runs on across tiles) and odd edges, through both epilogues: n a multiple of 4
/// takes the staged TMA stores (whose clipping does the masking), other n the register stores. The
/// same plan run into a second output must give the same bits (the C map follows the buffer). And
/// a refused epilogue on a non-fusing tile.
fn wgmma_persistent_epilogue_case(dev: &Device) -> Outcome {
    use kiln::cuda::gemm::Activation;
    use kiln::cuda::gemm::{GemmEpilogue, WgmmaGemm, WgmmaTile};
    let (mut rng, _) = testing::rng();
    let gelu = |x: f64| 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
    // (m, n, k, activation, k split: None = the plan's own choice, which is 1 except where noted)
    for &(m, n, k, act, split) in &[
        (4100u32, 2050u32, 200u32, None, None),
        (4100, 2052, 200, None, None),
        (4100, 2052, 200, Some(Activation::Relu), None),
        (333, 777, 520, Some(Activation::Gelu), None),
        (333, 780, 520, Some(Activation::Gelu), None),
        (1, 9, 8, Some(Activation::Relu), None),
        (1, 12, 8, Some(Activation::Relu), None),
        // split k: uneven parts (16 k tiles in 3: 6, 6, 4), odd n; 33 k tiles in 5; and one
        // cluster tile with 128 k tiles, for which the plan suggests (not applies) a split
        (200, 301, 1000, Some(Activation::Gelu), Some(3)),
        (300, 520, 2056, Some(Activation::Relu), Some(5)),
        (256, 250, 8192, None, None),
        (256, 250, 8192, None, Some(8)),
    ] {
        let a: Vec<bf16> = testing::uniform(&mut rng, (m * k) as usize).into_iter().map(bf16::from_f32).collect();
        let b: Vec<bf16> = testing::uniform(&mut rng, (n * k) as usize).into_iter().map(bf16::from_f32).collect();
        let bias = testing::uniform(&mut rng, n as usize);
        let (da, db, dbias) =
            (dev.upload(&a).map_err(err)?, dev.upload(&b).map_err(err)?, dev.upload(&bias).map_err(err)?);
        let mut dc = dev.upload(&vec![POISON_F32; (m * n) as usize]).map_err(err)?;
        let mut plan =
            WgmmaGemm::with_tile(dev, &da, &db, GemmShape { m, n, k }, WgmmaTile::Persistent).map_err(err)?;
        if let Some(sp) = split {
            plan = plan.with_split_k(sp).map_err(err)?;
        }
        // splitting is opt-in (it would make the bits depend on m)
        let want_split = split.unwrap_or(1);
        if plan.split_k() != want_split {
            return Err(format!("persistent {m}x{n}x{k}: split {} where {want_split} was expected", plan.split_k()));
        }
        if k == 8192 && plan.suggested_split_k() < 2 {
            return Err(format!("persistent {m}x{n}x{k}: one tile of 128 k tiles, yet no split suggested"));
        }
        plan.run_with(&mut dc, GemmEpilogue { bias: Some(&dbias), act, ..Default::default() }).map_err(err)?;
        let got = dev.download(&dc).map_err(err)?;
        let mut dc2 = dev.upload(&vec![POISON_F32; (m * n) as usize]).map_err(err)?;
        plan.run_with(&mut dc2, GemmEpilogue { bias: Some(&dbias), act, ..Default::default() }).map_err(err)?;
        if bits(&dev.download(&dc2).map_err(err)?) != bits(&got) {
            return Err(format!(
                "persistent {m}x{n}x{k} {act:?} split {want_split}: a second output buffer got different bits"
            ));
        }
        let (a64, b64): (Vec<f64>, Vec<f64>) =
            (a.iter().map(|x| x.to_f64()).collect(), b.iter().map(|x| x.to_f64()).collect());
        let k = k as usize;
        for i in 0..m as usize {
            for j in 0..n as usize {
                let (ar, br) = (&a64[i * k..(i + 1) * k], &b64[j * k..(j + 1) * k]);
                let (dot, mag) = ar.iter().zip(br).fold((0.0, 0.0), |(d, g), (x, y)| (d + x * y, g + (x * y).abs()));
                let pre = dot + bias[j] as f64;
                let want = match act {
                    None => pre,
                    Some(Activation::Relu) => pre.max(0.0),
                    Some(Activation::Gelu) => gelu(pre),
                };
                // the products' f32 accumulation, the bias's f32 add, and (GELU) f32 tanh
                let tol = k as f64 * 2f64.powi(-22) * mag + 2f64.powi(-20) * (1.0 + pre.abs());
                let g = got[i * n as usize + j] as f64;
                if (g - want).abs() > tol || g.is_nan() {
                    return Err(format!(
                        "persistent {m}x{n}x{k} {act:?} split {want_split} at ({i}, {j}): got {g}, expected {want}, tolerance {tol:e}"
                    ));
                }
            }
        }
    }
    // A split with an empty part (4 k tiles in 5) is refused.
    let (a, b) =
        (dev.upload(&vec![bf16::ONE; 64 * 256]).map_err(err)?, dev.upload(&vec![bf16::ONE; 64 * 256]).map_err(err)?);
    let plan =
        WgmmaGemm::with_tile(dev, &a, &b, GemmShape { m: 64, n: 64, k: 256 }, WgmmaTile::Persistent).map_err(err)?;
    if !matches!(plan.with_split_k(5), Err(kiln::Error::Unsupported { op: "wgmma gemm", .. })) {
        return Err("a split with an empty part must be refused".into());
    }
    // A tile without the fused epilogue refuses one instead of ignoring it.
    let (a, b) =
        (dev.upload(&vec![bf16::ONE; 64 * 8]).map_err(err)?, dev.upload(&vec![bf16::ONE; 64 * 8]).map_err(err)?);
    let mut c = dev.zeros::<f32>(64 * 64).map_err(err)?;
    let plan = WgmmaGemm::with_tile(dev, &a, &b, GemmShape { m: 64, n: 64, k: 8 }, WgmmaTile::T128x256).map_err(err)?;
    match plan.run_with(&mut c, GemmEpilogue { bias: None, act: Some(Activation::Relu), ..Default::default() }) {
        Err(kiln::Error::Unsupported { op: "wgmma gemm", .. }) => Ok(()),
        other => Err(format!("an activation on the wide tile must be refused, got {other:?}")),
    }
}

/// Strided batches of the persistent kernel: packed, a shared B, and padded strides (the gaps of
/// C must stay poisoned), at m and n that are not tile multiples. Each product must have exactly the
/// bits it has alone, and the last one is checked against f64; bad strides are refused.
fn wgmma_batched_case(dev: &Device) -> Outcome {
    use kiln::cuda::gemm::{BatchSpec, WgmmaGemm, WgmmaTile};
    let (mut rng, _) = testing::rng();
    // (m, n, k, count, a_stride, b_stride, c_stride): 0 for packed
    for &(m, n, k, count, pad_a, share_b, pad_c) in &[
        (200usize, 300usize, 72usize, 3u32, 0usize, false, 0usize),
        (200, 300, 72, 3, 0, true, 0),
        (130, 260, 136, 4, 3, false, 37),
        (256, 256, 64, 5, 0, false, 0),
        // m <= 128: the second CTA of each cluster has no rows of A to load
        (100, 300, 72, 3, 0, false, 0),
    ] {
        let a_stride = (m + pad_a) * k;
        let b_stride = if share_b { 0 } else { n * k };
        let c_stride = m * n + pad_c;
        let count_us = count as usize;
        let a_len = (count_us - 1) * a_stride + m * k;
        let b_len = (count_us - 1) * b_stride + n * k;
        let c_len = (count_us - 1) * c_stride + m * n;
        let a: Vec<bf16> = testing::uniform(&mut rng, a_len).into_iter().map(bf16::from_f32).collect();
        let b: Vec<bf16> = testing::uniform(&mut rng, b_len).into_iter().map(bf16::from_f32).collect();
        let (da, db) = (dev.upload(&a).map_err(err)?, dev.upload(&b).map_err(err)?);
        let mut dc = dev.upload(&vec![POISON_F32; c_len]).map_err(err)?;
        let s = GemmShape { m: m as u32, n: n as u32, k: k as u32 };
        let spec = BatchSpec { count, a_stride, b_stride, c_stride };
        WgmmaGemm::batched(dev, &da, &db, s, spec).map_err(err)?.run(&mut dc).map_err(err)?;
        let got = dev.download(&dc).map_err(err)?;
        let what = format!("batch of {count} {m}x{n}x{k} (strides {a_stride}, {b_stride}, {c_stride})");
        for i in 0..count_us {
            // alone: the same kernel on this product's operands
            let ai = dev.upload(&a[i * a_stride..i * a_stride + m * k]).map_err(err)?;
            let bi = dev.upload(&b[i * b_stride..i * b_stride + n * k]).map_err(err)?;
            let mut ci = dev.upload(&vec![POISON_F32; m * n]).map_err(err)?;
            WgmmaGemm::with_tile(dev, &ai, &bi, s, WgmmaTile::Persistent).map_err(err)?.run(&mut ci).map_err(err)?;
            let alone = dev.download(&ci).map_err(err)?;
            if bits(&alone) != bits(&got[i * c_stride..i * c_stride + m * n]) {
                return Err(format!("{what}: product {i} differs from the same product alone"));
            }
            if i + 1 < count_us
                && got[i * c_stride + m * n..(i + 1) * c_stride].iter().any(|v| v.to_bits() != POISON_F32.to_bits())
            {
                return Err(format!("{what}: a store landed in the gap after product {i}"));
            }
        }
        let last = count_us - 1;
        let wide = |x: &[bf16]| x.iter().map(|v| v.to_f64()).collect::<Vec<_>>();
        let (a64, b64) = (wide(&a[last * a_stride..][..m * k]), wide(&b[last * b_stride..][..n * k]));
        let got_last = &got[last * c_stride..][..m * n];
        check_abt(&format!("{what}: product {last}"), got_last, &a64, &b64, (m, n, k))?;
    }
    // A holds 3 products, so each refusal below is for its own reason
    let (a, b) =
        (dev.upload(&vec![bf16::ONE; 3 * 64 * 72]).map_err(err)?, dev.upload(&vec![bf16::ONE; 64 * 72]).map_err(err)?);
    let s = GemmShape { m: 64, n: 64, k: 72 };
    let bad = [
        BatchSpec { count: 2, a_stride: 64 * 72 + 8, b_stride: 0, c_stride: 64 * 64 }, // not a row multiple
        BatchSpec { count: 2, a_stride: 64 * 72, b_stride: 0, c_stride: 64 * 63 },     // overlapping C
        BatchSpec { count: 4, a_stride: 64 * 72, b_stride: 0, c_stride: 64 * 64 },     // A too short
        BatchSpec { count: 2, a_stride: 64 * 72, b_stride: 0, c_stride: usize::MAX / 2 }, // C past memory
    ];
    for spec in bad {
        match WgmmaGemm::batched(dev, &a, &b, s, spec) {
            Err(kiln::Error::Shape { .. }) => {}
            other => return Err(format!("{spec:?} must be refused as a shape error, got {:?}", other.map(|_| ()))),
        }
    }
    let ok = BatchSpec { count: 2, a_stride: 64 * 72, b_stride: 0, c_stride: 64 * 64 };
    match WgmmaGemm::batched(dev, &a, &b, s, ok).map_err(err)?.with_split_k(2) {
        Err(kiln::Error::Unsupported { op: "wgmma gemm", .. }) => Ok(()),
        other => Err(format!("a split of a batch must be refused, got {:?}", other.map(|_| ()))),
    }
}
