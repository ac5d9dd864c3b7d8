//! The FP32 GEMM ladder against cuBLAS SGEMM (TF32 off: cuBLAS's default math for FP32) in the same
//! process: TFLOP/s per rung and size, and the ratio to cuBLAS. Writes JSON to `$KILN_BENCH_OUT`
//! (default `gemm.json`). Run: `cargo bench --bench gemm`, or `benches/gemm` from a GPU bundle.
//! Without a GPU it prints why and exits 0.

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
use kiln::cuda::Device;
use kiln::cuda::gemm::RUNGS;
use kiln::gpu::kernels::mma_tile::GemmShape;
use std::sync::Arc;

const REPS: usize = 10;

#[path = "timing.rs"]
mod timing;

fn median_ms(dev: &Arc<Device>, f: impl FnMut()) -> f64 {
    timing::median_ms(dev, REPS, f)
}

fn main() {
    let dev = match Device::shared() {
        Ok(d) => d,
        Err(e) => {
            println!("gemm bench: no GPU ({e}); nothing measured");
            return;
        }
    };
    // SAFETY: only tries to dlopen the library.
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        println!("gemm bench: libcublas not found (set LD_LIBRARY_PATH); the ratios need cuBLAS in the same run");
        return;
    }
    let blas = CudaBlas::new(dev.stream().clone()).expect("cuBLAS handle");
    let sizes: &[(u32, u32, u32)] = &[(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (4096, 1024, 4096)];
    let mut json = format!("{{\"device\":\"{}\",\"results\":[", dev.name());
    let mut first = true;
    println!("device: {}, median of {REPS}", dev.name());
    for &(m, n, k) in sizes {
        let s = GemmShape { m, n, k };
        let fl = 2.0 * m as f64 * n as f64 * k as f64;
        let a: Vec<f32> = (0..m * k).map(|i| ((i % 97) as f32 - 48.0) / 64.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i % 89) as f32 - 44.0) / 64.0).collect();
        let (da, db) = (dev.upload(&a).expect("upload"), dev.upload(&b).expect("upload"));
        let mut dc = dev.zeros::<f32>((m * n) as usize).expect("alloc");
        // cuBLAS is column-major: C^T = B^T A^T with the row-major buffers as they are.
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: n as i32,
            n: m as i32,
            k: k as i32,
            alpha: 1.0f32,
            lda: n as i32,
            ldb: k as i32,
            beta: 0.0f32,
            ldc: n as i32,
        };
        let cublas_ms =
            median_ms(&dev, || unsafe { blas.gemm(cfg, db.slice(), da.slice(), dc.slice_mut()) }.expect("cublas"));
        let cublas_tf = fl / cublas_ms / 1e9;
        println!("{m}x{n}x{k}: cuBLAS SGEMM {cublas_ms:.3} ms, {cublas_tf:.1} TFLOP/s");
        for r in RUNGS {
            if r.level <= 2 && m >= 4096 {
                continue; // the first rungs take seconds at this size and teach nothing more
            }
            let ms = median_ms(&dev, || r.run(&dev, &da, &db, &mut dc, s).expect("kiln sgemm"));
            let tf = fl / ms / 1e9;
            println!("  {:<28} {:>8.3} ms {:>7.2} TFLOP/s {:>6.1}% of cuBLAS", r.name, ms, tf, 100.0 * tf / cublas_tf);
            json += &format!(
                "{}{{\"m\":{m},\"n\":{n},\"k\":{k},\"kernel\":\"{}\",\"ms\":{ms:.4},\"tflops\":{tf:.3},\"cublas_tflops\":{cublas_tf:.3}}}",
                if first { "" } else { "," },
                r.name
            );
            first = false;
        }
    }
    // bf16 on the tensor cores: kiln's mma.sync GEMM (C = A B^T, f32 out) against cuBLAS bf16
    // (GemmEx, f32 compute, bf16 out) at the same sizes.
    for &(m, n, k) in sizes {
        use half::bf16;
        let s = GemmShape { m, n, k };
        let fl = 2.0 * m as f64 * n as f64 * k as f64;
        let a: Vec<bf16> = (0..m * k).map(|i| bf16::from_f32(((i % 97) as f32 - 48.0) / 64.0)).collect();
        let b: Vec<bf16> = (0..n * k).map(|i| bf16::from_f32(((i % 89) as f32 - 44.0) / 64.0)).collect();
        let (da, db) = (dev.upload(&a).expect("upload"), dev.upload(&b).expect("upload"));
        let mut dc = dev.zeros::<f32>((m * n) as usize).expect("alloc");
        let mut dc16 = dev.zeros::<bf16>((m * n) as usize).expect("alloc");
        // Column-major C^T (n x m) = B (n x k, row-major = k x n column-major)^T... : op(A)=B^T with B
        // stored as k x n column-major means transa = T on the (k x n) buffer.
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_T,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: n as i32,
            n: m as i32,
            k: k as i32,
            alpha: bf16::ONE,
            lda: k as i32,
            ldb: k as i32,
            beta: bf16::ZERO,
            ldc: n as i32,
        };
        let cublas_ms = median_ms(&dev, || {
            unsafe { blas.gemm(cfg, db.slice(), da.slice(), dc16.slice_mut()) }.expect("cublas bf16")
        });
        let cublas_tf = fl / cublas_ms / 1e9;
        let ms = median_ms(&dev, || kiln::cuda::gemm::hgemm(&dev, &da, &db, &mut dc, s).expect("kiln hgemm"));
        let tf = fl / ms / 1e9;
        println!(
            "{m}x{n}x{k} bf16: cuBLAS {cublas_tf:.1} TFLOP/s; hgemm_mma_bf16 {tf:.1} TFLOP/s ({:.1}%)",
            100.0 * tf / cublas_tf
        );
        json += &format!(
            "{}{{\"m\":{m},\"n\":{n},\"k\":{k},\"kernel\":\"hgemm_mma_bf16\",\"ms\":{ms:.4},\"tflops\":{tf:.3},\"cublas_tflops\":{cublas_tf:.3}}}",
            if first { "" } else { "," }
        );
        first = false;
    }
    json += "]}\n";
    let out = std::env::var("KILN_BENCH_OUT").unwrap_or_else(|_| "gemm.json".into());
    if let Err(e) = std::fs::write(&out, json) {
        eprintln!("writing {out}: {e}");
    }
}
