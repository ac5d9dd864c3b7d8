//! The tensor backend on CUDA: the CPU backend's cases (`tests/backend_cases.rs`) run on the GPU,
//! autograd under bf16 products, the main job trained on the GPU, and a training step captured in a
//! CUDA graph.

use crate::backend_cases;
use crate::common::{Outcome, bf16_round, bits, check_abt, err, transposed};
use crate::{GpuTest, any};
use kiln::cuda::Device;
use kiln::testing;

/// This family's tests, in the order the suite lists them.
pub(crate) fn tests() -> Vec<GpuTest> {
    vec![
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
        GpuTest { name: "gpu::bf16_matmul_precision_in_autograd", available: any, run: bf16_precision_autograd },
        GpuTest { name: "gpu::train_main_job_bf16_products", available: any, run: train_main_job_bf16 },
        GpuTest { name: "gpu::training_step_captured_in_a_cuda_graph", available: any, run: captured_training_step },
        GpuTest { name: "gpu::peak_memory_is_the_pools_high_water_mark", available: any, run: peak_memory },
        GpuTest { name: "gpu::tensor::long_column_sums_split", available: any, run: long_column_sums },
    ]
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
    // bf16 products read the graph's buffers through tensor maps made during the capture: the
    // capture succeeds (its replays' bits are checked by gpu::mixed::training_step_captured)
    if dev.supports::<kiln::gpu::kernels::gemm_wgmma::GemmWgmmaBf16Persistent>() {
        let _bf16 = kiln::cuda::matmul_precision_scope(kiln::cuda::MatmulPrecision::Bf16);
        step(&eager, &mut eager_opt).map_err(err)?; // eager bf16 steps work
        let g = dev.capture(|| step(&eager, &mut eager_opt)).map_err(|e| format!("capturing a bf16 step: {e}"))?;
        drop(g);
        eager_opt.zero_grad();
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

/// `Device::peak_memory` counts what the stream-ordered pool holds at its highest since the last
/// reset: a 64 MiB buffer raises it by at least 64 MiB while alive, and a reset after the buffer is
/// freed starts again below that.
fn peak_memory(dev: &Device) -> Outcome {
    const BYTES: u64 = 64 << 20;
    dev.reset_peak_memory().map_err(err)?;
    let before = dev.peak_memory().map_err(err)?;
    let buf = dev.zeros::<f32>((BYTES / 4) as usize).map_err(err)?;
    let during = dev.peak_memory().map_err(err)?;
    if during < before + BYTES {
        return Err(format!("peak {during} B with a {BYTES} B buffer alive (was {before} B)"));
    }
    drop(buf);
    dev.reset_peak_memory().map_err(err)?;
    let after = dev.peak_memory().map_err(err)?;
    if after >= during {
        return Err(format!("peak {after} B after freeing the buffer and a reset (was {during} B)"));
    }
    Ok(())
}

/// Sums over long leading dimensions (a bias gradient's shape, and a strided view), which the
/// CUDA backend splits into chunks: against an f64 sum on the CPU, and the same bits twice.
fn long_column_sums(_: &Device) -> Outcome {
    use kiln::tensor::{DType, Device as TDevice, Tensor};
    let cuda = TDevice::Cuda(Device::shared().map_err(err)?);
    let (mut rng, seed) = testing::rng();
    for &(rows, cols) in &[(16384usize, 384usize), (1000, 3), (257, 1029), (4097, 7)] {
        let x = Tensor::randn([rows, cols], DType::F32, &mut rng);
        let host = x.to_vec_f64();
        let g = x.to_device(&cuda).map_err(err)?;
        for (what, t) in
            [("rows", g.sum_dim(0, false).map_err(err)?), ("rows again", g.sum_dim(0, false).map_err(err)?)]
        {
            let got = t.to_vec_f32();
            let want: Vec<f64> = (0..cols).map(|c| (0..rows).map(|r| host[r * cols + c]).sum()).collect();
            let tol = testing::Tol { abs: 1e-6 * (rows as f64).sqrt(), rel: 1e-6 };
            testing::compare(&format!("sum over {rows} rows of {cols} ({what}, seed {seed})"), &got, &want, tol)
                .map_err(|e| e.to_string())?;
        }
        let (a, b) = (g.sum_dim(0, false).map_err(err)?.to_vec_f32(), g.sum_dim(0, false).map_err(err)?.to_vec_f32());
        if bits(&a) != bits(&b) {
            return Err(format!("sum over {rows} rows of {cols}: a repeat gave different bits"));
        }
        // a transposed view: the sum runs over the view's leading dimension (strided reads)
        let tv = g.transpose(0, 1).map_err(err)?.sum_dim(1, false).map_err(err)?.to_vec_f32();
        let want: Vec<f64> = (0..cols).map(|c| (0..rows).map(|r| host[r * cols + c]).sum()).collect();
        testing::compare(
            &format!("view sum {rows}x{cols}"),
            &tv,
            &want,
            testing::Tol { abs: 1e-6 * (rows as f64).sqrt(), rel: 1e-6 },
        )
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}
