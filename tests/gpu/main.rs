//! The GPU suite: every kernel against a higher-precision CPU reference, on fresh random inputs
//! (the seed is printed; `KILN_SEED` replays it), with outputs poisoned before each launch.
//!
//! Without a GPU each test is reported as ignored, with the count and the reason printed;
//! `KILN_REQUIRE_GPU=1` turns a missing GPU into failures. Tests that need a newer architecture than
//! the device's are ignored with the reason (tcgen05 below compute capability 10.0).
//!
//! This file is the registry: each family's module lists its tests (`tests()`), and [`main`] hands
//! them all to libtest-mimic, one trial per test, under the names `gpu::...` that the bundle's
//! `run.sh` runs one process each. The families:
//!
//! ```text
//! first_kernels   vector_add, reduce_sum, the mma.sync tile            (the guide's level 0)
//! tma             mbarrier phases, TMA tile round trips, large dynamic shared memory
//! tcgen05         TMEM and tcgen05 on Blackwell (ignored below compute capability 10.0)
//! tensor          the tensor backend, autograd and training on CUDA, a CUDA-graph step
//! dtypes          bf16 and f16 tensors on CUDA against the CPU reference (tests/dtype_cases.rs)
//! gemm            the FP32 ladder, mma.sync hgemm, gemm_bf16, the ladder command, wgmma
//! views           strided views and batched products against the CPU, the GEMM reading views
//! fused           the fused wgmma epilogues, the backward layouts read in place, column sums
//! attention       the flash forward kernels against the f64 reference, repeats, refusals
//! attention_op    the attention tensor op (flash and naive paths) with autograd against the f64
//!                 reference (tests/attention_cases.rs, shared with the CPU's tests/attention_op.rs)
//! determinism     bit-exact tiers: batch invariance, repeats, across processes
//! megakernel/     both megakernels against the CPU interpreter, their stalls and refusals
//! optim           the fused multi-tensor optimizer and clipping against the CPU reference
//! mixed           mixed-precision training (bf16 compute copies) and the fused Linear layer
//! gpt             the GPT against the CPU model, AdamW's groups, training and sampling on CUDA
//! dist            NCCL collectives and data-parallel training on two GPUs (ignored with fewer)
//! common          helpers the families share (error text, bits, the A B^T check)
//! ```

mod attention;
mod attention_op;
mod common;
mod determinism;
mod dist;
mod dtypes;
mod first_kernels;
mod fused;
mod gemm;
mod gpt;
mod megakernel;
mod mixed;
mod optim;
mod tcgen05;
mod tensor;
mod tma;
mod views;

#[path = "../attention_cases.rs"]
mod attention_cases;
#[path = "../backend_cases.rs"]
mod backend_cases;
#[path = "../dtype_cases.rs"]
mod dtype_cases;

use kiln::cuda::Device;
use kiln::testing;
use libtest_mimic::{Arguments, Failed, Trial};

use std::sync::Arc;

/// One GPU test: its libtest name, whether this device can run it, and its body.
pub(crate) struct GpuTest {
    pub(crate) name: &'static str,
    /// Whether the device can run it (kernels built only for newer modules).
    pub(crate) available: fn(&Device) -> bool,
    pub(crate) run: fn(&Device) -> common::Outcome,
}

/// Available on every device.
pub(crate) fn any(_: &Device) -> bool {
    true
}

/// Every family's tests, family by family.
fn tests() -> Vec<GpuTest> {
    [
        first_kernels::tests(),
        tma::tests(),
        tcgen05::tests(),
        tensor::tests(),
        views::tests(),
        dtypes::tests(),
        gemm::tests(),
        fused::tests(),
        attention::tests(),
        attention_op::tests(),
        determinism::tests(),
        megakernel::tests(),
        optim::tests(),
        mixed::tests(),
        gpt::tests(),
        dist::tests(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

fn main() {
    // A child process of `gpu::triad_bits_match_across_processes`: compute, write, exit.
    if let Ok(path) = std::env::var(determinism::TRIAD_CHILD_ENV) {
        let dev = Device::shared().expect("the parent process found a GPU");
        let lines: Vec<String> = determinism::triad_digests(&dev)
            .expect("triad products")
            .into_iter()
            .map(|(k, d)| format!("{k} {d:016x}"))
            .collect();
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
                    "{} (needs a newer GPU, or more GPUs, than {} x {} {}.{})",
                    t.name,
                    Device::count().unwrap_or(1),
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
