//! bf16 and f16 tensors on CUDA: the cases of `tests/dtype_cases.rs` (written once, also run on
//! the CPU backend by `tests/ops.rs`) for each 16-bit dtype, a small bf16 MLP's forward and backward
//! against the CPU backend's bf16, and the typed errors of what CUDA does not take (f64 data,
//! optimizer updates of 16-bit parameters).

use crate::common::{Outcome, err};
use crate::dtype_cases::{self, unit};
use crate::{GpuTest, any};
use kiln::cuda::Device;
use kiln::nn::{Linear, Module, ReLU, Sequential};
use kiln::optim::{Optimizer, Sgd};
use kiln::tensor::{DType, Device as TensorDevice, Tensor};

/// One `dtype_cases` case per 16-bit dtype, named `gpu::dtypes::<case>_<dtype>`.
macro_rules! per_dtype {
    ($($case:ident),* $(,)?) => {
        vec![$(
            GpuTest {
                name: concat!("gpu::dtypes::", stringify!($case), "_bf16"),
                available: any,
                run: |d| on_cuda(d, DType::BF16, dtype_cases::$case),
            },
            GpuTest {
                name: concat!("gpu::dtypes::", stringify!($case), "_f16"),
                available: any,
                run: |d| on_cuda(d, DType::F16, dtype_cases::$case),
            },
        )*]
    };
}

/// This family's tests, in the order the suite lists them.
pub(crate) fn tests() -> Vec<GpuTest> {
    let mut v = per_dtype!(
        conversions,
        elementwise,
        copies,
        sums,
        max_and_argmax,
        softmax_rows,
        cross_entropy,
        layer_norm,
        embedding,
        matmul,
        matmul_in_place,
        dropout,
        mixed_dtypes,
    );
    v.push(GpuTest { name: "gpu::dtypes::mlp_bf16_matches_cpu", available: any, run: mlp_bf16_matches_cpu });
    v.push(GpuTest { name: "gpu::dtypes::cuda_refusals_are_typed", available: any, run: cuda_refusals_are_typed });
    v
}

fn on_cuda(_: &Device, dt: DType, case: fn(&TensorDevice, DType) -> dtype_cases::Outcome) -> Outcome {
    case(&TensorDevice::Cuda(Device::shared().map_err(err)?), dt)
}

/// A bf16 MLP (Linear + ReLU + Linear, cross-entropy) on CUDA against the same model on the CPU
/// backend's bf16: the loss and every parameter's gradient. The products differ in summation order
/// (tensor cores against the CPU's blocked loop, both accumulating in f32), so each result may
/// differ by a few bf16 roundings: the loss within 4u, the gradients within 16u in relative L2.
fn mlp_bf16_matches_cpu(_: &Device) -> Outcome {
    let cuda = TensorDevice::Cuda(Device::shared().map_err(err)?);
    let (mut rng, seed) = kiln::testing::rng();
    let (n, inputs, hidden, classes) = (37, 29, 65, 7);
    let build = |seed: u64| -> kiln::Result<Sequential> {
        let mut r = Tensor::rng(seed);
        Ok(Sequential::new()
            .push(Linear::new(inputs, hidden, true, DType::BF16, &mut r)?)
            .push(ReLU)
            .push(Linear::new(hidden, classes, true, DType::BF16, &mut r)?))
    };
    let (cpu_model, gpu_model) = (build(seed).map_err(err)?, build(seed).map_err(err)?);
    for p in gpu_model.parameters() {
        p.move_to(&cuda).map_err(err)?;
    }
    let xv: Vec<f64> = kiln::testing::uniform(&mut rng, n * inputs).iter().map(|&x| x as f64).collect();
    let targets: Vec<usize> = (0..n).map(|i| (i * 5 + 1) % classes).collect();
    let x = Tensor::from_f64(&xv, [n, inputs], DType::BF16).map_err(err)?;
    let run = |model: &Sequential, x: &Tensor| -> kiln::Result<Tensor> {
        let loss = model.forward(x)?.cross_entropy(&targets)?;
        loss.backward()?;
        Ok(loss)
    };
    let cpu_loss = run(&cpu_model, &x).map_err(err)?;
    let gpu_loss = run(&gpu_model, &x.to_device(&cuda).map_err(err)?).map_err(err)?;
    let u = unit(DType::BF16);
    if gpu_loss.dtype() != DType::BF16 {
        return Err(format!("loss dtype {:?} (seed {seed})", gpu_loss.dtype()));
    }
    let (c, g) = (cpu_loss.item().map_err(err)?, gpu_loss.item().map_err(err)?);
    if (c - g).abs() > 4.0 * u * c.abs() {
        return Err(format!("loss: CUDA {g}, CPU bf16 {c} (seed {seed})"));
    }
    for ((name, cp), (_, gp)) in cpu_model.named_parameters().iter().zip(gpu_model.named_parameters()) {
        let (cg, gg) = (cp.grad().ok_or("no CPU gradient")?, gp.grad().ok_or("no CUDA gradient")?);
        if gg.dtype() != DType::BF16 || gg.device() != cuda {
            return Err(format!("{name}: gradient is {:?} on {}", gg.dtype(), gg.device().name()));
        }
        let e = kiln::testing::relative_l2(&gg.to_vec_f32(), &cg.to_vec_f64());
        if e > 16.0 * u {
            return Err(format!("{name}: gradient relative L2 error {e:e} against the CPU bf16 backend (seed {seed})"));
        }
    }
    Ok(())
}

/// What CUDA does not take is a typed error that says what to do: f64 data, and the fused
/// optimizer updates of bf16 parameters.
fn cuda_refusals_are_typed(_: &Device) -> Outcome {
    let cuda = TensorDevice::Cuda(Device::shared().map_err(err)?);
    match Tensor::zeros([3], DType::F64).to_device(&cuda) {
        Err(kiln::Error::Unsupported { op: "to_device", what }) if what.contains("F64") => {}
        other => return Err(format!("f64 to CUDA: {other:?}")),
    }
    let x = Tensor::zeros([3], DType::BF16).to_device(&cuda).map_err(err)?;
    match x.to_dtype(DType::F64) {
        Err(kiln::Error::Unsupported { op: "to_dtype", .. }) => {}
        other => return Err(format!("bf16 to f64 on CUDA: {other:?}")),
    }
    let mut r = Tensor::rng(1);
    let layer = Linear::new(4, 3, true, DType::BF16, &mut r).map_err(err)?;
    for p in layer.parameters() {
        p.move_to(&cuda).map_err(err)?;
    }
    let input = Tensor::ones([2, 4], DType::BF16).to_device(&cuda).map_err(err)?;
    layer.forward(&input).and_then(|y| y.sum_all()).and_then(|l| l.backward()).map_err(err)?;
    let mut sgd = Sgd::new(layer.named_parameters(), 0.1, 0.9, 0.0, false);
    match sgd.step() {
        Err(e @ kiln::Error::Unsupported { .. }) if e.to_string().contains("BF16") => Ok(()),
        other => Err(format!("SGD on a bf16 CUDA parameter: {other:?}")),
    }
}
