//! The FP32 GEMM ladder against cuBLAS SGEMM (TF32 off: cuBLAS's default math for FP32) in the same
//! process: TFLOP/s per rung and size, and the ratio to cuBLAS. Writes JSON to `$KILN_BENCH_OUT`
//! (default `gemm.json`). Run: `cargo bench --bench gemm`, or `benches/gemm` from a GPU bundle.
//! Without a GPU it prints why and exits 0. The tensor-core kernels and the double-buffered FP32
//! rungs are each compared with cuBLAS measured just before and after them (the mean), since the
//! H200's clocks drift over a run;
//! `KILN_BENCH_PART=f32|tc` runs one half, `KILN_BENCH_SHAPES=MxNxK,...` only those shapes.

use cudarc::cublas::CudaBlas;
use kiln::cuda::Device;
use kiln::cuda::gemm::{LAYOUT_RUNGS, RUNGS};
use kiln::gpu::kernels::mma_tile::GemmShape;
use std::sync::Arc;

const REPS: usize = 10;

#[path = "timing.rs"]
mod timing;

#[path = "cublas.rs"]
mod cublas;
use cublas::{cublas_bf16_f32out, cublas_sgemm, cublas_sgemm_layout, set_math_mode};

fn median_ms(dev: &Arc<Device>, f: impl FnMut()) -> f64 {
    timing::median_ms(dev, REPS, f)
}

/// The median milliseconds of `kernel`, and the mean of `reference`'s measured just before and just
/// after it: the H200's clocks drift over a run, so a reference measured minutes earlier favours
/// whichever side ran first.
fn bracketed(dev: &Arc<Device>, mut reference: impl FnMut(), kernel: impl FnMut()) -> (f64, f64) {
    let before = median_ms(dev, &mut reference);
    let ms = median_ms(dev, kernel);
    let after = median_ms(dev, &mut reference);
    (ms, (before + after) / 2.0)
}

fn main() {
    let Some(dev) = timing::gpu_or_skip("gemm bench") else { return };
    // SAFETY: only tries to dlopen the library.
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        println!("gemm bench: libcublas not found (set LD_LIBRARY_PATH); the ratios need cuBLAS in the same run");
        return;
    }
    let blas = CudaBlas::new(dev.stream().clone()).expect("cuBLAS handle");
    let sizes: &[(u32, u32, u32)] =
        &[(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (4096, 1024, 4096)];
    let mut json = format!("{{\"device\":\"{}\",\"results\":[", dev.name());
    let mut first = true;
    println!("device: {}, median of {REPS}", dev.name());
    // KILN_BENCH_PART=f32 or =tc runs one half (default: both).
    let part = std::env::var("KILN_BENCH_PART").ok();
    let want = |p: &str| part.as_deref().is_none_or(|v| v == p);
    // KILN_BENCH_SHAPES=8192x8192x8192,... keeps only those shapes (for a profiler run).
    let shapes = std::env::var("KILN_BENCH_SHAPES").ok();
    let keep = |&&(m, n, k): &&(u32, u32, u32)| {
        shapes.as_deref().is_none_or(|v| v.split(',').any(|x| x.trim() == format!("{m}x{n}x{k}")))
    };
    for &(m, n, k) in sizes.iter().filter(|_| want("f32")).filter(keep) {
        let s = GemmShape { m, n, k };
        let fl = 2.0 * m as f64 * n as f64 * k as f64;
        let a: Vec<f32> = (0..m * k).map(|i| ((i % 97) as f32 - 48.0) / 64.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i % 89) as f32 - 44.0) / 64.0).collect();
        let (da, db) = (dev.upload(&a).expect("upload"), dev.upload(&b).expect("upload"));
        let mut dc = dev.zeros::<f32>((m * n) as usize).expect("alloc");
        let cublas_ms = median_ms(&dev, || cublas_sgemm(&blas, &da, &db, &mut dc, s));
        let cublas_tf = fl / cublas_ms / 1e9;
        println!("{m}x{n}x{k}: cuBLAS SGEMM {cublas_ms:.3} ms, {cublas_tf:.1} TFLOP/s");
        // cuBLAS with pedantic math (no reduced-precision shortcuts): the deterministic comparison.
        set_math_mode(&blas, cudarc::cublas::sys::cublasMath_t::CUBLAS_PEDANTIC_MATH);
        let pedantic_ms = median_ms(&dev, || cublas_sgemm(&blas, &da, &db, &mut dc, s));
        set_math_mode(&blas, cudarc::cublas::sys::cublasMath_t::CUBLAS_DEFAULT_MATH);
        let pedantic_tf = fl / pedantic_ms / 1e9;
        println!(
            "  {:<28} {:>8.3} ms {:>7.2} TFLOP/s {:>6.1}% of cuBLAS",
            "cublas_pedantic",
            pedantic_ms,
            pedantic_tf,
            100.0 * pedantic_tf / cublas_tf
        );
        json += &format!(
            "{}{{\"m\":{m},\"n\":{n},\"k\":{k},\"kernel\":\"cublas_pedantic\",\"ms\":{pedantic_ms:.4},\"tflops\":{pedantic_tf:.3},\"cublas_tflops\":{cublas_tf:.3}}}",
            if first { "" } else { "," }
        );
        first = false;
        // the NN ladder, then the tuned rungs reading a transposed operand in place (same sizes)
        for r in RUNGS.iter().chain(LAYOUT_RUNGS) {
            if (r.level <= 2 && m >= 4096) || (r.level <= 4 && m >= 8192) {
                continue; // the first rungs take seconds at this size and teach nothing more
            }
            // the double-buffered rungs race cuBLAS closely: compare them with cuBLAS measured just
            // before and after (the mean), as the tensor-core kernels are; the others with the
            // shape's first cuBLAS figure
            let kiln = || r.run(&dev, &da, &db, &mut dc, s).expect("kiln sgemm");
            let (ms, ref_tf) = if r.name.contains("_db") {
                let mut dc_ref = dev.zeros::<f32>((m * n) as usize).expect("alloc");
                let reference = || cublas_sgemm_layout(&blas, &da, &db, &mut dc_ref, s, r.layout);
                let (ms, ref_ms) = bracketed(&dev, reference, kiln);
                // the reference must compute the same product in the same layout
                let (got, want) = (dev.download(&dc).expect("download"), dev.download(&dc_ref).expect("download"));
                let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(f32::MIN_POSITIVE);
                let worst = got.iter().zip(&want).fold(0.0f32, |m, (g, w)| m.max((g - w).abs()));
                assert!(
                    worst <= 1e-4 * scale,
                    "{} and cuBLAS ({:?}) differ by {worst} (scale {scale})",
                    r.name,
                    r.layout
                );
                (ms, fl / ref_ms / 1e9)
            } else {
                (median_ms(&dev, kiln), cublas_tf)
            };
            let tf = fl / ms / 1e9;
            println!("  {:<28} {:>8.3} ms {:>7.2} TFLOP/s {:>6.1}% of cuBLAS", r.name, ms, tf, 100.0 * tf / ref_tf);
            json += &format!(
                "{}{{\"m\":{m},\"n\":{n},\"k\":{k},\"kernel\":\"{}\",\"ms\":{ms:.4},\"tflops\":{tf:.3},\"cublas_tflops\":{ref_tf:.3}}}",
                if first { "" } else { "," },
                r.name
            );
            first = false;
        }
    }
    // bf16 on the tensor cores: kiln's mma.sync GEMM and (on sm_90a) its wgmma GEMM, C = A B^T with
    // f32 out, against cuBLAS GemmEx with the same types (bf16 in, f32 compute, f32 out).
    let tc_sizes: &[(u32, u32, u32)] = &[
        (2048, 2048, 2048),
        (4096, 4096, 4096),
        (8192, 8192, 8192),
        (4096, 1024, 4096),
        (16384, 3072, 768),
        (16384, 768, 3072),
        (3072, 768, 16384),
        // the weight gradient of small layers over many rows: few tiles, long k (the k split)
        (512, 768, 32768),
        (256, 256, 65536),
    ];
    if want("tc") {
        // The ceilings the mma.sync rungs (bf16) and the megakernel (tf32) climb towards:
        // register-only products, no memory.
        use kiln::gpu::kernels::mma_tile::{MmaSyncPeakBf16, MmaSyncPeakTf32, PEAK_MMAS_PER_ITER};
        let sms = dev.sm_count().expect("SM count") as u32;
        let iters = 4096u32;
        for (dtype, k) in [("bf16", 16u64), ("tf32", 8)] {
            for blocks_per_sm in [1u32, 2] {
                let blocks = sms * blocks_per_sm;
                let mut out = dev.zeros::<f32>((blocks * 8) as usize).expect("alloc");
                let cfg =
                    kiln::cuda::LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
                let ms = median_ms(&dev, || {
                    let args = (out.ptr_mut(), iters);
                    // SAFETY: out holds one float per warp of the grid.
                    unsafe {
                        if k == 16 {
                            dev.launch(MmaSyncPeakBf16, cfg, args)
                        } else {
                            dev.launch(MmaSyncPeakTf32, cfg, args)
                        }
                    }
                    .expect("mma peak")
                });
                let flops = (blocks * 8) as f64 * (2 * 16 * 8 * k * PEAK_MMAS_PER_ITER as u64) as f64 * iters as f64;
                let tf = flops / ms / 1e9;
                println!(
                    "mma.sync {dtype} register-only ceiling, {blocks_per_sm} block(s) of 8 warps per SM: {tf:.1} TFLOP/s"
                );
                json += &format!(
                    "{}{{\"m\":0,\"n\":0,\"k\":0,\"kernel\":\"mma_sync_peak_{dtype}_{blocks_per_sm}x8warps\",\"ms\":{ms:.4},\"tflops\":{tf:.3},\"cublas_tflops\":0}}",
                    if first { "" } else { "," }
                );
                first = false;
            }
        }
    }
    for &(m, n, k) in tc_sizes.iter().filter(|_| want("tc")).filter(keep) {
        use half::bf16;
        let s = GemmShape { m, n, k };
        let fl = 2.0 * m as f64 * n as f64 * k as f64;
        let a: Vec<bf16> = (0..m * k).map(|i| bf16::from_f32(((i % 97) as f32 - 48.0) / 64.0)).collect();
        let b: Vec<bf16> = (0..n * k).map(|i| bf16::from_f32(((i % 89) as f32 - 44.0) / 64.0)).collect();
        let (da, db) = (dev.upload(&a).expect("upload"), dev.upload(&b).expect("upload"));
        let mut dc = dev.zeros::<f32>((m * n) as usize).expect("alloc");
        use cudarc::cublas::sys::cublasComputeType_t::{CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_PEDANTIC};
        let cublas_ms = median_ms(&dev, || cublas_bf16_f32out(&blas, &da, &db, &mut dc, s, CUBLAS_COMPUTE_32F));
        let cublas_tf = fl / cublas_ms / 1e9;
        println!("{m}x{n}x{k} bf16 -> f32: cuBLAS GemmEx {cublas_ms:.3} ms, {cublas_tf:.1} TFLOP/s");
        // `record` compares with the cuBLAS figure above; `record_vs` with one taken just around
        // the kernel (the H200's clocks drift over a run as it heats, so a reference measured
        // minutes earlier favours whichever side ran first).
        let mut record_vs = |name: &str, ms: f64, ref_ms: f64| {
            let (tf, ref_tf) = (fl / ms / 1e9, fl / ref_ms / 1e9);
            println!("  {:<28} {:>8.3} ms {:>7.1} TFLOP/s {:>6.1}% of cuBLAS", name, ms, tf, 100.0 * tf / ref_tf);
            json += &format!(
                "{}{{\"m\":{m},\"n\":{n},\"k\":{k},\"kernel\":\"{name}\",\"ms\":{ms:.4},\"tflops\":{tf:.3},\"cublas_tflops\":{ref_tf:.3}}}",
                if first { "" } else { "," }
            );
            first = false;
        };
        let mut record = |name: &str, ms: f64| record_vs(name, ms, cublas_ms);
        // Pedantic compute: cuBLAS without reduced-precision shortcuts, the deterministic tier's rival.
        record(
            "cublas_bf16_pedantic",
            median_ms(&dev, || cublas_bf16_f32out(&blas, &da, &db, &mut dc, s, CUBLAS_COMPUTE_32F_PEDANTIC)),
        );
        // The deterministic typed tier (the f32 chain, rounded once; b read as k x n: same bytes).
        let mut dc16 = dev.zeros::<half::bf16>((m * n) as usize).expect("alloc");
        record(
            "typed_bf16_f32_tier",
            median_ms(&dev, || kiln::cuda::gemm::typed_gemm(&dev, &da, &db, &mut dc16, s).expect("typed tier")),
        );
        // The tensor-core kernels are each compared with cuBLAS measured just before and just
        // after them (the mean of the two), into its own output buffer.
        let mut dc_ref = dev.zeros::<f32>((m * n) as usize).expect("alloc");
        let mut around_cublas = |f: &mut dyn FnMut()| -> (f64, f64) {
            let reference = || cublas_bf16_f32out(&blas, &da, &db, &mut dc_ref, s, CUBLAS_COMPUTE_32F);
            bracketed(&dev, reference, f)
        };
        {
            use kiln::cuda::gemm::hgemm_with_tile;
            use kiln::gpu::kernels::hgemm_mma::{HGEMM_NARROW, HGEMM_WIDE};
            for (name, tile) in [("hgemm_mma_bf16", HGEMM_NARROW), ("hgemm_mma_bf16_wide", HGEMM_WIDE)] {
                let (ms, r) =
                    around_cublas(&mut || hgemm_with_tile(&dev, tile, &da, &db, &mut dc, s).expect("kiln hgemm"));
                record_vs(name, ms, r);
            }
        }
        if dev.supports::<kiln::gpu::kernels::gemm_wgmma::GemmWgmmaBf16>() {
            use kiln::cuda::gemm::{WgmmaGemm, WgmmaTile};
            for (name, tile) in [
                ("hgemm_mma_bf16_tma", WgmmaTile::MmaSyncTma),
                ("gemm_wgmma_bf16", WgmmaTile::T128x128),
                ("gemm_wgmma_bf16_wide", WgmmaTile::T128x256),
            ] {
                let g = WgmmaGemm::with_tile(&dev, &da, &db, s, tile).expect("wgmma maps");
                let (ms, r) = around_cublas(&mut || g.run(&mut dc).expect("kiln wgmma"));
                record_vs(name, ms, r);
            }
            // the persistent cluster kernel, plain and with the bias + ReLU epilogue fused
            let g = WgmmaGemm::with_tile(&dev, &da, &db, s, WgmmaTile::Persistent).expect("wgmma maps");
            println!(
                "  (persistent grid: {} clusters of 2; suggested k split {})",
                g.persistent_clusters(),
                g.suggested_split_k()
            );
            let (ms, r) = around_cublas(&mut || g.run(&mut dc).expect("kiln wgmma"));
            record_vs("gemm_wgmma_bf16_persistent", ms, r);
            if g.suggested_split_k() > 1 {
                // the opt-in k split (not batch-invariant), where the model suggests one
                let sk = WgmmaGemm::with_tile(&dev, &da, &db, s, WgmmaTile::Persistent)
                    .and_then(|p| {
                        let sp = p.suggested_split_k();
                        p.with_split_k(sp)
                    })
                    .expect("wgmma maps");
                let (ms, r) = around_cublas(&mut || sk.run(&mut dc).expect("kiln wgmma"));
                record_vs(&format!("gemm_wgmma_bf16_persistent_splitk{}", sk.split_k()), ms, r);
            }
            let u = WgmmaGemm::with_tile(&dev, &da, &db, s, WgmmaTile::PersistentUnicast).expect("wgmma maps");
            let (ms, r) = around_cublas(&mut || u.run(&mut dc).expect("kiln wgmma"));
            record_vs("gemm_wgmma_bf16_persistent_unicast", ms, r);
            // the rung before the staged epilogue: C stored from registers
            let rs = WgmmaGemm::with_tile(&dev, &da, &db, s, WgmmaTile::PersistentRegisterStore).expect("wgmma maps");
            let (ms, r) = around_cublas(&mut || rs.run(&mut dc).expect("kiln wgmma"));
            record_vs("gemm_wgmma_bf16_persistent_regstore", ms, r);
            let bias = dev.upload(&vec![0.5f32; n as usize]).expect("upload");
            let epi = kiln::cuda::gemm::GemmEpilogue {
                bias: Some(&bias),
                act: Some(kiln::cuda::gemm::Activation::Relu),
                ..Default::default()
            };
            let (ms, r) = around_cublas(&mut || g.run_with(&mut dc, epi).expect("kiln wgmma"));
            record_vs("gemm_wgmma_bf16_persistent_bias_relu", ms, r);
            // the fused kernel (gemm_wgmma_bf16_fused): bf16 C, a transformer block's epilogue into
            // bf16 (bias, GELU, residual), and the backward layouts read in place (the operands'
            // bytes reinterpreted: a as k x m, b as k x n)
            use kiln::cuda::gemm::{Activation, GemmEpilogue, WgmmaLayout};
            let mut c16 = dev.zeros::<half::bf16>((m * n) as usize).expect("alloc");
            let res = dev.zeros::<half::bf16>((m * n) as usize).expect("alloc");
            let (ms, r) = around_cublas(&mut || g.run_fused(&mut c16, GemmEpilogue::default()).expect("kiln fused"));
            record_vs("gemm_wgmma_bf16_fused_bf16_out", ms, r);
            let block =
                GemmEpilogue { bias: Some(&bias), act: Some(Activation::Gelu), residual: Some(&res), periodic: None };
            let (ms, r) = around_cublas(&mut || g.run_fused(&mut c16, block).expect("kiln fused"));
            record_vs("gemm_wgmma_bf16_fused_bias_gelu_residual_bf16_out", ms, r);
            for (name, layout) in
                [("gemm_wgmma_bf16_fused_ab", WgmmaLayout::AB), ("gemm_wgmma_bf16_fused_atb", WgmmaLayout::AtB)]
            {
                let t = WgmmaGemm::with_layout(&dev, &da, &db, s, layout).expect("wgmma maps");
                let (ms, r) = around_cublas(&mut || t.run(&mut dc).expect("kiln fused"));
                record_vs(name, ms, r);
            }
        }
        // f32 operands as the bf16 matmul precision runs them (a training step's products): each
        // packed to bf16 rows (rounded; transposed where the layout stores it k-major first), then
        // multiplied, the plan made per call. The ratio counts the packing against cuBLAS's
        // product of operands already in bf16.
        let a32: Vec<f32> = a.iter().map(|v| v.to_f32()).collect();
        let b32: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
        let (da32, db32) = (dev.upload(&a32).expect("upload"), dev.upload(&b32).expect("upload"));
        use kiln::cuda::gemm::{Layout, gemm_bf16};
        for (name, layout) in [("nn", Layout::NN), ("nt", Layout::NT), ("tn", Layout::TN)] {
            let (ms, r) =
                around_cublas(&mut || gemm_bf16(&dev, &da32, &db32, &mut dc, s, layout).expect("kiln gemm_bf16"));
            record_vs(&format!("gemm_bf16_from_f32_{name}"), ms, r);
        }
    }
    json += "]}\n";
    let out = std::env::var("KILN_BENCH_OUT").unwrap_or_else(|_| "gemm.json".into());
    if let Err(e) = std::fs::write(&out, json) {
        eprintln!("writing {out}: {e}");
    }
}
