//! One MLP training step (forward, softmax cross-entropy, backward, SGD) on the GPU, three ways:
//! the megakernel (one launch per step; each data path, every tile), kiln's layer-by-layer
//! autograd path (f32 products, and bf16 products on the tensor cores), and (in
//! `benches/torch_mlp_step.py`, same run) PyTorch eager and as a CUDA graph. Models: `layers`
//! bias-free Linear layers of `width` (ReLU between), `width` classes, f32, SGD lr 0.01.
//! Writes JSON to `$KILN_BENCH_OUT` (default `mlp_step.json`).
//!
//! Run: `cargo bench --bench mlp_step`, or `benches/mlp_step` from a GPU bundle. Without a GPU it
//! prints why and exits 0. `KILN_BENCH_MODELS=4096x1024x8,...` (batch x width x layers) and
//! `KILN_BENCH_PATHS=cuda-cores,tf32,tf32x3,bf16` and `KILN_BENCH_TILES=32,64` pick a subset (for a profiler run, for example).
//! `KILN_BENCH_TRACE=1` also runs one traced megakernel step per model, path and tile (after its
//! timing) and prints where its time went, phase by phase (`kiln::megakernel::StepTrace`);
//! `KILN_BENCH_SMS=n` schedules the megakernel for `n` SMs (default: all);
//! `KILN_BENCH_MEGAKERNEL_ONLY=1` times the megakernel alone (no layer-by-layer step, no JSON entry).
//! `KILN_BENCH_TRACE_DIR=dir` also writes each trace's stamps there as CSV.

use kiln::megakernel::{DataPath, GpuStep, Loss, MlpShape, StepInputs, Updates, build, build_with_tile};
use kiln::nn::{Linear, Module, ReLU, Sequential};
use kiln::optim::{Optimizer, Sgd};
use kiln::tensor::{DType, Device as TDev, Tensor};
use std::sync::Arc;

#[path = "timing.rs"]
mod timing;

/// (batch, width, layers): the three models.
const MODELS: &[(usize, usize, usize)] = &[(64, 256, 4), (256, 1024, 4), (4096, 1024, 8)];
const LR: f32 = 0.01;

fn main() {
    let Some(dev) = timing::gpu_or_skip("mlp_step bench") else { return };
    // KILN_BENCH_SMS=n: schedule the megakernel for n SMs instead of all (to see how a tile's
    // speed depends on how many SMs share the L2, for example)
    let all_sms = dev.sm_count().expect("SM count");
    let sms = std::env::var("KILN_BENCH_SMS").ok().and_then(|v| v.parse().ok()).unwrap_or(all_sms).clamp(1, all_sms);
    println!("device: {}, per training step, f32, median of samples of back-to-back steps", dev.name());
    let mut json = format!("{{\"device\":\"{}\",\"models\":[", dev.name());
    let models = MODELS.iter().filter(|(b, w, l)| timing::wanted("KILN_BENCH_MODELS", &format!("{b}x{w}x{l}")));
    for (mi, &(batch, width, layers)) in models.enumerate() {
        let (reps, per) = if batch * width >= 1 << 22 { (5, 2) } else { (15, 10) };
        let mut rng = Tensor::rng(7);
        let x = Tensor::randn([batch, width], DType::F32, &mut rng).to_vec_f32();
        let classes: Vec<usize> = (0..batch).map(|i| (i * 37) % width).collect();

        // Megakernel: one launch per step, on each data path, every tile size (so the chooser's pick
        // can be checked against the others). The batch stays on the device (as PyTorch's graph's
        // static inputs do); stalls are checked once after the timing instead of after every step.
        let shape = MlpShape { batch, dims: vec![width; layers + 1] };
        let weights: Vec<Vec<f32>> = (0..layers)
            .map(|_| Tensor::randn([width * width], DType::F32, &mut rng).to_vec_f32())
            .map(|w| w.iter().map(|v| v / (width as f32).sqrt()).collect())
            .collect();
        let inp = StepInputs { x: &x, y: &[], classes: &classes, loss: Loss::CrossEntropy, lr: LR, momentum: 0.0 };
        let mut paths_json = vec![];
        let mut paths_text = vec![];
        let paths = [
            (DataPath::CudaCores, "cuda-cores"),
            (DataPath::Tf32, "tf32"),
            (DataPath::Tf32x3, "tf32x3"),
            (DataPath::Bf16, "bf16"),
        ];
        for path in paths.into_iter().filter(|(_, name)| timing::wanted("KILN_BENCH_PATHS", name)).map(|(p, _)| p) {
            let chosen = build(&shape, sms, path).expect("schedule").tile;
            let mut per_tile = vec![];
            for &tile in path.tiles().iter().filter(|t| timing::wanted("KILN_BENCH_TILES", &t.to_string())) {
                // KILN_BENCH_UPDATES=separate: weight gradients and updates as separate instructions
                let updates = match std::env::var("KILN_BENCH_UPDATES").as_deref() {
                    Ok("separate") => Updates::Separate,
                    _ => Updates::Fused,
                };
                let sched = build_with_tile(&shape, sms, tile, updates, path.weight_reads()).expect("schedule");
                let mut mega = match GpuStep::new(dev.clone(), &sched, &weights, path) {
                    Ok(m) => m,
                    Err(e) => {
                        println!("  {path:?}: {e}");
                        break;
                    }
                };
                mega.load_batch(&inp).expect("batch");
                mega.check_every = 0;
                let ms = timing::median_ms_batched(&dev, reps, per, || {
                    mega.run(Loss::CrossEntropy, LR, 0.0).expect("megakernel step")
                });
                mega.check().expect("no stalled wait while timing");
                if std::env::var("KILN_BENCH_TRACE").is_ok_and(|v| v == "1") {
                    // one more step, with every instruction's timestamps
                    mega.set_trace(true).expect("trace buffer");
                    mega.run(Loss::CrossEntropy, LR, 0.0).expect("traced step");
                    let t = mega.trace().expect("trace");
                    println!("trace of {batch}x{width}x{layers}, {path:?}, tile {tile}:\n{}", t.summary());
                    if let Ok(dir) = std::env::var("KILN_BENCH_TRACE_DIR") {
                        let f = format!("{dir}/trace-{batch}x{width}x{layers}-{path:?}-{tile}.csv");
                        std::fs::write(&f, t.to_csv()).expect("writing the trace");
                    }
                    mega.set_trace(false).expect("trace off");
                }
                per_tile.push((tile, ms));
            }
            let Some(&(_, ms)) = per_tile.iter().find(|(t, _)| *t == chosen) else { continue };
            let tiles_json: Vec<String> = per_tile.iter().map(|(t, ms)| format!("\"{t}\":{ms:.4}")).collect();
            let tiles_text: Vec<String> = per_tile.iter().map(|(t, ms)| format!("{t}: {ms:.3}")).collect();
            paths_json.push(format!(
                "\"{path:?}\":{{\"tile\":{chosen},\"ms\":{ms:.4},\"ms_by_tile\":{{{}}}}}",
                tiles_json.join(",")
            ));
            paths_text.push(format!("{path:?} {ms:.3} (tile {chosen}; {})", tiles_text.join(", ")));
        }

        if std::env::var("KILN_BENCH_MEGAKERNEL_ONLY").is_ok_and(|v| v == "1") {
            println!("b{batch} w{width} d{layers} on {sms} SMs: megakernel ms/step {}", paths_text.join("; "));
            continue;
        }
        // kiln layer by layer (autograd on the CUDA backend).
        let td = TDev::Cuda(Arc::clone(&dev));
        let mut model = Sequential::new();
        for l in 0..layers {
            model = model.push(Linear::new(width, width, false, DType::F32, &mut rng).expect("linear"));
            if l + 1 < layers {
                model = model.push(ReLU);
            }
        }
        for p in model.parameters() {
            p.move_to(&td).expect("to device");
        }
        let mut opt = Sgd::new(model.named_parameters(), LR as f64, 0.0, 0.0, false);
        let xt = Tensor::from_vec(x.clone(), [batch, width]).expect("x").to_device(&td).expect("upload");
        let targets = kiln::tensor::Targets::new(classes.clone());
        let mut step = || -> kiln::Result<()> {
            let loss = model.forward(&xt)?.cross_entropy(&targets)?;
            loss.backward()?;
            opt.step()?;
            opt.zero_grad();
            Ok(())
        };
        let layered_ms = timing::median_ms_batched(&dev, reps, per, || step().expect("training step"));
        // the same path with bf16 products (every Linear's forward and gradients on the tensor cores)
        let layered_bf16_ms = {
            let _bf16 = kiln::cuda::matmul_precision_scope(kiln::cuda::MatmulPrecision::Bf16);
            timing::median_ms_batched(&dev, reps, per, || step().expect("training step"))
        };
        // the step captured once into a CUDA graph (after the eager steps above warmed every
        // cache), then replayed: one launch per step
        let mut graphed = |what: &str| match dev.capture(&mut step) {
            Ok(graph) => timing::median_ms_batched(&dev, reps, per, || {
                // SAFETY: the model, optimizer state, input and targets the step used live until the
                // end of this model's iteration, after the timing.
                unsafe { graph.launch() }.unwrap_or_else(|e| panic!("replaying the {what} step's graph: {e}"))
            }),
            Err(e) => {
                println!("  the layer-by-layer step with {what} products could not be captured: {e}");
                f64::NAN
            }
        };
        let layered_graph_ms = graphed("f32");
        let layered_bf16_graph_ms = {
            let _bf16 = kiln::cuda::matmul_precision_scope(kiln::cuda::MatmulPrecision::Bf16);
            graphed("bf16")
        };
        let js = |ms: f64| if ms.is_finite() { format!("{ms:.4}") } else { "null".into() };

        println!(
            "b{batch} w{width} d{layers}: megakernel ms/step {}; kiln layer-by-layer {layered_ms:.3} ms/step, \
             as a CUDA graph {layered_graph_ms:.3}; with bf16 products {layered_bf16_ms:.3}, as a graph \
             {layered_bf16_graph_ms:.3}",
            paths_text.join("; ")
        );
        json += &format!(
            "{}{{\"batch\":{batch},\"width\":{width},\"layers\":{layers},\"megakernel\":{{{}}},\"layered_ms\":{layered_ms:.4},\"layered_bf16_ms\":{layered_bf16_ms:.4},\"layered_graph_ms\":{},\"layered_bf16_graph_ms\":{}}}",
            if mi > 0 { "," } else { "" },
            paths_json.join(","),
            js(layered_graph_ms),
            js(layered_bf16_graph_ms)
        );
    }
    json += "]}\n";
    let out = std::env::var("KILN_BENCH_OUT").unwrap_or_else(|_| "mlp_step.json".into());
    if let Err(e) = std::fs::write(&out, json) {
        eprintln!("writing {out}: {e}");
    }
}
