//! The GPU suite: every kernel against a higher-precision CPU reference, on fresh random inputs
//! (the seed is printed; `KILN_SEED` replays it), with outputs poisoned before each launch.
//!
//! Without a GPU each test is reported as ignored, with the count and the reason printed;
//! `KILN_REQUIRE_GPU=1` turns a missing GPU into failures. Tests that need a newer architecture than
//! the device's are ignored with the reason (tcgen05 below compute capability 10.0).

use half::{bf16, f16};
use kiln::cuda::Device;
use kiln::cuda::ops::{self, MatrixLayout, TileProductInput};
use kiln::gpu::Kernel;
use kiln::gpu::kernels::barrier::MbarrierPhases;
use kiln::gpu::kernels::mma_tile::GemmShape;
use kiln::gpu::kernels::tma_tile::{TileTransform, TmaTileTransform};
use kiln::gpu::kernels::tmem::TmemAllocRoundtrip;
use kiln::gpu::swizzle::Swizzle;
use kiln::testing::{self, POISON_F32, Tol, compare};
use libtest_mimic::{Arguments, Failed, Trial};

use std::sync::Arc;

#[path = "backend_cases.rs"]
mod backend_cases;

type Outcome = Result<(), String>;

struct GpuTest {
    name: &'static str,
    /// Whether the device can run it (kernels built only for newer modules).
    available: fn(&Device) -> bool,
    run: fn(&Device) -> Outcome,
}

fn any(_: &Device) -> bool {
    true
}

fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest { name: "gpu::vector_add_matches_cpu", available: any, run: vector_add_matches_cpu },
        GpuTest { name: "gpu::reduce_sum_matches_f64_and_is_deterministic", available: any, run: reduce_sum },
        GpuTest { name: "gpu::mma_tile_bf16", available: any, run: mma_tile::<bf16> },
        GpuTest { name: "gpu::mma_tile_f16", available: any, run: mma_tile::<f16> },
        GpuTest { name: "gpu::mma_tile_tf32", available: any, run: mma_tile::<f32> },
        GpuTest { name: "gpu::mma_tile_rejects_bad_shapes", available: any, run: mma_tile_rejects_bad_shapes },
        GpuTest { name: "gpu::mbarrier_phases", available: |d| d.supports::<MbarrierPhases>(), run: mbarrier_phases },
        GpuTest {
            name: "gpu::tma_tile_round_trip_with_edges",
            available: |d| d.supports::<TmaTileTransform>(),
            run: tma_round_trip,
        },
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
            name: "gpu::large_dynamic_smem_launch",
            available: |d| d.supports::<TmaTileTransform>(),
            run: large_dynamic_smem,
        },
        // The tensor backend: the same cases the CPU backend runs (tests/backend_cases.rs).
        GpuTest {
            name: "gpu::tensor::matmul_matches_naive",
            available: any,
            run: |d| on_cuda(d, backend_cases::matmul_matches_naive),
        },
        GpuTest {
            name: "gpu::tensor::matmul_t_matches_matmul_of_transpose",
            available: any,
            run: |d| on_cuda(d, backend_cases::matmul_t_matches_matmul_of_transpose),
        },
        GpuTest {
            name: "gpu::tensor::broadcast_binary",
            available: any,
            run: |d| on_cuda(d, backend_cases::broadcast_binary),
        },
        GpuTest {
            name: "gpu::tensor::reductions_and_max",
            available: any,
            run: |d| on_cuda(d, backend_cases::reductions_and_max),
        },
        GpuTest {
            name: "gpu::tensor::softmax_and_cross_entropy",
            available: any,
            run: |d| on_cuda(d, backend_cases::softmax_and_cross_entropy),
        },
        GpuTest {
            name: "gpu::tensor::cross_entropy_many_rows_reused_targets",
            available: any,
            run: |d| on_cuda(d, backend_cases::cross_entropy_many_rows_reused_targets),
        },
        GpuTest {
            name: "gpu::tensor::layer_norm_matches_two_pass",
            available: any,
            run: |d| on_cuda(d, backend_cases::layer_norm_matches_two_pass),
        },
        GpuTest {
            name: "gpu::tensor::gelu_and_friends",
            available: any,
            run: |d| on_cuda(d, backend_cases::gelu_and_friends),
        },
        GpuTest {
            name: "gpu::tensor::embedding_and_transpose",
            available: any,
            run: |d| on_cuda(d, backend_cases::embedding_and_transpose),
        },
        GpuTest {
            name: "gpu::tensor::dtypes_round_trip",
            available: any,
            run: |d| on_cuda(d, backend_cases::dtypes_round_trip),
        },
        GpuTest {
            name: "gpu::tensor::gradients_match_cpu",
            available: any,
            run: |d| on_cuda(d, backend_cases::gradients_match_cpu),
        },
        GpuTest {
            name: "gpu::tensor::training_step_matches_cpu",
            available: any,
            run: |d| on_cuda(d, backend_cases::training_step_matches_cpu),
        },
        GpuTest { name: "gpu::train_main_job_on_cuda", available: any, run: train_main_job_on_cuda },
        GpuTest { name: "gpu::sgemm_ladder_matches_f64", available: any, run: sgemm_ladder },
        GpuTest { name: "gpu::f32_tier_bits_match_the_cpu_chain", available: any, run: f32_tier_bits },
        GpuTest {
            name: "gpu::f32_tier_batch_invariant_and_reproducible",
            available: any,
            run: f32_tier_batch_invariance,
        },
        GpuTest { name: "gpu::training_twice_gives_identical_weights", available: any, run: training_twice_identical },
        GpuTest { name: "gpu::eval_outputs_do_not_depend_on_the_batch", available: any, run: eval_batch_invariance },
        GpuTest { name: "gpu::typed_tier_bf16_is_the_f32_chain_rounded_once", available: any, run: typed_tier::<bf16> },
        GpuTest { name: "gpu::typed_tier_f16_is_the_f32_chain_rounded_once", available: any, run: typed_tier::<f16> },
        GpuTest { name: "gpu::triad_bits_match_across_processes", available: any, run: triad_across_processes },
        GpuTest { name: "gpu::megakernel_matches_the_cpu_interpreter", available: any, run: megakernel_matches },
        GpuTest { name: "gpu::megakernel_bits_equal_the_interpreter", available: any, run: megakernel_bits },
        GpuTest { name: "gpu::megakernel_hundred_steps_match", available: any, run: megakernel_hundred_steps },
        GpuTest {
            name: "gpu::tensor_core_tier_batch_invariant_and_reproducible",
            available: any,
            run: tensor_core_tier,
        },
        GpuTest { name: "gpu::megakernel_wrong_count_stalls_not_hangs", available: any, run: megakernel_stall },
        GpuTest {
            name: "gpu::megakernel_tc_matches_the_interpreter_sm90",
            available: mega_tc,
            run: megakernel_tc_matches,
        },
        GpuTest {
            name: "gpu::megakernel_bf16_matches_the_interpreter_sm90",
            available: mega_tc,
            run: megakernel_bf16_matches,
        },
        GpuTest {
            name: "gpu::megakernel_tc_shallow_models_tight_sm90",
            available: mega_tc,
            run: megakernel_tc_shallow,
        },
        GpuTest { name: "gpu::megakernel_tc_hundred_steps_sm90", available: mega_tc, run: megakernel_tc_hundred_steps },
        GpuTest {
            name: "gpu::megakernel_bits_repeat_across_runs_and_schedules_sm90",
            available: mega_tc,
            run: megakernel_tc_bits_repeat,
        },
        GpuTest { name: "gpu::megakernel_tc_random_shapes_sm90", available: mega_tc, run: megakernel_tc_random_shapes },
        GpuTest {
            name: "gpu::megakernel_tf32_stores_its_operands_rounded_sm90",
            available: mega_tc,
            run: megakernel_tf32_operands_rounded,
        },
        GpuTest {
            name: "gpu::megakernel_page_fault_stalls_not_hangs_sm90",
            available: mega_tc,
            run: megakernel_page_fault_stalls,
        },
        GpuTest {
            name: "gpu::megakernel_warp_giving_up_alone_stalls_not_hangs_sm90",
            available: mega_tc,
            run: megakernel_give_up_split,
        },
        GpuTest {
            name: "gpu::megakernel_too_deep_for_shared_memory_is_an_error_sm90",
            available: mega_tc,
            run: megakernel_too_deep,
        },
        GpuTest { name: "gpu::megakernel_trains_the_main_job", available: any, run: megakernel_main_job },
        GpuTest { name: "gpu::sgemm_layouts_read_transposes_in_place", available: any, run: sgemm_layouts_case },
        GpuTest { name: "gpu::hgemm_mma_bf16", available: any, run: hgemm_case::<bf16> },
        GpuTest { name: "gpu::gemm_bf16_of_f32_operands_every_layout", available: any, run: gemm_bf16_case },
        GpuTest { name: "gpu::bf16_matmul_precision_in_autograd", available: any, run: bf16_precision_autograd },
        GpuTest { name: "gpu::train_main_job_bf16_products", available: any, run: train_main_job_bf16 },
        GpuTest { name: "gpu::training_step_captured_in_a_cuda_graph", available: any, run: captured_training_step },
        GpuTest { name: "gpu::hgemm_mma_f16", available: any, run: hgemm_case::<f16> },
        GpuTest { name: "gpu::gemm_ladder_command_runs_every_kernel", available: any, run: ladder_command },
        GpuTest {
            name: "gpu::gemm_wgmma_bf16_sm90",
            available: |d| d.supports::<kiln::gpu::kernels::gemm_wgmma::GemmWgmmaBf16>(),
            run: wgmma_case,
        },
        GpuTest {
            name: "gpu::gemm_tcgen05_bf16_sm100",
            available: |d| d.supports::<kiln::gpu::kernels::gemm_tcgen05::GemmTcgen05Bf16>(),
            run: tcgen05_case,
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

fn main() {
    // A child process of `gpu::triad_bits_match_across_processes`: compute, write, exit.
    if let Ok(path) = std::env::var(TRIAD_CHILD_ENV) {
        let dev = Device::shared().expect("the parent process found a GPU");
        let lines: Vec<String> =
            triad_digests(&dev).expect("triad products").into_iter().map(|(k, d)| format!("{k} {d:016x}")).collect();
        std::fs::write(&path, lines.join("\n")).expect("writing the digests");
        return;
    }
    let args = Arguments::from_args();
    let (_, seed) = testing::rng();
    // One seed for the run, printed so a failure can be replayed.
    // SAFETY: set before any test thread starts.
    unsafe { std::env::set_var("KILN_SEED", seed.to_string()) };
    let device = Device::shared();
    let mut skipped = Vec::new();
    let trials: Vec<Trial> = tests()
        .into_iter()
        .map(|t| match &device {
            Ok(dev) if (t.available)(dev) => {
                let dev: Arc<Device> = dev.clone();
                let run = t.run;
                Trial::test(t.name, move || run(&dev).map_err(Failed::from))
            }
            Ok(dev) => {
                skipped.push(format!(
                    "{} (needs a newer GPU than {} {}.{})",
                    t.name,
                    dev.name(),
                    dev.compute_capability().0,
                    dev.compute_capability().1
                ));
                Trial::test(t.name, || Ok(())).with_ignored_flag(true)
            }
            Err(e) if testing::gpu_required() => {
                let msg = format!("KILN_REQUIRE_GPU=1 but no GPU is usable: {e}");
                Trial::test(t.name, move || Err(Failed::from(msg.as_str())))
            }
            Err(_) => {
                skipped.push(t.name.to_string());
                Trial::test(t.name, || Ok(())).with_ignored_flag(true)
            }
        })
        .collect();
    match &device {
        Ok(dev) => eprintln!(
            "kiln GPU suite on {} ({}.{}, {} module), seed {seed}",
            dev.name(),
            dev.compute_capability().0,
            dev.compute_capability().1,
            dev.arch().name()
        ),
        Err(e) => eprintln!("kiln GPU suite: no GPU ({e})"),
    }
    if !skipped.is_empty() {
        eprintln!("kiln: {} GPU test(s) skipped (reported as ignored): {}", skipped.len(), skipped.join(", "));
    }
    libtest_mimic::run(&args, trials).exit();
}

fn err(e: kiln::Error) -> String {
    e.to_string()
}

fn vector_add_matches_cpu(dev: &Device) -> Outcome {
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

/// Host-side rounding of an input to the type the kernel consumes, and back to f64 exactly.
trait TestInput: TileProductInput {
    fn from_f32(x: f32) -> Self;
    /// The value the tensor core multiplies (tf32 inputs are rounded on the device).
    fn as_f64(self) -> f64;
    /// Relative error of one product from input rounding the reference does not model.
    const INPUT_REL: f64;
}
impl TestInput for bf16 {
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn as_f64(self) -> f64 {
        self.to_f64()
    }
    const INPUT_REL: f64 = 0.0;
}
impl TestInput for f16 {
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn as_f64(self) -> f64 {
        self.to_f64()
    }
    const INPUT_REL: f64 = 0.0;
}
impl TestInput for f32 {
    fn from_f32(x: f32) -> Self {
        x
    }
    fn as_f64(self) -> f64 {
        kiln::gpu::convert::tf32_round_host(self) as f64
    }
    // The reference uses the host model of sm_90's tf32 rounding (cvt.rn: ties to even); allow
    // one tf32 ulp per operand, since sm_80 (cvt.rna) rounds a tie away from zero.
    const INPUT_REL: f64 = 2.0 / 1024.0;
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
                    // Observed on the H200 (2026-11-21): a TMA store clipped at the tensor's last
                    // column also wrote the padding in that column's 16-byte granule (row 0, column
                    // 77 of a 77-column f32 matrix with pitch 80). Those elements are not checked.
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

/// Runs a backend case (which asserts) on the CUDA device.
fn on_cuda(_: &Device, case: fn(&kiln::tensor::Device)) -> Outcome {
    case(&kiln::tensor::Device::Cuda(Device::shared().map_err(err)?));
    Ok(())
}

fn train_main_job_on_cuda(_: &Device) -> Outcome {
    train_main_job(kiln::cuda::MatmulPrecision::F32)
}

/// The main job trained on the GPU for 20 epochs with `precision` products reaches 90 % test
/// accuracy (the CPU backend reaches 0.99), and the thread's precision is back to f32 afterwards.
fn train_main_job(precision: kiln::cuda::MatmulPrecision) -> Outcome {
    use kiln::train::{DataSource, DeviceChoice, TrainConfig};
    let cfg = TrainConfig {
        data: DataSource::Spirals { per_class: 300, classes: 3, noise: 0.2 },
        epochs: 20,
        device: DeviceChoice::Cuda,
        checkpoint: None,
        progress: false,
        matmul_precision: precision,
        ..TrainConfig::default()
    };
    let report = kiln::train::train(&cfg, |l| eprintln!("{l}")).map_err(err)?;
    if !report.device.starts_with("GPU") {
        return Err(format!("trained on {} instead of the GPU", report.device));
    }
    let acc = report.epochs.last().map(|r| r.test_accuracy).unwrap_or(0.0);
    if acc < 0.9 {
        return Err(format!("test accuracy {acc} after 20 epochs on the GPU with {precision:?} products"));
    }
    if kiln::cuda::matmul_precision() != kiln::cuda::MatmulPrecision::F32 {
        return Err("the training left its matmul precision set on this thread".into());
    }
    Ok(())
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

/// Checks `got` (m x n) against the f64 product `A B^T` of `a` (m x k) and `b` (stored n x k),
/// every output within `k 2^-22 sum_p |a_ip b_jp|`: exact products of 16-bit inputs accumulated in
/// f32 over k terms (u = 2^-24, with room for the tensor cores' internal order).
fn check_abt(what: &str, got: &[f32], a: &[f64], b: &[f64], (m, n, k): (usize, usize, usize)) -> Outcome {
    for i in 0..m {
        for j in 0..n {
            let (want, mag) = a[i * k..(i + 1) * k]
                .iter()
                .zip(&b[j * k..(j + 1) * k])
                .fold((0.0f64, 0.0f64), |(d, g), (x, y)| (d + x * y, g + (x * y).abs()));
            let tol = k as f64 * 2f64.powi(-22) * mag + 1e-30;
            compare(&format!("{what} at ({i}, {j})"), &[got[i * n + j]], &[want], Tol { abs: tol, rel: 0.0 })?;
        }
    }
    Ok(())
}

/// f32 values rounded to bf16 (nearest-even), as f64.
fn bf16_round(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| bf16::from_f32(x).to_f64()).collect()
}

/// Row-major `rows x cols` transposed to `cols x rows`.
fn transposed(v: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    (0..rows * cols).map(|i| v[(i % rows) * cols + i / rows]).collect()
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

/// Autograd on CUDA under `MatmulPrecision::Bf16`: `matmul_t` (a Linear layer: NT forward, NN for
/// dx, TN for dw) and `matmul` (NN forward, NT and TN gradients), at 2-D and 3-D inputs whose rows
/// the f32 layout rungs would decline, each output against f64 over the bf16-rounded operands;
/// after the scope ends, the products are the f32 tier's again (bit-identical to the CPU backend).
fn bf16_precision_autograd(_: &Device) -> Outcome {
    use kiln::cuda::{MatmulPrecision, matmul_precision_scope};
    use kiln::tensor::{DType, Device as TDev, Tensor};
    let cuda = TDev::Cuda(Device::shared().map_err(err)?);
    let (mut rng, _) = testing::rng();
    let t = |v: &[f32], shape: &[usize]| -> Result<Tensor, String> {
        Tensor::from_vec(v.to_vec(), shape.to_vec()).map_err(err)?.to_device(&cuda).map_err(err)
    };
    // C (m x n) = A B^T with A, B given as rows of k, against f64 over the rounded values
    let check = |what: &str, got: &Tensor, a: &[f64], b: &[f64], mnk| check_abt(what, &got.to_vec_f32(), a, b, mnk);
    for &(xs, n) in &[(&[37usize, 45][..], 29usize), (&[2, 19, 45], 30), (&[64, 256], 256)] {
        let k = *xs.last().expect("rank >= 2");
        let rows = xs.iter().product::<usize>() / k;
        let (xv, wv) = (testing::uniform(&mut rng, rows * k), testing::uniform(&mut rng, n * k));
        let gv = testing::uniform(&mut rng, rows * n);
        let mut y_shape = xs.to_vec();
        *y_shape.last_mut().expect("rank >= 2") = n;
        let (xr, wr, gr) = (bf16_round(&xv), bf16_round(&wv), bf16_round(&gv));
        let what = format!("x {xs:?}, w [{n}, {k}]");
        // w^T, stored k x n
        let w_t: Vec<f32> = (0..k * n).map(|i| wv[(i % n) * k + i / n]).collect();
        {
            let _bf16 = matmul_precision_scope(MatmulPrecision::Bf16);
            // y = x w^T as `x.matmul_t(w)` (forward NT, dx = g w NN, dw = g^T x TN) and, for 2-D x,
            // as `x.matmul(w^T)` (forward NN, dx NT, d(w^T) = x^T g TN); the gradients of sum(y * g)
            for in_place in [true, false].into_iter().filter(|&t| t || xs.len() == 2) {
                let name = if in_place { "matmul_t" } else { "matmul" };
                let x = t(&xv, xs)?.requires_grad();
                let w = if in_place { t(&wv, &[n, k])? } else { t(&w_t, &[k, n])? }.requires_grad();
                let y = if in_place { x.matmul_t(&w) } else { x.matmul(&w) }.map_err(err)?;
                y.mul(&t(&gv, &y_shape)?).map_err(err)?.sum_all().map_err(err)?.backward().map_err(err)?;
                check(&format!("{name} y, {what}"), &y, &xr, &wr, (rows, n, k))?;
                let dx = x.grad().ok_or("no dx")?;
                check(&format!("{name} dx, {what}"), &dx, &gr, &transposed(&wr, n, k), (rows, k, n))?;
                let dw = w.grad().ok_or("no dw")?;
                let (g_t, x_t) = (transposed(&gr, rows, n), transposed(&xr, rows, k));
                if in_place {
                    check(&format!("{name} dw, {what}"), &dw, &g_t, &x_t, (n, k, rows))?; // dw = g^T x
                } else {
                    check(&format!("{name} d(w^T), {what}"), &dw, &x_t, &g_t, (k, n, rows))?; // x^T g
                }
            }
        }
        // out of the scope: the f32 tier, the CPU's ascending-k FMA chains bit for bit
        let y = t(&xv, xs)?.matmul_t(&t(&wv, &[n, k])?).map_err(err)?;
        let chain = kiln::deterministic::matmul_chain(&xv, &w_t, rows, k, n);
        if bits(&y.to_vec_f32()) != bits(&chain) || y.dtype() != DType::F32 {
            return Err(format!("{what}: after the bf16 scope, matmul_t is not the f32 tier's bits"));
        }
    }
    Ok(())
}

/// The main job trained on the GPU with bf16 products (every Linear's forward and both gradients
/// on the tensor cores): the same accuracy bar as with f32 products.
fn train_main_job_bf16(_: &Device) -> Outcome {
    train_main_job(kiln::cuda::MatmulPrecision::Bf16)
}

/// kiln's layer-by-layer training step (forward, cross-entropy, backward, SGD with momentum,
/// zero_grad) captured into a CUDA graph and replayed: after one eager step and four replays the
/// weights have exactly the bits of five eager steps. A capture that downloads, or (on sm_90a) one
/// of bf16 products, which would make tensor maps, fails with a typed error and leaves the device
/// usable, and so does a panic inside a capture.
fn captured_training_step(dev: &Device) -> Outcome {
    use kiln::nn::{Module, mlp};
    use kiln::optim::{Optimizer, Sgd};
    use kiln::tensor::{DType, Device as TDev, Targets, Tensor};
    let td = TDev::Cuda(Device::shared().map_err(err)?);
    let (batch, features, width, classes) = (24usize, 13usize, 40usize, 7usize);
    let mut rng = Tensor::rng(11);
    let x = Tensor::randn([batch, features], DType::F32, &mut rng).to_device(&td).map_err(err)?;
    let targets = Targets::new((0..batch).map(|i| (i * 5) % classes).collect());
    let build = || -> Result<(kiln::nn::Sequential, Sgd), String> {
        let model = mlp(features, width, 3, classes, kiln::nn::Activation::Relu, DType::F32, &mut Tensor::rng(5))
            .map_err(err)?;
        for p in model.parameters() {
            p.move_to(&td).map_err(err)?;
        }
        let opt = Sgd::new(model.named_parameters(), 0.05, 0.9, 0.0, false);
        Ok((model, opt))
    };
    let step = |model: &kiln::nn::Sequential, opt: &mut Sgd| -> kiln::Result<()> {
        let loss = model.forward(&x)?.cross_entropy(&targets)?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad();
        Ok(())
    };
    let weights = |model: &kiln::nn::Sequential| -> Vec<u32> {
        model.parameters().iter().flat_map(|p| bits(&p.to_vec_f32())).collect()
    };
    let (eager, mut eager_opt) = build()?;
    for _ in 0..5 {
        step(&eager, &mut eager_opt).map_err(err)?;
    }
    let (replayed, mut opt) = build()?;
    step(&replayed, &mut opt).map_err(err)?; // the warm-up: caches filled, momentum allocated
    let before = weights(&replayed);
    let graph = dev.capture(|| step(&replayed, &mut opt)).map_err(err)?;
    if weights(&replayed) != before {
        return Err("capturing the step ran it".into());
    }
    for _ in 0..4 {
        // SAFETY: the model, its optimizer state, x and the targets outlive the replays.
        unsafe { graph.launch() }.map_err(err)?;
    }
    dev.synchronize().map_err(err)?;
    if weights(&replayed) != weights(&eager) {
        return Err("one eager step and four graph replays differ from five eager steps".into());
    }
    // bf16 products need new tensor maps for the graph's buffers: refused with a typed error
    if dev.supports::<kiln::gpu::kernels::gemm_wgmma::GemmWgmmaBf16Persistent>() {
        let _bf16 = kiln::cuda::matmul_precision_scope(kiln::cuda::MatmulPrecision::Bf16);
        step(&eager, &mut eager_opt).map_err(err)?; // eager bf16 steps work
        match dev.capture(|| step(&eager, &mut eager_opt)) {
            Err(e) if e.to_string().contains("tensor map") => eager_opt.zero_grad(),
            other => return Err(format!("capturing a bf16 step gave {other:?}, not the tensor-map error")),
        }
    }
    // a download cannot be captured: a typed error, then the device works as before
    let probe = dev.upload(&[1.0f32, 2.0]).map_err(err)?;
    match dev.capture(|| dev.download(&probe).map(|_| ())) {
        Err(_) => {}
        Ok(_) => return Err("a capture that downloads succeeded".into()),
    }
    if dev.download(&probe).map_err(err)? != [1.0, 2.0] {
        return Err("the device's stream is unusable after a failed capture".into());
    }
    // a panic inside the capture ends it too
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = dev.capture(|| panic!("a panic inside a capture (expected by the test)"));
    }));
    if panicked.is_ok() || dev.is_capturing() || dev.download(&probe).map_err(err)? != [1.0, 2.0] {
        return Err("the device's stream is unusable after a panic inside a capture".into());
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

/// `kiln gemm --kernel NAME` (the guide's one command per rung): every kernel of the ladder this
/// device runs, on an unaligned-but-legal shape, checked in full against f64 and within its bound;
/// an unknown name is a typed error listing the kernels.
fn ladder_command(dev: &Device) -> Outcome {
    let wgmma_here = dev.supports::<kiln::gpu::kernels::gemm_wgmma::GemmWgmmaBf16>();
    let s = GemmShape { m: 200, n: 132, k: 72 }; // n, k multiples of 4 (and k of 8), m odd-sized tiles
    let mut ran = 0;
    for name in kiln::cuda::ladder::kernel_names() {
        if (name.starts_with("gemm_wgmma") || name.ends_with("_tma")) && !wgmma_here {
            continue;
        }
        if name == kiln::cuda::ladder::TCGEN05 && !dev.supports::<kiln::gpu::kernels::gemm_tcgen05::GemmTcgen05Bf16>() {
            // below 10.0 the command refuses it with a typed error instead
            match kiln::cuda::ladder::run(dev, name, s, 2, 7, None) {
                Err(kiln::Error::KernelUnavailable { .. }) => continue,
                other => return Err(format!("{name} below compute capability 10.0 gave {other:?}")),
            }
        }
        let r = kiln::cuda::ladder::run(dev, name, s, 2, 7, None).map_err(|e| format!("{name}: {e}"))?;
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
        let r = kiln::cuda::ladder::run(dev, "gemm_wgmma_bf16_persistent", s, 2, 7, Some(2)).map_err(err)?;
        if !r.passed() || !r.what.contains("2 parts") {
            return Err(format!("{r}"));
        }
    }
    match kiln::cuda::ladder::run(dev, "sgemm_nope", s, 1, 7, None) {
        Err(kiln::Error::Unsupported { what, .. }) if what.contains("sgemm_smem") => Ok(()),
        other => Err(format!("an unknown kernel must be refused with the list, got {other:?}")),
    }
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

type Buf<T> = kiln::cuda::DeviceBuffer<T>;

/// One `C = A B^T` case of a bf16 kernel: fresh random operands, the output poisoned first, `run`
/// launched, every output checked against f64 ([`check_abt`]).
fn bf16_abt_case(
    dev: &Device,
    rng: &mut rand::rngs::StdRng,
    s: GemmShape,
    what: &str,
    run: impl FnOnce(&Buf<bf16>, &Buf<bf16>, &mut Buf<f32>, GemmShape) -> kiln::Result<()>,
) -> Outcome {
    let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
    let a: Vec<bf16> = testing::uniform(rng, m * k).into_iter().map(bf16::from_f32).collect();
    let b: Vec<bf16> = testing::uniform(rng, n * k).into_iter().map(bf16::from_f32).collect();
    let (da, db) = (dev.upload(&a).map_err(err)?, dev.upload(&b).map_err(err)?);
    let mut dc = dev.upload(&vec![POISON_F32; m * n]).map_err(err)?;
    run(&da, &db, &mut dc, s).map_err(err)?;
    let got = dev.download(&dc).map_err(err)?;
    let (a64, b64): (Vec<f64>, Vec<f64>) =
        (a.iter().map(|x| x.to_f64()).collect(), b.iter().map(|x| x.to_f64()).collect());
    check_abt(&format!("{what} {m}x{n}x{k}"), &got, &a64, &b64, (m, n, k))
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

/// The persistent wgmma GEMM with its fused epilogue (bias, then ReLU or GELU) against f64, on a
/// product with more cluster tiles than clusters fit (every cluster takes several tiles, so the
/// ring's parity runs on across tiles) and odd edges, through both epilogues: n a multiple of 4
/// takes the staged TMA stores (whose clipping does the masking), other n the register stores. The
/// same plan run into a second output must give the same bits (the C map follows the buffer). And
/// a refused epilogue on a non-fusing tile.
fn wgmma_persistent_epilogue_case(dev: &Device) -> Outcome {
    use kiln::cuda::gemm::{GemmEpilogue, WgmmaGemm, WgmmaTile};
    use kiln::nn::Activation;
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
        plan.run_with(&mut dc, GemmEpilogue { bias: Some(&dbias), act }).map_err(err)?;
        let got = dev.download(&dc).map_err(err)?;
        let mut dc2 = dev.upload(&vec![POISON_F32; (m * n) as usize]).map_err(err)?;
        plan.run_with(&mut dc2, GemmEpilogue { bias: Some(&dbias), act }).map_err(err)?;
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
    match plan.run_with(&mut c, GemmEpilogue { bias: None, act: Some(Activation::Relu) }) {
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

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
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

const TRIAD_CHILD_ENV: &str = "KILN_TRIAD_CHILD";

/// FNV-1a over the bits of a product.
fn digest(v: &[f32]) -> u64 {
    v.iter()
        .flat_map(|x| x.to_bits().to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// Digests of every kernel the triad can pick, over the shape classes (tiny, narrow, a one-row
/// batch, a long reduction, large), from fixed inputs (seed 1234, not the run's seed).
fn triad_digests(dev: &Device) -> Result<Vec<(String, u64)>, String> {
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

fn mk_weights(dims: &[usize], seed: u64) -> Vec<Vec<f32>> {
    let mut rng = kiln::Tensor::rng(seed);
    (0..dims.len() - 1)
        .map(|l| {
            let std = (2.0 / dims[l] as f64).sqrt();
            kiln::Tensor::randn([dims[l + 1] * dims[l]], kiln::DType::F32, &mut rng)
                .to_vec_f64()
                .iter()
                .map(|&v| (v * std) as f32)
                .collect()
        })
        .collect()
}

fn mega_tc(d: &Device) -> bool {
    kiln::megakernel::tensor_core_step_supported(d)
}

/// How close the megakernel's weights must be to the interpreter's.
#[derive(Clone, Copy, Debug)]
enum MegaBound {
    /// Bit for bit (the CUDA-core path computes in the interpreter's order, with its `exp`).
    Bits,
    /// Within a tolerance.
    Tol(Tol),
    /// For the tensor-core paths, whose sums are ordered differently: every weight within `frac`
    /// of the layer's largest change from the start, except at most `outliers` (a fraction of the
    /// layer), each still within that largest change. The exceptions are ReLU units whose
    /// pre-activation sits within rounding of 0 and takes the other side: the unit's whole
    /// gradient row flips (one row of 256 in the H200 runs), which no tolerance on sums covers.
    Update { frac: f64, outliers: f64 },
    /// The whole update within `.0` of its norm (see [`TC_DEEP`]), and no weight off by more than
    /// the layer's largest update or `.1`, whichever is larger (`.1` is 0 but where the shadows
    /// widen it, [`Shadows::widen`]).
    UpdateNorm(f64, f64),
}

/// The bound of the tensor-core paths on models with hidden layers: the update's error in norm,
/// `||got - want|| <= 5e-2 ||want - w0||`, and no weight off by more than the largest update. Their
/// sums are ordered differently from the interpreter's, so a ReLU unit whose pre-activation sits
/// within rounding of 0 can take the other side; its batch row's whole gradient then changes
/// below it, moving every lower layer's update by up to about 1/batch of its size (seen on the
/// H200: 1.4 % of the update on 17 % of a layer's weights, 3xTF32, batch 64). Wrong products
/// (a lost K block, a misplaced fragment) move the update by far more than 5 %. The tight checks of
/// the products are [`megakernel_tc_shallow`] (no ReLU above any product) and the bit-identity
/// of runs and schedules.
const TC_DEEP: MegaBound = MegaBound::UpdateNorm(5e-2, 0.0);

/// [`TC_DEEP`] for a model of `layers` layers and `batch` rows on `path`: tf32's input rounding
/// (about 2^-11) compounds down the backward chain, so its bound grows with depth, 1.5 % per layer
/// (seen on the H200: 5.8 % in norm at the first layer of a 10-layer model). And one flipped ReLU
/// moves a lower layer's update by up to about 1 / batch, so below 20 rows the bound is 1 / batch
/// (seen on the H200, reproducibly with one seed: 7.8 % in norm at layer 2 of a 5-layer tf32 model,
/// batch 14, widths [61, 2121, 161, 226, 199, 11]).
fn tc_deep(path: kiln::megakernel::DataPath, layers: usize, batch: usize) -> MegaBound {
    let MegaBound::UpdateNorm(base, _) = TC_DEEP else { unreachable!("TC_DEEP bounds the update norm") };
    let depth = match path {
        kiln::megakernel::DataPath::Tf32 => 1.5e-2 * layers as f64,
        _ => base,
    };
    let flip = if layers > 1 { 1.0 / batch as f64 } else { 0.0 };
    MegaBound::UpdateNorm(base.max(depth).max(flip), 0.0)
}

/// Checks `got` against the interpreter's `want` (layer weights that started at `w0`).
fn mega_check(what: &str, got: &[f32], want: &[f32], w0: &[f32], bound: MegaBound) -> Outcome {
    let want64 = || want.iter().map(|&v| v as f64).collect::<Vec<_>>();
    match bound {
        MegaBound::Bits => match got.iter().zip(want).position(|(a, b)| a.to_bits() != b.to_bits()) {
            Some(i) => Err(format!("{what}: weight {i} is {} on the GPU, {} on the CPU", got[i], want[i])),
            None => Ok(()),
        },
        MegaBound::Tol(tol) => compare(what, got, &want64(), tol),
        MegaBound::UpdateNorm(frac, slack) => {
            let largest = want.iter().zip(w0).map(|(w, s)| (w - s).abs() as f64).fold(0.0, f64::max);
            let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
            let off = norm(&mut got.iter().zip(want).map(|(g, w)| *g as f64 - *w as f64));
            let update = norm(&mut want.iter().zip(w0).map(|(w, s)| *w as f64 - *s as f64));
            if !(off <= frac * update) {
                return Err(format!(
                    "{what}: the update is off by {off:e} in norm, over {frac} of its norm {update:e}"
                ));
            }
            let allowed = largest.max(slack);
            match (0..got.len()).find(|&i| !((got[i] as f64 - want[i] as f64).abs() <= allowed)) {
                Some(i) => Err(format!(
                    "{what}: weight {i} is {} on the GPU, {} on the CPU (largest update {largest:e}, \
                     shadows' spread {slack:e})",
                    got[i], want[i]
                )),
                None => Ok(()),
            }
        }
        MegaBound::Update { frac, outliers } => {
            let largest = want.iter().zip(w0).map(|(w, s)| (w - s).abs() as f64).fold(0.0, f64::max);
            let err = |i: usize| (got[i] as f64 - want[i] as f64).abs();
            let over: Vec<usize> = (0..got.len()).filter(|&i| !(err(i) <= frac * largest)).collect();
            if let Some(&i) = over.iter().find(|&&i| !(err(i) <= largest)) {
                return Err(format!(
                    "{what}: weight {i} is {} on the GPU, {} on the CPU: off by more than the largest update {largest:e}",
                    got[i], want[i]
                ));
            }
            if over.len() as f64 > outliers * got.len() as f64 {
                // report the bulk failure through the shared comparison helper
                return compare(what, got, &want64(), Tol { abs: frac * largest, rel: 0.0 });
            }
            Ok(())
        }
    }
}

/// Shadows of the interpreter for norm bounds: the interpreter again, each step computed from its
/// weights nudged by the relative size of the path's rounding (f32's for 3xTF32 and the CUDA cores,
/// tf32's for tf32; f32's for bf16 too, whose reference rounds the weights to bf16 where products
/// read them, so there a nudge survives only for weights near a rounding midpoint and the shadows
/// mostly repeat the interpreter), each shadow with its own signs, and the resulting update applied to the
/// un-nudged weights: a shadow parts from the interpreter only through what such errors do to the
/// updates. That can be a ReLU whose input is within rounding of 0 flipping, after which the
/// trajectories part: on the H200, with one seed, a 3-layer 3xTF32 model ended 7.5 % off in norm
/// after 100 steps, and its shadows up to 8.1 %; with another, one step of a 13-layer tf32 model
/// with layers 2 and 3 wide was 20.9 % off at its first layer. Two ways to use them:
/// [`Shadows::nearest`] checks the GPU with the fixed bound against whichever trajectory (the
/// interpreter's or a shadow's) it is nearest, which stays sharp however many shadows there are;
/// [`Shadows::widen`] lets the GPU be as far from the interpreter as twice the farthest shadow, or
/// the fixed bound, whichever is larger (the random-shapes test, with two, or eight on bf16, where
/// a shadow parts rarely but then far: see there).
struct Shadows {
    states: Vec<kiln::megakernel::StepState>,
    nudge: f32,
}

/// Shadows of [`megakernel_vs_interpreter`]'s norm-bounded multi-step checks (against the nearest
/// trajectory). Three missed a split: with seed 1795326041554152719 the 3xTF32 hundred-step model
/// ended 6.9 % off the interpreter at layer 0 (a trajectory split, not a regression: the kernels
/// of 3e62a2e gave the same 6.9 %, and so did either tf32 rounding), and its three shadows at most
/// 0.2 % off; of twelve, five took that same split (6.925 %: f32-sized nudges of the interpreter
/// reach the GPU's trajectory) and seven did not (H200, 2026-11-22). Twelve cost about 17 s of CPU
/// on that test.
const SHADOWS: usize = 12;

impl Shadows {
    fn new(
        shape: &kiln::megakernel::MlpShape,
        w0: &[Vec<f32>],
        path: kiln::megakernel::DataPath,
        count: usize,
    ) -> Result<Shadows, String> {
        let nudge = if path == kiln::megakernel::DataPath::Tf32 { 2f32.powi(-11) } else { 2f32.powi(-20) };
        let states = (0..count).map(|_| reference_state(shape, w0, path)).collect::<Result<_, _>>()?;
        Ok(Shadows { states, nudge })
    }

    /// One step of every shadow, as the interpreter's step `step` on `inp`.
    fn step(
        &mut self,
        schedule: &kiln::megakernel::Schedule,
        inp: &kiln::megakernel::StepInputs<'_>,
        step: usize,
    ) -> Outcome {
        for (si, sh) in self.states.iter_mut().enumerate() {
            let base = sh.weights.clone();
            for (l, w) in sh.weights.iter_mut().enumerate() {
                for (i, v) in w.iter_mut().enumerate() {
                    let h = (i as u64 ^ ((step * 8 + l) as u64) << 32 ^ (si as u64) << 56)
                        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    *v *= if h >> 63 == 0 { 1.0 + self.nudge } else { 1.0 - self.nudge };
                }
            }
            let nudged = sh.weights.clone();
            kiln::megakernel::interpret(schedule, sh, inp, step as u64).map_err(err)?;
            for ((w, b), n) in sh.weights.iter_mut().zip(&base).zip(&nudged) {
                for ((v, b), n) in w.iter_mut().zip(b).zip(n) {
                    *v = b + (*v - n); // the nudged step's update, on the un-nudged weights
                }
            }
        }
        Ok(())
    }

    /// Of the interpreter's weights `want` for layer `l` and the shadows' weights for it, those
    /// nearest to `got` in norm.
    fn nearest<'a>(&'a self, l: usize, got: &[f32], want: &'a [f32]) -> &'a [f32] {
        let dist = |a: &[f32]| a.iter().zip(got).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum::<f64>();
        self.states
            .iter()
            .map(|sh| sh.weights[l].as_slice())
            .fold(want, |best, c| if dist(c) < dist(best) { c } else { best })
    }

    /// `bound` for layer `l`, whose interpreter weights are `want` (from `w0`), widened (norm
    /// bounds only): the norm fraction to twice the farthest shadow's distance from them relative
    /// to the update, and the per-weight allowance to twice the largest difference of any shadow's
    /// weight from the interpreter's. A trajectory split moves single weights by more than the
    /// largest update: `gpu::megakernel_tc_random_shapes_sm90`, seed 1795360632990212445 case 7
    /// (tf32, 15 layers with widths down to 2), had layer 1's weight 192 at 2.158025 on the H200
    /// (run 118) against the interpreter's 2.1582243, largest update 1.6e-4; replayed on the CPU,
    /// 4 of 12 tf32-nudged shadows land at 2.158025-2.158030, and the first of them (the test runs
    /// two) has weights up to 9.6e-4 from the interpreter's.
    fn widen(&self, bound: MegaBound, l: usize, want: &[f32], w0: &[f32]) -> MegaBound {
        let MegaBound::UpdateNorm(frac, slack) = bound else { return bound };
        let norm =
            |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum::<f64>().sqrt();
        let update = norm(want, w0);
        let parted = self.states.iter().map(|sh| norm(&sh.weights[l], want) / update).fold(0.0, f64::max);
        let spread = self
            .states
            .iter()
            .flat_map(|sh| sh.weights[l].iter().zip(want).map(|(a, b)| (*a as f64 - *b as f64).abs()))
            .fold(0.0, f64::max);
        MegaBound::UpdateNorm(frac.max(2.0 * parted), slack.max(2.0 * spread))
    }
}

/// Both update placements: the fused weight-gradient-and-update tiles and the separate ones.
const BOTH_UPDATES: [kiln::megakernel::Updates; 2] =
    [kiln::megakernel::Updates::Fused, kiln::megakernel::Updates::Separate];
/// The default placement only (the long runs).
const FUSED: [kiln::megakernel::Updates; 1] = [kiln::megakernel::Updates::Fused];

/// The interpreter's state for a comparison with `path`'s kernel: on [`DataPath::Bf16`] and
/// [`DataPath::Tf32`] it rounds the products' operands as the kernel does
/// ([`StepState::with_operands`]), so that only the order of the f32 sums (and what that moves)
/// parts them; on the others it multiplies f32 values. (Until run 195 the tf32 reference
/// multiplied f32 values too; on deep, narrow models the operands' rounding then grew past the
/// per-layer bound: `megakernel_tc_random_shapes_sm90` at seeds 1795654894369148781 (run 187) and
/// 1795658016780995336 (run 194), 0.18 and 0.20 of the update's norm against 0.15 and 0.18.)
///
/// [`DataPath::Bf16`]: kiln::megakernel::DataPath::Bf16
/// [`DataPath::Tf32`]: kiln::megakernel::DataPath::Tf32
/// [`StepState::with_operands`]: kiln::megakernel::StepState::with_operands
fn reference_state(
    shape: &kiln::megakernel::MlpShape,
    w0: &[Vec<f32>],
    path: kiln::megakernel::DataPath,
) -> Result<kiln::megakernel::StepState, String> {
    use kiln::megakernel::{DataPath, StepState};
    let rounding = if matches!(path, DataPath::Bf16 | DataPath::Tf32) { path } else { DataPath::CudaCores };
    Ok(StepState::new(shape, w0.to_vec()).map_err(err)?.with_operands(rounding))
}

/// The megakernel against the CPU interpreter of the same schedule ([`reference_state`]), for
/// every tile of `path` and every update placement of `updates`: weights after `steps` steps
/// (checked at the first and the last) within `bound` of the interpreter's, or for a norm bound
/// over several steps, of the nearest of the interpreter's and its [`SHADOWS`] shadows' (see
/// [`Shadows`]).
fn megakernel_vs_interpreter(
    path: kiln::megakernel::DataPath,
    cases: &[(usize, Vec<usize>, kiln::megakernel::Loss, f32)],
    steps: usize,
    bound: MegaBound,
    updates: &[kiln::megakernel::Updates],
) -> Outcome {
    use kiln::megakernel::{GpuStep, MlpShape, StepInputs, build_with_tile, interpret};
    let dev = Device::shared().map_err(err)?;
    let sms = dev.sm_count().map_err(err)?;
    let (mut rng, _) = testing::rng();
    for (batch, dims, loss, momentum) in cases {
        let (batch, loss, momentum) = (*batch, *loss, *momentum);
        for (&tile, &placement) in path.tiles().iter().flat_map(|t| updates.iter().map(move |u| (t, u))) {
            let shape = MlpShape { batch, dims: dims.clone() };
            let schedule = build_with_tile(&shape, sms.min(64), tile, placement, path.weight_reads()).map_err(err)?;
            let w0 = mk_weights(dims, 11);
            let mut gpu = GpuStep::new(dev.clone(), &schedule, &w0, path).map_err(err)?;
            let mut cpu = reference_state(&shape, &w0, path)?;
            let count = if matches!(bound, MegaBound::UpdateNorm(..)) && steps > 1 { SHADOWS } else { 0 };
            let mut shadows = Shadows::new(&shape, &w0, path, count)?;
            for step in 0..steps {
                let x = testing::uniform(&mut rng, batch * dims[0]);
                let y = testing::uniform(&mut rng, batch * dims[dims.len() - 1]);
                let classes: Vec<usize> = (0..batch).map(|i| (i * 7 + step) % dims[dims.len() - 1]).collect();
                let inp = StepInputs { x: &x, y: &y, classes: &classes, loss, lr: 0.05, momentum };
                gpu.step(&inp).map_err(err)?;
                interpret(&schedule, &mut cpu, &inp, step as u64).map_err(err)?;
                shadows.step(&schedule, &inp, step)?;
                if step != 0 && step + 1 != steps {
                    continue;
                }
                for (l, (g, c)) in gpu.weights().map_err(err)?.iter().zip(&cpu.weights).enumerate() {
                    let what = format!("megakernel {path:?} {dims:?} {loss:?} tile {tile} step {step} layer {l}");
                    mega_check(&what, g, shadows.nearest(l, g, c), &w0[l], bound)?;
                }
            }
        }
    }
    Ok(())
}

/// Shapes that cover every opcode's edge tiles, both losses, momentum and a batch of one.
fn megakernel_edge_cases() -> Vec<(usize, Vec<usize>, kiln::megakernel::Loss, f32)> {
    use kiln::megakernel::Loss;
    vec![
        (64usize, vec![256usize, 256, 256, 256, 10], Loss::CrossEntropy, 0.0f32),
        (100, vec![37, 130, 65, 10], Loss::Mse, 0.9),
        (1, vec![3, 1], Loss::Mse, 0.0),
        (300, vec![20, 200, 5], Loss::CrossEntropy, 0.5),
    ]
}

/// Weights after 1 and 3 steps, within 1e-5, on shapes that cover every opcode's edge tiles.
fn megakernel_matches(_: &Device) -> Outcome {
    megakernel_vs_interpreter(
        kiln::megakernel::DataPath::CudaCores,
        &megakernel_edge_cases(),
        3,
        MegaBound::Tol(Tol { abs: 1e-5, rel: 1e-5 }),
        &BOTH_UPDATES,
    )
}

/// Bit for bit: the products are the interpreter's FMA chains, and the loss uses its sum order.
fn megakernel_bits(_: &Device) -> Outcome {
    use kiln::megakernel::Loss;
    let cases =
        [(100usize, vec![37usize, 130, 65, 10], Loss::CrossEntropy, 0.9f32), (33, vec![70, 40, 3], Loss::Mse, 0.0)];
    megakernel_vs_interpreter(kiln::megakernel::DataPath::CudaCores, &cases, 2, MegaBound::Bits, &BOTH_UPDATES)
}

/// 100 training steps with momentum, still within 1e-5 of the interpreter (bits, if the test above
/// passes; a tolerance here so that this test also reports how far apart they drift if not).
fn megakernel_hundred_steps(_: &Device) -> Outcome {
    use kiln::megakernel::Loss;
    let cases = [(64usize, vec![32usize, 96, 96, 10], Loss::CrossEntropy, 0.9f32)];
    megakernel_vs_interpreter(
        kiln::megakernel::DataPath::CudaCores,
        &cases,
        100,
        MegaBound::Tol(Tol { abs: 1e-5, rel: 1e-5 }),
        &FUSED,
    )
}

/// The tensor-core paths against the interpreter's FMA chains ([`reference_state`]) on the
/// edge-case models, after 1 and 3 steps, within [`TC_DEEP`].
fn megakernel_tc_matches(_: &Device) -> Outcome {
    use kiln::megakernel::DataPath;
    let cases = megakernel_edge_cases();
    megakernel_vs_interpreter(DataPath::Tf32x3, &cases, 3, TC_DEEP, &BOTH_UPDATES)?;
    megakernel_vs_interpreter(DataPath::Tf32, &cases, 3, TC_DEEP, &BOTH_UPDATES)
}

/// [`megakernel_tc_matches`] for the bf16 path (a test of its own: the shadows' interpreter runs
/// take most of a test's minute), against the interpreter rounding the same operands
/// ([`reference_state`]).
fn megakernel_bf16_matches(_: &Device) -> Outcome {
    megakernel_vs_interpreter(kiln::megakernel::DataPath::Bf16, &megakernel_edge_cases(), 3, TC_DEEP, &BOTH_UPDATES)
}

/// The tensor-core products checked tightly where no ReLU decision can flip above them: a linear
/// model (forward and weight gradient) and one hidden layer (a unit that flips, in any batch row,
/// changes that unit's weight row of the first layer and its column of the second). 3xTF32: every
/// weight within 2e-3 of the largest update (f32-like sums), with 0.5 % outliers (one unit);
/// tf32: within 5 % (10-bit inputs), with 1.5 % outliers (three units of [100, 257, 10]): its
/// coarser sums flip two units now and then (`KILN_SEED=1795357508846178453`, runs 109-110: 172
/// weights of the first layer, 0.67 %, the same bits before and after the change that stores
/// operands rounded; 0 of 16 other seeds). bf16, against the interpreter rounding the same
/// operands ([`reference_state`]): the f32 sums' order is all that differs, as on 3xTF32, but a
/// stored operand whose f32 value sits at a bf16 rounding boundary can round the other way (one
/// bf16 step, 2^-8 relative), so within 5e-3 of the largest update, 0.5 % outliers.
fn megakernel_tc_shallow(_: &Device) -> Outcome {
    use kiln::megakernel::{DataPath, Loss};
    let cases = [
        (200usize, vec![300usize, 70], Loss::Mse, 0.0f32),
        (77, vec![129, 64], Loss::CrossEntropy, 0.9),
        (130, vec![100, 257, 10], Loss::CrossEntropy, 0.5),
    ];
    let (x3, x1) =
        (MegaBound::Update { frac: 2e-3, outliers: 0.005 }, MegaBound::Update { frac: 5e-2, outliers: 0.015 });
    megakernel_vs_interpreter(DataPath::Tf32x3, &cases, 3, x3, &BOTH_UPDATES)?;
    megakernel_vs_interpreter(DataPath::Tf32, &cases, 3, x1, &BOTH_UPDATES)?;
    megakernel_vs_interpreter(
        DataPath::Bf16,
        &cases,
        3,
        MegaBound::Update { frac: 5e-3, outliers: 0.005 },
        &BOTH_UPDATES,
    )
}

/// 100 steps with momentum 0.9 on the 3xTF32 path. Training amplifies the last-bit differences
/// of reordered sums (the CUDA-core path, bit-identical, has none), and near-zero ReLU units that
/// flip: measured on the H200, up to 4.8e-4 apart after 100 steps on weights of about 0.1, with
/// one weight of 9216 off by 2.9e-3. Bound: [`TC_DEEP`] on the distance travelled.
fn megakernel_tc_hundred_steps(_: &Device) -> Outcome {
    use kiln::megakernel::{DataPath, Loss};
    let cases = [(64usize, vec![32usize, 96, 96, 10], Loss::CrossEntropy, 0.9f32)];
    megakernel_vs_interpreter(DataPath::Tf32x3, &cases, 100, TC_DEEP, &FUSED)
}

/// Weights after `steps` steps of `path` with the schedule for `sms` SMs (fixed inputs).
fn megakernel_weights_after(
    path: kiln::megakernel::DataPath,
    shape: &kiln::megakernel::MlpShape,
    sms: usize,
    tile: u32,
    steps: usize,
    traced: bool,
) -> Result<(Vec<Vec<f32>>, u32), String> {
    use kiln::megakernel::{GpuStep, Loss, StepInputs, Updates, build_with_tile};
    let schedule = build_with_tile(shape, sms, tile, Updates::default(), path.weight_reads()).map_err(err)?;
    let mut gpu =
        GpuStep::new(Device::shared().map_err(err)?, &schedule, &mk_weights(&shape.dims, 5), path).map_err(err)?;
    gpu.set_trace(traced).map_err(err)?;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(17);
    let last = shape.dims[shape.layers()];
    for step in 0..steps {
        let x = testing::uniform(&mut rng, shape.batch * shape.dims[0]);
        let classes: Vec<usize> = (0..shape.batch).map(|i| (i * 5 + step) % last).collect();
        let inp = StepInputs { x: &x, y: &[], classes: &classes, loss: Loss::CrossEntropy, lr: 0.05, momentum: 0.9 };
        gpu.step(&inp).map_err(err)?;
    }
    if traced {
        check_trace(&gpu.trace().map_err(err)?, path, schedule.tile, schedule.order.len())?;
    }
    Ok((gpu.weights().map_err(err)?, schedule.tile))
}

/// A traced step's stamps are complete and in order: every instruction signalled; each stamp the
/// data path writes for its kind of instruction is present, and they follow the instruction's life
/// (`kiln_gpu::megakernel::trace`). The loader stamps the products, and the loss tiles whose
/// logits it stages (`box_slot_uses`: bf16 at tile 128).
fn check_trace(
    t: &kiln::megakernel::StepTrace,
    path: kiln::megakernel::DataPath,
    tile: u32,
    instructions: usize,
) -> Outcome {
    use kiln::gpu::megakernel::{box_slot_uses, opcode, trace as at};
    if t.records.len() != instructions || t.unfinished() != 0 {
        return Err(format!(
            "trace of {} instructions, {} unfinished; want {instructions}, 0",
            t.records.len(),
            t.unfinished()
        ));
    }
    for (k, r) in t.records.iter().enumerate() {
        let product = !matches!(r.instruction.opcode, opcode::LOSS_GRAD | opcode::SGD_UPDATE)
            || box_slot_uses(r.instruction.opcode, path.code(), tile) > 0;
        let chain: &[u32] = match path {
            kiln::megakernel::DataPath::CudaCores => &[at::START, at::FIRST, at::STORED, at::SIGNALED],
            _ => &[at::START, at::FIRST, at::WORK_DONE, at::STORED, at::SIGNALED],
        };
        let loader: &[u32] = match (path, product) {
            (kiln::megakernel::DataPath::CudaCores, _) | (_, false) => &[],
            (_, true) => &[at::LOADER_START, at::LOADER_DEPS, at::LOADER_ISSUED],
        };
        for seq in [chain, loader] {
            let got: Vec<Option<u64>> = seq.iter().map(|&w| r.stamps[w as usize]).collect();
            if got.iter().any(Option::is_none) || got.windows(2).any(|p| p[0] > p[1]) {
                return Err(format!("{path:?} instruction {k} ({:?}): stamps {seq:?} = {got:?}", r.instruction));
            }
        }
        let written = r.stamps.iter().filter(|s| s.is_some()).count();
        if written != chain.len() + loader.len() {
            return Err(format!(
                "{path:?} instruction {k}: {written} stamps written, want {}",
                chain.len() + loader.len()
            ));
        }
        // the cycle counts: on tensor-core products and loss gradients, waits within their spans;
        // elsewhere none
        let [ready_wait, work, free_wait, issue] = r.cycles;
        let loss_on_tc = r.instruction.opcode == opcode::LOSS_GRAD && path != kiln::megakernel::DataPath::CudaCores;
        let ok = match (loader.is_empty(), loss_on_tc) {
            (false, _) => work > 0 && issue > 0 && ready_wait <= work && free_wait <= issue,
            (true, true) => work > 0 && ready_wait <= work && free_wait == 0 && issue == 0,
            (true, false) => r.cycles == [0; 4],
        };
        if !ok {
            return Err(format!("{path:?} instruction {k} ({:?}): cycle counts {:?}", r.instruction, r.cycles));
        }
    }
    Ok(())
}

/// Bit-identical weights across runs, and across schedules: every output tile is one block's
/// fixed-order product whichever SM runs it, so the schedule for all SMs and one for 3 SMs (each
/// block then makes thousands of page uses, far past the one parity bit's wrap-around) agree bit
/// for bit after 5 steps, on every tensor-core precision at each of its tiles and on the CUDA-core
/// path (tile 64); so does a traced run, whose last step's stamps must be complete and in order.
fn megakernel_tc_bits_repeat(dev: &Device) -> Outcome {
    use kiln::megakernel::{DataPath, MlpShape};
    let sms = dev.sm_count().map_err(err)?;
    let shape = MlpShape { batch: 200, dims: vec![300, 257, 257, 7] };
    // every tile of every path (a tile fixes each output's order of sums: tiles sum differently)
    let runs = [DataPath::Tf32x3, DataPath::Tf32, DataPath::Bf16, DataPath::CudaCores]
        .into_iter()
        .flat_map(|p| p.tiles().iter().map(move |&t| (p, t)))
        .filter(|&(p, t)| p != DataPath::CudaCores || t == 64);
    for (path, tile) in runs {
        let (a, _) = megakernel_weights_after(path, &shape, sms, tile, 5, false)?;
        let (b, _) = megakernel_weights_after(path, &shape, sms, tile, 5, false)?;
        let (c, _) = megakernel_weights_after(path, &shape, 3, tile, 5, false)?;
        let (d, _) = megakernel_weights_after(path, &shape, sms, tile, 5, true)?;
        for (l, (((a, b), c), d)) in a.iter().zip(&b).zip(&c).zip(&d).enumerate() {
            for (what, other) in [("a second run", b), ("the 3-SM schedule", c), ("a traced run", d)] {
                if let Some(i) = a.iter().zip(other).position(|(x, y)| x.to_bits() != y.to_bits()) {
                    return Err(format!(
                        "{path:?} tile {tile} layer {l} weight {i}: {} on {sms} SMs, {} in {what}",
                        a[i], other[i]
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The tf32 and bf16 paths' page loops convert nothing, so every operand they store for a later
/// product must already be a tf32 (bf16) value: after a step, `act[0]` is the batch rounded to
/// nearest, every hidden activation and every computed gradient has its 13 (16) low bits clear.
/// The 3xTF32 path rounds nothing it stores: there `act[0]` is the batch bit for bit and some
/// hidden activation keeps low bits. On all three, the K-major copies the products read hold
/// exactly those operands, transposed: `act_t` and `grad_t` are `act` and `grad` bit for bit,
/// `w_t` is the updated weights (rounded on tf32 and bf16) and, on tf32 and bf16, `w_op` the
/// rounded weights; on bf16 its copy of the batch is `act[0]` bit for bit; with fused and
/// with separate updates. bf16 at tile 128 reads its operands in place and keeps no transposed
/// copies (and reports none). The CUDA-core path keeps no copies: asking for them is an error that
/// names the paths that do.
fn megakernel_tf32_operands_rounded(dev: &Device) -> Outcome {
    use kiln::megakernel::{DataPath, GpuStep, Loss, MlpShape, StepInputs, build_with_tile};
    // `a` (rows x cols) transposed against `t`, bit for bit: the first mismatch
    let transposed = |a: &[f32], t: &[f32], rows: usize, cols: usize| {
        (0..rows * cols).find(|&i| a[i].to_bits() != t[(i % cols) * rows + i / cols].to_bits())
    };
    let sms = dev.sm_count().map_err(err)?;
    let (mut rng, _) = testing::rng();
    // the CUDA-core path keeps no copies, and says so
    {
        let shape = MlpShape { batch: 8, dims: vec![5, 3] };
        let schedule = kiln::megakernel::build(&shape, sms, DataPath::CudaCores).map_err(err)?;
        let mut gpu =
            GpuStep::new(dev_arc()?, &schedule, &mk_weights(&shape.dims, 1), DataPath::CudaCores).map_err(err)?;
        match gpu.operand_copies() {
            Err(e) if e.to_string().contains("use DataPath::Tf32, Tf32x3 or Bf16") => {}
            other => return Err(format!("operand_copies on the CUDA-core path: {:?}", other.map(|_| ()))),
        }
    }
    let cases = [(100usize, vec![37usize, 130, 65, 10], Loss::CrossEntropy), (70, vec![129, 64, 33], Loss::Mse)];
    for (batch, dims, loss) in cases {
        let shape = MlpShape { batch, dims: dims.clone() };
        let layers = shape.layers();
        let x = testing::uniform(&mut rng, batch * dims[0]);
        let y = testing::uniform(&mut rng, batch * dims[layers]);
        let classes: Vec<usize> = (0..batch).map(|i| (i * 3) % dims[layers]).collect();
        let inp = StepInputs { x: &x, y: &y, classes: &classes, loss, lr: 0.05, momentum: 0.0 };
        let paths = [DataPath::Tf32, DataPath::Tf32x3, DataPath::Bf16];
        for (path, updates) in paths.into_iter().flat_map(|p| BOTH_UPDATES.map(|u| (p, u))) {
            for &tile in path.tiles() {
                let schedule = build_with_tile(&shape, sms, tile, updates, path.weight_reads()).map_err(err)?;
                let mut gpu = GpuStep::new(dev_arc()?, &schedule, &mk_weights(&dims, 3), path).map_err(err)?;
                gpu.step(&inp).map_err(err)?;
                let (act, grad) = (gpu.activations().map_err(err)?, gpu.activation_grads().map_err(err)?);
                let what = format!("{path:?} {updates:?} {dims:?} {loss:?} tile {tile}");
                let copies = gpu.operand_copies().map_err(err)?;
                let weights = gpu.weights().map_err(err)?;
                let operand = |v: f32| path.operand(v);
                let rounded: Vec<Vec<f32>> = weights.iter().map(|w| w.iter().map(|&v| operand(v)).collect()).collect();
                let same =
                    |got: &[f32], want: &[f32]| got.iter().zip(want).position(|(g, w)| g.to_bits() != w.to_bits());
                // the transposed copies: kept unless the step reads its operands in place (bf16 at
                // tile 128), and then none of them
                let (act_t, grad_t, w_t) = match (&copies.act_t, &copies.grad_t, &copies.w_t, gpu.reads_in_place()) {
                    (Some(a), Some(g), Some(w), false) => (a.clone(), g.clone(), w.clone()),
                    (None, None, None, true) => (vec![], vec![], vec![]),
                    _ => {
                        return Err(format!(
                            "{what}: transposed copies kept where the step reads in place, or missing"
                        ));
                    }
                };
                let checks = (0..act_t.len().min(layers))
                    .map(|l| ("act", l, &act[l], &act_t[l], batch, dims[l]))
                    .chain((1..grad_t.len().min(layers + 1)).map(|l| ("grad", l, &grad[l], &grad_t[l], batch, dims[l])))
                    .chain((0..w_t.len()).map(|l| ("weights", l, &rounded[l], &w_t[l], dims[l + 1], dims[l])));
                for (name, l, a, t, rows, cols) in checks {
                    if let Some(i) = transposed(a, t, rows, cols) {
                        let (r, c) = (i / cols, i % cols);
                        return Err(format!(
                            "{what}: {name}[{l}][{r}][{c}] = {:e}, its transposed copy has {:e}",
                            a[i],
                            t[c * rows + r]
                        ));
                    }
                }
                match (&copies.w_op, path) {
                    (Some(w_op), DataPath::Tf32 | DataPath::Bf16) => {
                        for (l, (got, want)) in w_op.iter().zip(&rounded).enumerate() {
                            if let Some(i) = same(got, want) {
                                return Err(format!("{what}: w_op[{l}][{i}] = {:e}, want {:e}", got[i], want[i]));
                            }
                        }
                    }
                    (None, DataPath::Tf32x3) => {}
                    _ => return Err(format!("{what}: w_op present on the wrong path")),
                }
                match (&copies.act_bf16, &copies.grad_bf16, path) {
                    (Some(act16), Some(grad16), DataPath::Bf16) => {
                        // the hidden activations and the gradients are kept as bf16 only (what
                        // `activations` and `activation_grads` read); the batch is in both arrays
                        if act16.len() != layers + 1 || grad16.len() != layers + 1 {
                            return Err(format!("{what}: bf16 copies of {} and {} layers", act16.len(), grad16.len()));
                        }
                        if let Some(i) = same(&act16[0], &act[0]) {
                            return Err(format!(
                                "{what}: the bf16 copy of the batch has {:e} at {i}, the f32 array {:e}",
                                act16[0][i], act[0][i]
                            ));
                        }
                    }
                    (None, None, DataPath::Tf32 | DataPath::Tf32x3) => {}
                    _ => return Err(format!("{what}: bf16 copies present on the wrong path")),
                }
                let want0: Vec<f32> = x.iter().map(|&v| operand(v)).collect();
                if let Some(i) = act[0].iter().zip(&want0).position(|(g, w)| g.to_bits() != w.to_bits()) {
                    return Err(format!(
                        "{what}: act[0][{i}] = {:e}, want {:e} (batch {:e})",
                        act[0][i], want0[i], x[i]
                    ));
                }
                let low = |v: f32| v.to_bits() & if path == DataPath::Bf16 { 0xffff } else { 0x1fff } != 0;
                if path != DataPath::Tf32x3 {
                    let stored =
                        (1..layers).map(|l| ("act", l, &act[l])).chain((1..=layers).map(|l| ("grad", l, &grad[l])));
                    for (name, l, v) in stored {
                        if let Some(i) = v.iter().position(|&v| low(v)) {
                            return Err(format!("{what}: {name}[{l}][{i}] = {:e} is not a {path:?} value", v[i]));
                        }
                    }
                } else if !act[1..layers].iter().flatten().any(|&v| low(v)) {
                    return Err(format!(
                        "{what}: every hidden activation is a tf32 value; 3xTF32 should keep f32 ones"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Random shapes on the device (the GPU side of the schedule property test): batches, widths and
/// depths drawn log-uniformly (batch 1..=4096, widths 1..=4096, 1..=16 layers, capped so the CPU
/// interpreter's reference stays under about 2 GFLOP per case), the three tensor-core precisions
/// in turn, random SM counts; weights after 2 steps within the path's bound of the interpreter.
fn megakernel_tc_random_shapes(dev: &Device) -> Outcome {
    use kiln::megakernel::{DataPath, GpuStep, Loss, MlpShape, StepInputs, build, interpret};
    use rand::Rng;
    let sms = dev.sm_count().map_err(err)?;
    let (mut rng, seed) = testing::rng();
    let log_uniform = |rng: &mut rand::rngs::StdRng, hi: f64| (rng.random_range(0.0..hi.ln())).exp().round() as usize;
    for case in 0..12 {
        let path = [DataPath::Tf32x3, DataPath::Tf32, DataPath::Bf16][(case % 3) as usize];
        let layers = log_uniform(&mut rng, 16.0).clamp(1, 16);
        let batch = log_uniform(&mut rng, 4096.0).max(1);
        let mut dims: Vec<usize> = (0..=layers).map(|_| log_uniform(&mut rng, 4096.0).max(1)).collect();
        // cap the reference's work (3 products per layer, 2 steps; the interpreter runs three times
        // with the two shadows, nine with bf16's eight, so bf16's cap is a third: the test stays
        // within the bundle's 60 s; with the full cap on bf16 it took 35-52 s, H100 run 159)
        // (and the tf32 interpreter, which rounds every operand, half: with the full cap its
        // cases took 18-49 s, run 195)
        let shadow_count = if path == DataPath::Bf16 { 8 } else { 2 };
        let cap = 600_000_000 * 3 / (1 + shadow_count) / if path == DataPath::Tf32 { 2 } else { 1 };
        while 6 * batch * dims.windows(2).map(|w| w[0] * w[1]).sum::<usize>() > cap {
            let widest = (0..dims.len()).max_by_key(|&i| dims[i]).unwrap_or(0);
            dims[widest] = dims[widest] / 2 + 1;
        }
        let shape = MlpShape { batch, dims: dims.clone() };
        let schedule = build(&shape, rng.random_range(1..=sms), path).map_err(err)?;
        let w0 = mk_weights(&dims, case);
        let mut gpu = GpuStep::new(dev_arc()?, &schedule, &w0, path).map_err(err)?;
        let mut cpu = reference_state(&shape, &w0, path)?;
        // Two shadows, or eight on bf16: there a nudge survives the operands' rounding only
        // rarely, so few shadows part, but one that does can part far. Seed 1795635434547174198
        // case 5 (bf16, batch 17, dims [389, 3, 57, 2558, 152, 54, 25, 13]) was 6.96 % off at
        // layer 4 on the GPU (H100 runs 156-157, the same value on two builds), where the first
        // two shadows part by at most 1 % and shadow 4 (of twelve, replayed on the CPU) by 12.3 %.
        let mut shadows = Shadows::new(&shape, &w0, path, shadow_count)?;
        let loss = if (case / 3) % 2 == 0 { Loss::Mse } else { Loss::CrossEntropy };
        for step in 0..2 {
            let x = testing::uniform(&mut rng, batch * dims[0]);
            let y = testing::uniform(&mut rng, batch * dims[layers]);
            let classes: Vec<usize> = (0..batch).map(|i| (i * 3 + step) % dims[layers]).collect();
            let inp = StepInputs { x: &x, y: &y, classes: &classes, loss, lr: 0.05, momentum: 0.5 };
            gpu.step(&inp).map_err(err)?;
            interpret(&schedule, &mut cpu, &inp, step as u64).map_err(err)?;
            shadows.step(&schedule, &inp, step)?;
        }
        let bound = tc_deep(path, layers, batch);
        for (l, (g, c)) in gpu.weights().map_err(err)?.iter().zip(&cpu.weights).enumerate() {
            let what = format!(
                "seed {seed} case {case}: {path:?} batch {batch} dims {dims:?} {loss:?} tile {} on {} SMs, layer {l}",
                schedule.tile,
                schedule.per_sm.len()
            );
            mega_check(&what, g, c, &w0[l], shadows.widen(bound, l, c, &w0[l]))?;
        }
    }
    Ok(())
}

fn dev_arc() -> Result<std::sync::Arc<Device>, String> {
    Device::shared().map_err(err)
}

/// A schedule with one wait set one arrival too high: the step stops with a typed error naming the
/// block, instruction and counter, and the device keeps working. On every data path.
fn megakernel_stall(dev: &Device) -> Outcome {
    use kiln::megakernel::{DataPath, GpuStep, Loss, MlpShape, StepInputs, build};
    for path in [DataPath::CudaCores, DataPath::Tf32x3] {
        let shape = MlpShape { batch: 64, dims: vec![8, 8, 4] };
        let mut schedule = build(&shape, 3, path).map_err(err)?;
        let victim = schedule.per_sm[1]
            .iter_mut()
            .find(|i| i.wait != kiln::gpu::megakernel::NO_COUNTER)
            .ok_or("no waiting instruction")?;
        victim.wait_value += 1;
        let mut gpu = GpuStep::new(dev_arc()?, &schedule, &mk_weights(&shape.dims, 2), path).map_err(err)?;
        gpu.wait_limit_ns = 200_000_000;
        let (x, y) = (vec![0.5f32; 64 * 8], vec![0.0f32; 64 * 4]);
        let inp = StepInputs { x: &x, y: &y, classes: &[], loss: Loss::Mse, lr: 0.1, momentum: 0.0 };
        let started = std::time::Instant::now();
        match gpu.step(&inp) {
            Err(kiln::Error::Stalled { msg, .. }) if msg.contains("block 1 at") && msg.contains("counter") => {}
            other => return Err(format!("{path:?}: expected a stall in block 1, got {other:?}")),
        }
        if started.elapsed().as_secs_f64() > 10.0 {
            return Err(format!("{path:?}: the stall took {:?} to report", started.elapsed()));
        }
        // Checked only on demand: two stalled steps run without a wait, and the check reports them.
        gpu.check_every = 0;
        gpu.step(&inp).map_err(err)?;
        gpu.step(&inp).map_err(err)?;
        match gpu.check() {
            Err(kiln::Error::Stalled { msg, .. }) if msg.contains("block 1 at") => {}
            other => return Err(format!("{path:?}: expected a deferred stall report, got {other:?}")),
        }
        gpu.check().map_err(|e| format!("the flag is cleared once reported, got {e}"))?;
    }
    // the context is intact: an ordinary kernel still runs
    vector_add_matches_cpu(dev)
}

/// The page protocol's hang-proofing: every free barrier expects one arrival more than the
/// consumer warps make (`PAGE_FREE_ARRIVALS + 1`), so the loader's first reuse of a page never
/// completes. The step must stop with a report naming the page, its barrier and the parity, within
/// the wait limit; the device keeps working, and a correct step runs after it.
fn megakernel_page_fault_stalls(dev: &Device) -> Outcome {
    use kiln::megakernel::{DataPath, GpuStep, Loss, MlpShape, StepInputs, build};
    let shape = MlpShape { batch: 64, dims: vec![300, 64, 4] };
    let schedule = build(&shape, 4, DataPath::Tf32x3).map_err(err)?;
    let mut gpu = GpuStep::new(dev_arc()?, &schedule, &mk_weights(&shape.dims, 2), DataPath::Tf32x3).map_err(err)?;
    gpu.wait_limit_ns = 200_000_000;
    gpu.set_extra_free_arrivals(1);
    let (x, y) = (vec![0.5f32; 64 * 300], vec![0.0f32; 64 * 4]);
    let inp = StepInputs { x: &x, y: &y, classes: &[], loss: Loss::Mse, lr: 0.1, momentum: 0.0 };
    let started = std::time::Instant::now();
    match gpu.step(&inp) {
        Err(kiln::Error::Stalled { msg, .. })
            if msg.contains("loader of block") && msg.contains("free barrier of page 0 with parity 0") => {}
        other => return Err(format!("expected the loader to stall on page 0's free barrier, got {other:?}")),
    }
    if started.elapsed().as_secs_f64() > 10.0 {
        return Err(format!("the stall took {:?} to report", started.elapsed()));
    }
    gpu.set_extra_free_arrivals(0);
    gpu.step(&inp).map_err(|e| format!("a correct step after the stall: {e}"))?;
    vector_add_matches_cpu(dev)
}

/// The give-up paths: one consumer warp of block 0 gives up (`GpuStep::set_give_up`) while
/// the others go on. On the `wgmma` path (tf32, tile 64) each page group multiplies as one
/// warpgroup, so the warp that gave up must keep issuing its group's products, to the end of its
/// list, or the other three would wait for it in one. Planted at each walk's first page (the rest
/// of the group sees the page arrive), and at each publishing meeting after arriving (the others
/// pass it and multiply the next instruction's pages). Every path and tile must stop with the
/// planted stall as block 0's consumer record (its first instruction), within the wait limit;
/// then a correct step runs and the device keeps working. Four blocks, so that block 0 has a
/// list of several instructions.
fn megakernel_give_up_split(dev: &Device) -> Outcome {
    use kiln::gpu::megakernel::{CONSUMER_WARPS, GROUP_WARPS, groups_split_rows};
    use kiln::megakernel::{DataPath, GiveUp, GpuStep, Loss, MlpShape, StepInputs, Updates, build_with_tile};
    // 300 inputs: ten pages, both groups' on the first instruction
    let shape = MlpShape { batch: 128, dims: vec![300, 64, 64, 4] };
    let (x, y) = (vec![0.5f32; 128 * 300], vec![0.0f32; 128 * 4]);
    let inp = StepInputs { x: &x, y: &y, classes: &[], loss: Loss::Mse, lr: 0.1, momentum: 0.0 };
    for path in [DataPath::Tf32, DataPath::Tf32x3, DataPath::Bf16] {
        for &tile in path.tiles() {
            let schedule = build_with_tile(&shape, 4, tile, Updates::Fused, path.weight_reads()).map_err(err)?;
            let mut gpu = GpuStep::new(dev_arc()?, &schedule, &mk_weights(&shape.dims, 2), path).map_err(err)?;
            // Every stall here is planted: none waits for the limit (the others see the abort),
            // but under compute-sanitizer an honest wait can take far longer than usual.
            gpu.wait_limit_ns = 2_000_000_000;
            match gpu.set_give_up(Some((CONSUMER_WARPS, GiveUp::Pages))) {
                Err(kiln::Error::Unsupported { what, .. }) if what.contains("pick one of them") => {}
                other => return Err(format!("giving up in a warp that is not a consumer: {other:?}")),
            }
            for (warp, at) in [(1, GiveUp::Pages), (CONSUMER_WARPS - 2, GiveUp::Pages), (2, GiveUp::Publish)] {
                let what = format!("{path:?} tile {tile}, warp {warp} at {at:?}");
                // the group's first page use: page g when the groups split the pages, the first
                // K block's A page (use 0) when they split the rows (tile 128)
                let (rows, g) = (groups_split_rows(tile), warp / GROUP_WARPS);
                let first = if rows { 0 } else { g };
                let want = match at {
                    // the group's first page of the first product
                    GiveUp::Pages => format!("the ready barrier of page {first} with parity 0 (page use {first})"),
                    // the first product's publishing meeting: its second (after its sums); at tile
                    // 128, where the first product (a hidden forward) is handed to the storer
                    // instead, the hand-off of its staged tile
                    GiveUp::Publish if rows => "the staged-tile hand-off with parity 0 (staged tile 0)".to_string(),
                    GiveUp::Publish => "the consumers' rendezvous with parity 1 (meeting 1)".to_string(),
                };
                let want = format!("consumers of block 0 at instruction 0 waited on {want}");
                gpu.set_give_up(Some((warp, at))).map_err(err)?;
                let started = std::time::Instant::now();
                match gpu.step(&inp) {
                    Err(kiln::Error::Stalled { msg, .. }) if msg.contains(&want) => {}
                    other => return Err(format!("{what}: expected a stall with \"{want}\", got {other:?}")),
                }
                if started.elapsed().as_secs_f64() > 10.0 {
                    return Err(format!("{what}: the stall took {:?} to report", started.elapsed()));
                }
                gpu.set_give_up(None).map_err(err)?;
                gpu.step(&inp).map_err(|e| format!("{what}: a correct step after the stall: {e}"))?;
            }
        }
    }
    vector_add_matches_cpu(dev)
}

/// A model whose layer table would push the tensor-core kernel's shared memory past the device's
/// opt-in limit (20 bytes a layer after the page ring, and at bf16 tile 128 the weight buffer: a
/// few thousand layers, or 91) is refused by `GpuStep::new` with a typed error that says what to
/// change; the deepest model that fits runs. On tf32 (tile 32) and bf16 at tile 128.
fn megakernel_too_deep(dev: &Device) -> Outcome {
    use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as OPTIN;
    use kiln::gpu::kernels::megakernel_tc::tc_smem_bytes;
    use kiln::megakernel::{DataPath, GpuStep, Loss, MlpShape, StepInputs, Updates, build_with_tile};
    let max_smem = dev.attribute(OPTIN).map_err(err)?.max(0) as u32;
    for (path, tile) in [(DataPath::Tf32, 32), (DataPath::Bf16, 128)] {
        let bytes = |l: u32| tc_smem_bytes(l, path.code(), tile);
        let fits = (1..8192u32).take_while(|&l| bytes(l) <= max_smem).last().ok_or("no depth fits")?;
        for (layers, ok) in [(fits, true), (fits + 1, false)] {
            let shape = MlpShape { batch: 2, dims: vec![3; layers as usize + 1] };
            let schedule = build_with_tile(&shape, 4, tile, Updates::Fused, path.weight_reads()).map_err(err)?;
            match (GpuStep::new(dev_arc()?, &schedule, &mk_weights(&shape.dims, 3), path), ok) {
                (Ok(mut gpu), true) => {
                    let x = vec![0.5f32; 2 * 3];
                    let inp = StepInputs {
                        x: &x,
                        y: &[],
                        classes: &[0, 1],
                        loss: Loss::CrossEntropy,
                        lr: 0.1,
                        momentum: 0.0,
                    };
                    gpu.step(&inp).map_err(|e| format!("{path:?} {layers} layers (the deepest that fits): {e}"))?;
                }
                (Err(kiln::Error::Unsupported { what, .. }), false)
                    if what.contains(&format!("{layers} layers")) && what.contains("use fewer layers") => {}
                (other, _) => {
                    return Err(format!(
                        "{path:?} {layers} layers ({} bytes of shared memory, the device allows {max_smem}): got {:?}",
                        bytes(layers),
                        other.map(|_| "a step")
                    ));
                }
            }
        }
    }
    Ok(())
}

fn megakernel_main_job(dev: &Device) -> Outcome {
    use kiln::megakernel::DataPath;
    use kiln::train::{DataSource, DeviceChoice, TrainConfig};
    // the default path, and bf16 where the tensor-core kernels run
    let bf16 = kiln::megakernel::tensor_core_step_supported(dev).then_some(DataPath::Bf16);
    for mega_path in std::iter::once(None).chain(bf16.map(Some)) {
        let cfg = TrainConfig {
            data: DataSource::Spirals { per_class: 300, classes: 3, noise: 0.2 },
            epochs: 15,
            lr: 0.1,
            megakernel: true,
            mega_path,
            device: DeviceChoice::Cuda,
            checkpoint: None,
            progress: false,
            ..TrainConfig::default()
        };
        let report = kiln::train::train(&cfg, |l| eprintln!("{l}")).map_err(err)?;
        let acc = report.epochs.last().map(|r| r.test_accuracy).unwrap_or(0.0);
        if !report.device.starts_with("GPU") || acc < 0.9 {
            return Err(format!("{}: test accuracy {acc}", report.device));
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
