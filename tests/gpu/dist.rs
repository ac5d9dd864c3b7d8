//! Collectives over NCCL on two GPUs (`kiln::dist`): all-reduce (sum and mean) of f32 and bf16
//! buffers of odd lengths against the CPU sum of the ranks' inputs, broadcast from each root, and
//! the refusal of more GPUs than present. Ignored on machines with fewer than two GPUs.
//!
//! Tolerances: with two ranks NCCL adds the two values once (f32, or f32 arithmetic rounded to
//! bf16), and the mean scales by a power of two, so the result is the CPU's f64 sum rounded once:
//! f32 within `1e-7 |want|` (one rounding), bf16 within `2^-8 |want|` (one bf16 rounding). Every rank
//! must hold the same bits.
//!
//! Training: the MLP ([`dp_config`]: spirals, 960 training rows, batch 50) for about 100 steps on two GPUs against one GPU with the same global batch and seed.
//! The only difference is the order of sums (each rank's gradient is a sum over its half of the
//! batch, then the halves are added), a few f32 ulps per step that SGD carries forward: per-step
//! losses within `1e-3 (1 + |loss|)`, and the largest difference is printed. Two 2-GPU runs give
//! the same bits (losses and parameters), and rank 0 writes the checkpoint.

use crate::common::{Outcome, bits, err};
use crate::{GpuTest, any};
use half::bf16;
use kiln::cuda::Device;
use kiln::dist::{self, ReduceOp};
use kiln::testing::{self, Tol, compare};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// This family's tests, in the order the suite lists them.
pub(crate) fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest { name: "gpu::dist::all_reduce_f32_on_two_gpus", available: two_gpus, run: all_reduce_f32 },
        GpuTest { name: "gpu::dist::all_reduce_bf16_on_two_gpus", available: two_gpus, run: all_reduce_bf16 },
        GpuTest { name: "gpu::dist::broadcast_on_two_gpus", available: two_gpus, run: broadcast },
        GpuTest { name: "gpu::dist::more_gpus_than_present_is_refused", available: any, run: too_many },
        GpuTest {
            name: "gpu::dist::two_gpu_training_matches_one_gpu",
            available: two_gpus,
            run: two_gpu_training_matches_one_gpu,
        },
        GpuTest {
            name: "gpu::dist::two_gpu_training_repeats_bit_for_bit",
            available: two_gpus,
            run: two_gpu_training_repeats,
        },
    ]
}

/// One multi-GPU test at a time in this process: two jobs' NCCL kernels interleaved on the same
/// GPUs could wait on each other.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// At least two GPUs are present.
fn two_gpus(_: &Device) -> bool {
    Device::count().is_ok_and(|n| n >= 2)
}

const LENS: [usize; 3] = [1, 1023, 1_000_003];

/// Each rank's input: the run's seed, the rank and the length pick the values.
fn input(rank: usize, len: usize) -> Vec<f32> {
    let (_, seed) = testing::rng();
    let mut rng = StdRng::seed_from_u64(seed ^ ((rank as u64 + 1) << 40) ^ len as u64);
    (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn same_bits(what: &str, ranks: &[Vec<f32>]) -> Outcome {
    for (r, v) in ranks.iter().enumerate().skip(1) {
        if bits(v) != bits(&ranks[0]) {
            return Err(format!("{what}: rank {r}'s result differs in bits from rank 0's"));
        }
    }
    Ok(())
}

fn all_reduce_f32(_: &Device) -> Outcome {
    let _one_at_a_time = serial();
    for len in LENS {
        for op in [ReduceOp::Sum, ReduceOp::Avg] {
            let got = dist::run(2, |r| {
                let mut buf = r.device.upload(&input(r.rank, len))?;
                r.comm.all_reduce_f32(&r.device, &mut buf, op)?;
                r.device.download(&buf)
            })
            .map_err(err)?;
            let scale = if op == ReduceOp::Avg { 0.5 } else { 1.0 };
            let (a, b) = (input(0, len), input(1, len));
            let want: Vec<f64> = a.iter().zip(&b).map(|(x, y)| (*x as f64 + *y as f64) * scale).collect();
            let what = format!("f32 all-reduce {op:?} of {len}");
            same_bits(&what, &got)?;
            compare(&what, &got[0], &want, Tol { abs: 1e-30, rel: 1.2e-7 })?;
        }
    }
    Ok(())
}

fn all_reduce_bf16(_: &Device) -> Outcome {
    let _one_at_a_time = serial();
    for len in LENS {
        for op in [ReduceOp::Sum, ReduceOp::Avg] {
            let to_bf = |v: Vec<f32>| v.into_iter().map(bf16::from_f32).collect::<Vec<_>>();
            let got = dist::run(2, |r| {
                let mut buf = r.device.upload(&to_bf(input(r.rank, len)))?;
                r.comm.all_reduce_bf16(&r.device, &mut buf, op)?;
                Ok(r.device.download(&buf)?.into_iter().map(f32::from).collect::<Vec<f32>>())
            })
            .map_err(err)?;
            let scale = if op == ReduceOp::Avg { 0.5 } else { 1.0 };
            let (a, b) = (to_bf(input(0, len)), to_bf(input(1, len)));
            let want: Vec<f64> = a.iter().zip(&b).map(|(x, y)| (x.to_f64() + y.to_f64()) * scale).collect();
            let what = format!("bf16 all-reduce {op:?} of {len}");
            same_bits(&what, &got)?;
            compare(&what, &got[0], &want, Tol { abs: 1e-30, rel: 1.0 / 256.0 })?;
        }
    }
    Ok(())
}

fn broadcast(_: &Device) -> Outcome {
    let _one_at_a_time = serial();
    for root in 0..2 {
        let len = 4099;
        let got = dist::run(2, |r| {
            let mut f = r.device.upload(&input(r.rank, len))?;
            r.comm.broadcast_f32(&r.device, &mut f, root)?;
            let mut h = r.device.upload(&input(r.rank, len).into_iter().map(bf16::from_f32).collect::<Vec<_>>())?;
            r.comm.broadcast_bf16(&r.device, &mut h, root)?;
            Ok((r.device.download(&f)?, r.device.download(&h)?))
        })
        .map_err(err)?;
        let want = input(root, len);
        for (r, (f, h)) in got.iter().enumerate() {
            if bits(f) != bits(&want) {
                return Err(format!("f32 broadcast from {root}: rank {r} does not hold root's bits"));
            }
            let want_h: Vec<u16> = want.iter().map(|x| bf16::from_f32(*x).to_bits()).collect();
            if h.iter().map(|x| x.to_bits()).collect::<Vec<_>>() != want_h {
                return Err(format!("bf16 broadcast from {root}: rank {r} does not hold root's bits"));
            }
        }
    }
    Ok(())
}

fn too_many(_: &Device) -> Outcome {
    let present = Device::count().map_err(err)?;
    match dist::run(present + 1, |_| Ok(())) {
        Err(kiln::Error::TooFewGpus { asked, present: p }) if asked == present + 1 && p == present => Ok(()),
        other => Err(format!("--gpus {} on {present} GPU(s): expected TooFewGpus, got {other:?}", present + 1)),
    }
}

/// Spirals (3 classes x 400 points, 960 training rows), batch 50 (an odd last batch of 10 rows,
/// 5 per rank), 5 epochs = 100 steps, SGD with momentum, f32.
fn dp_config(checkpoint: Option<std::path::PathBuf>) -> kiln::train::TrainConfig {
    kiln::train::TrainConfig {
        data: kiln::train::DataSource::Spirals { per_class: 400, classes: 3, noise: 0.2 },
        width: 64,
        depth: 3,
        batch: 50,
        epochs: 5,
        optimizer: kiln::train::OptimizerKind::Sgd { momentum: 0.9, nesterov: false },
        lr: 0.05,
        warmup: 0,
        seed: 7,
        checkpoint,
        progress: false,
        ..Default::default()
    }
}

fn dp(
    gpus: usize,
    checkpoint: Option<std::path::PathBuf>,
) -> Result<kiln::train::data_parallel::DataParallelReport, String> {
    kiln::train::data_parallel::train_data_parallel(&dp_config(checkpoint), gpus, |_| {}).map_err(err)
}

fn two_gpu_training_matches_one_gpu(_: &Device) -> Outcome {
    let _one_at_a_time = serial();
    let one = dp(1, None)?;
    let ckpt = std::env::temp_dir().join(format!("kiln-dist-{}.safetensors", std::process::id()));
    let two = dp(2, Some(ckpt.clone()))?;
    let steps = one.step_losses.len();
    if steps < 90 || two.step_losses.len() != steps {
        return Err(format!("expected about 100 steps on both, got {steps} and {}", two.step_losses.len()));
    }
    let mut max = 0.0f64;
    for (s, (a, b)) in one.step_losses.iter().zip(&two.step_losses).enumerate() {
        let d = (a - b).abs();
        max = max.max(d);
        if d.is_nan() || d > 1e-3 * (1.0 + a.abs()) {
            return Err(format!("step {s}: 1-GPU loss {a}, 2-GPU loss {b} (difference {d:e})"));
        }
    }
    eprintln!(
        "two_gpu_training_matches_one_gpu: largest per-step loss difference {max:e} over {steps} steps (first {:.4}, last {:.4})",
        one.step_losses[0],
        one.step_losses[steps - 1]
    );
    if one.step_losses[steps - 1].is_nan() || one.step_losses[steps - 1] >= one.step_losses[0] {
        return Err(format!("the loss did not fall: {} -> {}", one.step_losses[0], one.step_losses[steps - 1]));
    }
    let (tensors, _) = kiln::checkpoint::load(&ckpt).map_err(err)?;
    let _ = std::fs::remove_file(&ckpt);
    if tensors.is_empty() {
        return Err("rank 0's checkpoint holds no tensors".into());
    }
    Ok(())
}

fn two_gpu_training_repeats(_: &Device) -> Outcome {
    let _one_at_a_time = serial();
    let a = dp(2, None)?;
    let b = dp(2, None)?;
    let lb = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    if lb(&a.step_losses) != lb(&b.step_losses) {
        return Err("two 2-GPU runs' losses differ in bits".into());
    }
    for ((n, x), (_, y)) in a.params.iter().zip(&b.params) {
        if bits(x) != bits(y) {
            return Err(format!("two 2-GPU runs' parameter {n} differs in bits"));
        }
    }
    Ok(())
}
