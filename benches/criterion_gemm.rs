//! `cargo bench --bench criterion_gemm`: the matrix products kiln trains with, under criterion's
//! statistics (warm-up, samples, confidence intervals, change against the last run), each beside
//! cuBLAS in the same process. Throughput is reported in elements per second where one "element" is
//! one floating-point operation (2 m n k per product), so `Gelem/s` reads as GFLOP/s.
//!
//! - `cpu_matmul_f32`: the CPU reference backend's `Tensor::matmul` (always runs).
//! - `gemm_f32` (any CUDA GPU): kiln's FP32 dispatcher (`cuda::gemm::sgemm`, the ladder's best rung
//!   for the shape) against cuBLAS SGEMM.
//! - `gemm_bf16` (sm_90a): kiln's persistent `wgmma` GEMM against cuBLAS GemmEx, bf16 in, f32 out.
//!
//! GPU samples are timed with CUDA events around `iters` back-to-back launches. Without a GPU the GPU
//! groups print why they are skipped. `benches/gemm.rs` is the ladder's full table (every rung, JSON
//! for `cargo xtask bench-report`); this one is for tracking the dispatcher's speed over changes.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use cudarc::cublas::CudaBlas;
use kiln::cuda::Device;
use kiln::gpu::kernels::mma_tile::GemmShape;
use kiln::tensor::{DType, Tensor};
use std::time::Duration;

#[path = "cublas.rs"]
mod cublas;
#[path = "timing.rs"]
mod timing;

/// `iters` calls of `f` between two CUDA events on the device's stream.
fn gpu_time(dev: &Device, iters: u64, f: impl FnMut()) -> Duration {
    Duration::from_secs_f64(timing::events_ms(dev, iters, f) / 1e3)
}

fn flops(s: GemmShape) -> Throughput {
    Throughput::Elements(2 * s.m as u64 * s.n as u64 * s.k as u64)
}

fn cpu_matmul(c: &mut Criterion) {
    let mut g = c.benchmark_group("cpu_matmul_f32");
    for n in [64usize, 128, 256] {
        let mut rng = Tensor::rng(n as u64);
        let a = Tensor::randn([n, n], DType::F32, &mut rng);
        let b = Tensor::randn([n, n], DType::F32, &mut rng);
        g.throughput(flops(GemmShape { m: n as u32, n: n as u32, k: n as u32 }));
        g.bench_function(BenchmarkId::new("kiln_cpu", n), |bch| bch.iter(|| a.matmul(&b).expect("cpu matmul")));
    }
    g.finish();
}

/// The device and a cuBLAS handle, or why the GPU groups are skipped.
fn gpu() -> Option<(std::sync::Arc<Device>, CudaBlas)> {
    let dev = match Device::shared() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("criterion_gemm: no GPU ({e}); gemm_f32 and gemm_bf16 skipped");
            return None;
        }
    };
    // SAFETY: only tries to dlopen the library.
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        eprintln!("criterion_gemm: libcublas not found; the GPU groups need cuBLAS in the same run, skipped");
        return None;
    }
    let blas = CudaBlas::new(dev.stream().clone()).expect("cuBLAS handle");
    Some((dev, blas))
}

fn gemm_f32(c: &mut Criterion) {
    let Some((dev, blas)) = gpu() else { return };
    let mut g = c.benchmark_group("gemm_f32");
    g.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    for n in [1024u32, 4096] {
        let s = GemmShape { m: n, n, k: n };
        let len = (n * n) as usize;
        let a: Vec<f32> = (0..len).map(|i| ((i % 97) as f32 - 48.0) / 64.0).collect();
        let (da, db) = (dev.upload(&a).expect("upload"), dev.upload(&a).expect("upload"));
        let mut dc = dev.zeros::<f32>(len).expect("alloc");
        g.throughput(flops(s));
        g.bench_function(BenchmarkId::new("kiln_sgemm", n), |bch| {
            bch.iter_custom(|it| {
                gpu_time(&dev, it, || kiln::cuda::gemm::sgemm(&dev, &da, &db, &mut dc, s).expect("kiln sgemm"))
            })
        });
        g.bench_function(BenchmarkId::new("cublas_sgemm", n), |bch| {
            bch.iter_custom(|it| gpu_time(&dev, it, || cublas::cublas_sgemm(&blas, &da, &db, &mut dc, s)))
        });
    }
    g.finish();
}

fn gemm_bf16(c: &mut Criterion) {
    let Some((dev, blas)) = gpu() else { return };
    if !dev.supports::<kiln::gpu::kernels::gemm_wgmma::GemmWgmmaBf16Persistent>() {
        eprintln!("criterion_gemm: {} has no sm_90a module; gemm_bf16 skipped", dev.name());
        return;
    }
    use cudarc::cublas::sys::cublasComputeType_t::CUBLAS_COMPUTE_32F;
    use half::bf16;
    let mut g = c.benchmark_group("gemm_bf16");
    g.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    for (m, n, k) in [(4096u32, 4096u32, 4096u32), (8192, 8192, 8192), (16384, 3072, 768)] {
        let s = GemmShape { m, n, k };
        let a: Vec<bf16> = (0..m * k).map(|i| bf16::from_f32(((i % 97) as f32 - 48.0) / 64.0)).collect();
        let b: Vec<bf16> = (0..n * k).map(|i| bf16::from_f32(((i % 89) as f32 - 44.0) / 64.0)).collect();
        let (da, db) = (dev.upload(&a).expect("upload"), dev.upload(&b).expect("upload"));
        let mut dc = dev.zeros::<f32>((m * n) as usize).expect("alloc");
        let plan = kiln::cuda::gemm::WgmmaGemm::new(&dev, &da, &db, s).expect("wgmma plan");
        let id = format!("{m}x{n}x{k}");
        g.throughput(flops(s));
        g.bench_function(BenchmarkId::new("kiln_wgmma_persistent", &id), |bch| {
            bch.iter_custom(|it| gpu_time(&dev, it, || plan.run(&mut dc).expect("kiln wgmma")))
        });
        g.bench_function(BenchmarkId::new("cublas_gemm_ex", &id), |bch| {
            bch.iter_custom(|it| {
                gpu_time(&dev, it, || cublas::cublas_bf16_f32out(&blas, &da, &db, &mut dc, s, CUBLAS_COMPUTE_32F))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, cpu_matmul, gemm_f32, gemm_bf16);
criterion_main!(benches);
