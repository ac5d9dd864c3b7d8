//! kiln's tensor engine on one training step (forward, cross-entropy, backward, SGD lr 0.01): the
//! layer-by-layer autograd path that every model trains with, on the three models of issue 31
//! (`layers` bias-free Linear layers of `width`, ReLU between, `width` classes), beside its PyTorch
//! twin `benches/torch_engine_step.py` in the same run. For each model, dtype and mode: ms per
//! step (median of samples of back-to-back steps) and the peak device memory of the case
//! ([`kiln::cuda::Device::peak_memory`], reset before the model is built).
//!
//! Cases: `f32 eager` and `f32 graph` (the step captured once with `Device::capture`, then
//! replayed); `bf16 eager` / `bf16 graph` the mixed-precision step (f32 master weights whose bf16
//! copies the optimizer's launch writes, the forward and backward in bf16 inside
//! `kiln::nn::autocast`, each Linear+ReLU one fused GEMM where the GPU has `wgmma`, the loss in
//! f32), as each row's `kiln_path` says. Both dtypes' steps are captured (a bf16 step's tensor
//! maps for the graph's buffers are made during the capture, outside the graph: see
//! [`kiln::cuda::Device::tensor_map_cached`]); a graph row's note says so, or why not. Writes JSON to `$KILN_BENCH_OUT` (default `engine_step.json`); `cargo xtask
//! engine-report` joins it with PyTorch's into `benches/results/engine_step.{json,md}`.
//!
//! Run: `cargo bench --bench engine_step`, or `benches/engine_step` from a GPU bundle. Without a
//! GPU it prints why and exits 0. `KILN_BENCH_MODELS=4096x1024x8,...` picks a subset
//! (`KILN_BENCH_DTYPES=bf16`, `KILN_BENCH_MODES=eager` likewise: a profiler run takes one case).

use kiln::cuda::{Device, MatmulPrecision, matmul_precision_scope};
use kiln::nn::{Linear, Module, ReLU, Sequential, autocast};
use kiln::optim::{Optimizer, Sgd, attach_compute_copies};
use kiln::tensor::{DType, Device as TDev, Targets, Tensor};
use std::sync::Arc;

#[path = "timing.rs"]
mod timing;

/// (batch, width, layers): the three models.
const MODELS: &[(usize, usize, usize)] = &[(64, 256, 4), (256, 1024, 4), (4096, 1024, 8)];
const LR: f64 = 0.01;

/// How kiln runs a case's step.
#[derive(Clone, Copy)]
enum Path {
    /// f32 tensors, f32 products.
    F32,
    /// Mixed precision: f32 masters, optimizer-written bf16 copies, bf16 activations and products.
    Mixed,
}

impl Path {
    fn describe(self) -> &'static str {
        match self {
            Path::F32 => "f32 tensors, f32 products",
            Path::Mixed => {
                "mixed: f32 masters, bf16 copies written by the optimizer, bf16 activations and products \
                 (Linear+ReLU one fused GEMM on sm_90a), f32 loss"
            }
        }
    }
}

/// One case: ms per step (NaN where the step could not run, with the reason; a note for a captured
/// step) and peak bytes.
fn case(dev: &Arc<Device>, model: (usize, usize, usize), path: Path, graph: bool) -> (f64, u64, Option<String>) {
    let (batch, width, layers) = model;
    let (reps, per) = if batch * width >= 1 << 22 { (7, 3) } else { (15, 10) };
    dev.reset_peak_memory().expect("resetting the pool's high-water mark");
    let td = TDev::Cuda(Arc::clone(dev));
    let mut rng = Tensor::rng(7);
    let mut net = Sequential::new();
    for l in 0..layers {
        net = net.push(Linear::new(width, width, false, DType::F32, &mut rng).expect("linear"));
        if l + 1 < layers {
            net = net.push(ReLU);
        }
    }
    for p in net.parameters() {
        p.move_to(&td).expect("to device");
    }
    let mut opt = Sgd::new(net.named_parameters(), LR, 0.0, 0.0, false);
    let mixed = matches!(path, Path::Mixed);
    if mixed {
        attach_compute_copies(&mut opt, DType::BF16).expect("bf16 compute copies");
    }
    let x = Tensor::randn([batch, width], DType::F32, &mut rng).to_device(&td).expect("upload");
    let targets = Targets::new((0..batch).map(|i| (i * 37) % width).collect());
    let _precision = matmul_precision_scope(MatmulPrecision::F32);
    let mut step = || -> kiln::Result<()> {
        let _mixed = if mixed { Some(autocast(DType::BF16)?) } else { None };
        let loss = net.forward(&x)?.cross_entropy(&targets)?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad();
        Ok(())
    };
    // warm every cache (kernels, tensor maps, the pool) before timing or capturing
    for _ in 0..3 {
        step().expect("training step");
    }
    let (ms, why) = if graph {
        let maps_before = dev.tensor_map_cache_stats().misses;
        match dev.capture(&mut step) {
            Ok(g) => (
                timing::median_ms_batched(dev, reps, per, || {
                    // SAFETY: the model, optimizer state, input and targets the step used live
                    // until the end of this function, after the timing.
                    unsafe { g.launch() }.expect("replaying the step's graph")
                }),
                Some(format!(
                    "captured: one graph per step; {} tensor map(s) made during the capture for the graph's buffers",
                    dev.tensor_map_cache_stats().misses - maps_before
                )),
            ),
            Err(e) => (f64::NAN, Some(format!("capture refused: {e}"))),
        }
    } else {
        (timing::median_ms_batched(dev, reps, per, || step().expect("training step")), None)
    };
    (ms, dev.peak_memory().expect("the pool's high-water mark"), why)
}

fn main() {
    let Some(dev) = timing::gpu_or_skip("engine_step bench") else { return };
    println!("device: {}; kiln's layer-by-layer training step, ms per step and peak memory", dev.name());
    let mut rows = vec![];
    for &(b, w, l) in MODELS.iter().filter(|(b, w, l)| timing::wanted("KILN_BENCH_MODELS", &format!("{b}x{w}x{l}"))) {
        for (dtype, path) in [("f32", Path::F32), ("bf16", Path::Mixed)] {
            if !timing::wanted("KILN_BENCH_DTYPES", dtype) {
                continue;
            }
            for (mode, graph) in [("eager", false), ("graph", true)] {
                if !timing::wanted("KILN_BENCH_MODES", mode) {
                    continue;
                }
                let (ms, peak, why) = case(&dev, (b, w, l), path, graph);
                let note = why.as_deref().unwrap_or("");
                println!(
                    "b{b} w{w} d{l} {dtype} {mode}: {} ms, peak {:.1} MiB ({}) {note}",
                    if ms.is_finite() { format!("{ms:.4}") } else { "-".into() },
                    peak as f64 / (1 << 20) as f64,
                    path.describe()
                );
                rows.push(format!(
                    "{{\"model\":\"{b}x{w}x{l}\",\"dtype\":\"{dtype}\",\"mode\":\"{mode}\",\"kiln_path\":\"{}\",\"ms\":{},\"peak_bytes\":{peak},\"note\":{}}}",
                    path.describe(),
                    if ms.is_finite() { format!("{ms:.5}") } else { "null".into() },
                    serde_json::to_string(note).expect("a string")
                ));
            }
        }
    }
    let json =
        format!("{{\"device\":{},\"rows\":[{}]}}\n", serde_json::to_string(dev.name()).expect("name"), rows.join(","));
    let out = std::env::var("KILN_BENCH_OUT").unwrap_or_else(|_| "engine_step.json".into());
    if let Err(e) = std::fs::write(&out, json) {
        eprintln!("writing {out}: {e}");
    }
}
