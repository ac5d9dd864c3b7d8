//! Memory-bound tensor kernels on the GPU against the device's copy bandwidth, measured in the same
//! run: elementwise add and ReLU, softmax, layer norm and cross-entropy forward at 16384 x 4096 f32
//! (the shapes of issue 3). Prints a table and writes JSON to `$KILN_BENCH_OUT` (default
//! `tensor_ops.json`). `benches/torch_tensor_ops.py` measures PyTorch on the same shapes.
//!
//! Run: `cargo bench --bench tensor_ops`, or from a GPU bundle: `benches/tensor_ops`.
//! Without a GPU it prints why and exits 0.

use kiln::cuda::Device;
use kiln::tensor::{DType, Device as TDev, Tensor, no_grad};
use std::sync::Arc;
use std::time::Instant;

const ROWS: usize = 16384;
const COLS: usize = 4096;
const REPS: usize = 20;
/// Calls per timed sample (see `timing::median_ms_batched`); the PyTorch script does the same.
const BATCH: usize = 5;

#[path = "timing.rs"]
mod timing;

fn median_ms(dev: &Arc<Device>, f: impl FnMut()) -> f64 {
    timing::median_ms_batched(dev, REPS, BATCH, f)
}

fn main() {
    let Some(dev) = timing::gpu_or_skip("tensor_ops bench") else { return };
    let _g = no_grad();
    let td = TDev::Cuda(dev.clone());
    let n = ROWS * COLS;
    let mut rng = Tensor::rng(1);
    let host = Instant::now();
    let x = Tensor::randn([ROWS, COLS], DType::F32, &mut rng).to_device(&td).expect("upload");
    let y = Tensor::randn([ROWS, COLS], DType::F32, &mut rng).to_device(&td).expect("upload");
    let w = Tensor::ones([COLS], DType::F32).to_device(&td).expect("upload");
    let b = Tensor::zeros([COLS], DType::F32).to_device(&td).expect("upload");
    // Targets live on the device, as PyTorch's do in its run: built once, copied on first use.
    let targets = kiln::tensor::Targets::new((0..ROWS).map(|i| (i * 31) % COLS).collect());
    eprintln!("inputs ready in {:.1} s", host.elapsed().as_secs_f64());

    // The ceiling: a device-to-device copy of the same bytes (read + write).
    let src = dev.zeros::<f32>(n).expect("alloc");
    let mut dst = dev.zeros::<f32>(n).expect("alloc");
    let copy_ms = median_ms(&dev, || dev.stream().memcpy_dtod(src.slice(), dst.slice_mut()).expect("copy"));
    let bytes = (n * 4) as f64;
    let copy_gbs = 2.0 * bytes / copy_ms / 1e6;

    // (name, bytes moved: inputs read once + outputs written once, time)
    let f4 = bytes;
    let rows = [
        ("add", 3.0 * f4, median_ms(&dev, || drop(x.add(&y).expect("add")))),
        ("relu", 2.0 * f4, median_ms(&dev, || drop(x.relu().expect("relu")))),
        ("softmax", 2.0 * f4, median_ms(&dev, || drop(x.softmax().expect("softmax")))),
        ("layer_norm", 2.0 * f4, median_ms(&dev, || drop(x.layer_norm(&w, &b, 1e-5).expect("layer_norm")))),
        ("cross_entropy", f4, median_ms(&dev, || drop(x.cross_entropy(&targets).expect("cross_entropy")))),
    ];
    println!(
        "device: {} ({}.{}), {ROWS}x{COLS} f32, median of {REPS} samples of {BATCH} back-to-back calls",
        dev.name(),
        dev.compute_capability().0,
        dev.compute_capability().1
    );
    println!("{:<14} {:>9} {:>9} {:>9}", "op", "ms", "GB/s", "of copy");
    println!("{:<14} {:>9.3} {:>9.0} {:>8.0}%", "copy (d2d)", copy_ms, copy_gbs, 100.0);
    let mut json =
        format!("{{\"device\":\"{}\",\"rows\":{ROWS},\"cols\":{COLS},\"copy_gbs\":{copy_gbs:.1},\"ops\":[", dev.name());
    for (i, (name, moved, ms)) in rows.iter().enumerate() {
        let gbs = moved / ms / 1e6;
        println!("{:<14} {:>9.3} {:>9.0} {:>8.0}%", name, ms, gbs, 100.0 * gbs / copy_gbs);
        json += &format!(
            "{}{{\"op\":\"{name}\",\"ms\":{ms:.4},\"gbs\":{gbs:.1},\"of_copy\":{:.3}}}",
            if i > 0 { "," } else { "" },
            gbs / copy_gbs
        );
    }
    json += "]}\n";
    let out = std::env::var("KILN_BENCH_OUT").unwrap_or_else(|_| "tensor_ops.json".into());
    if let Err(e) = std::fs::write(&out, json) {
        eprintln!("writing {out}: {e}");
    }
}
