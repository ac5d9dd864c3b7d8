//! Both megakernels (the CUDA-core step and the tensor-core step on sm_90a) against the CPU
//! interpreter of the same schedule, their hang-proofing and refusals, and the main job trained by
//! them.
//!
//! ```text
//! weights w0 --+--> GpuStep (the schedule on the GPU) ----------> weights --+
//!              +--> interpret (reference_state, CPU) ----------> weights --+--> mega_check(bound)
//!              +--> Shadows (the interpreter, nudged weights) --> weights --+    (norm bounds: the
//!                                                                              nearest trajectory)
//! ```
//!
//! `reference` holds the bounds, the shadows and the comparison loop; `tensor_cores` the sm_90a
//! tests; `faults` the planted stalls and the too-deep refusal.

mod faults;
mod reference;
mod tensor_cores;

use crate::common::{Outcome, err};
use crate::{GpuTest, any};
use kiln::cuda::Device;
use kiln::testing::Tol;
use reference::{BOTH_UPDATES, FUSED, MegaBound, megakernel_edge_cases, megakernel_vs_interpreter};

/// This family's tests, in the order the suite lists them.
pub(crate) fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest { name: "gpu::megakernel_matches_the_cpu_interpreter", available: any, run: megakernel_matches },
        GpuTest { name: "gpu::megakernel_bits_equal_the_interpreter", available: any, run: megakernel_bits },
        GpuTest { name: "gpu::megakernel_hundred_steps_match", available: any, run: megakernel_hundred_steps },
        GpuTest { name: "gpu::megakernel_wrong_count_stalls_not_hangs", available: any, run: faults::megakernel_stall },
        GpuTest {
            name: "gpu::megakernel_tc_matches_the_interpreter_sm90",
            available: mega_tc,
            run: tensor_cores::megakernel_tc_matches,
        },
        GpuTest {
            name: "gpu::megakernel_bf16_matches_the_interpreter_sm90",
            available: mega_tc,
            run: tensor_cores::megakernel_bf16_matches,
        },
        GpuTest {
            name: "gpu::megakernel_tc_shallow_models_tight_sm90",
            available: mega_tc,
            run: tensor_cores::megakernel_tc_shallow,
        },
        GpuTest {
            name: "gpu::megakernel_tc_hundred_steps_sm90",
            available: mega_tc,
            run: tensor_cores::megakernel_tc_hundred_steps,
        },
        GpuTest {
            name: "gpu::megakernel_bits_repeat_across_runs_and_schedules_sm90",
            available: mega_tc,
            run: tensor_cores::megakernel_tc_bits_repeat,
        },
        GpuTest {
            name: "gpu::megakernel_tc_random_shapes_sm90",
            available: mega_tc,
            run: tensor_cores::megakernel_tc_random_shapes,
        },
        GpuTest {
            name: "gpu::megakernel_tf32_stores_its_operands_rounded_sm90",
            available: mega_tc,
            run: tensor_cores::megakernel_tf32_operands_rounded,
        },
        GpuTest {
            name: "gpu::megakernel_page_fault_stalls_not_hangs_sm90",
            available: mega_tc,
            run: faults::megakernel_page_fault_stalls,
        },
        GpuTest {
            name: "gpu::megakernel_warp_giving_up_alone_stalls_not_hangs_sm90",
            available: mega_tc,
            run: faults::megakernel_give_up_split,
        },
        GpuTest {
            name: "gpu::megakernel_too_deep_for_shared_memory_is_an_error_sm90",
            available: mega_tc,
            run: faults::megakernel_too_deep,
        },
        GpuTest { name: "gpu::megakernel_trains_the_main_job", available: any, run: megakernel_main_job },
    ]
}

/// Weights for a model of widths `dims`, drawn from `seed`: normal, scaled by `sqrt(2 / fan_in)`.
pub(crate) fn mk_weights(dims: &[usize], seed: u64) -> Vec<Vec<f32>> {
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

/// Whether the device runs the tensor-core megakernel (the sm_90a module).
fn mega_tc(d: &Device) -> bool {
    kiln::megakernel::tensor_core_step_supported(d)
}

/// The shared device, as the `Arc` that `GpuStep::new` takes.
pub(crate) fn dev_arc() -> Result<std::sync::Arc<Device>, String> {
    Device::shared().map_err(err)
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

fn megakernel_main_job(dev: &Device) -> Outcome {
    use kiln::megakernel::DataPath;
    use kiln::train::{DataSource, DeviceChoice, OptimizerKind, TrainConfig};
    // the default path, and bf16 where the tensor-core kernels run
    let bf16 = kiln::megakernel::tensor_core_step_supported(dev).then_some(DataPath::Bf16);
    for mega_path in std::iter::once(None).chain(bf16.map(Some)) {
        let cfg = TrainConfig {
            data: DataSource::Spirals { per_class: 300, classes: 3, noise: 0.2 },
            epochs: 15,
            lr: 0.1,
            megakernel: true,
            optimizer: OptimizerKind::Sgd { momentum: 0.9, nesterov: false },
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
