//! `kiln gemm`, `kiln attention`, `kiln info` and the multi-GPU measurements (`kiln allreduce`,
//! `kiln dist-bench`): the kernels' and collectives' commands.

use super::args::*;
use kiln::cuda::Device;
use kiln::gpu::Arch;
use std::io::Write;
use std::path::PathBuf;

pub(crate) fn dist_bench(a: DistBenchArgs) -> kiln::Result<bool> {
    let r = kiln::train::dist_bench::dist_bench(&a.cfg)?;
    let c = &r.config;
    println!(
        "kiln dist-bench: MLP {}x{}x{} per GPU, f32, SGD, on {} ({} bucket(s) of up to {} MiB, {}{})",
        c.batch,
        c.width,
        c.layers,
        r.device,
        r.buckets,
        c.bucket_bytes >> 20,
        if c.overlap { "overlapped with the backward pass" } else { "after the backward pass" },
        if c.zero1 { ", ZeRO-1" } else { "" }
    );
    println!("  1 GPU: {:.3} ms/step, {:.0} rows/s", r.ms_one, c.batch as f64 / r.ms_one * 1e3);
    println!(
        "  {} GPUs: {:.3} ms/step, {:.0} rows/s, {:.2}x the rows/s of one GPU",
        c.gpus,
        r.ms_many,
        (c.batch * c.gpus) as f64 / r.ms_many * 1e3,
        r.scaling()
    );
    println!("  {} GPUs, each rank its own step at once, no communication: {:.3} ms/step", c.gpus, r.ms_many_alone);
    let (bwd, comm, hidden) = r.overlap_ms();
    println!(
        "  one step on rank 0 (ms from the forward's start; backward {bwd:.3} ms, collectives {comm:.3} ms, {hidden:.3} ms of them during the backward):"
    );
    for e in &r.timeline {
        println!("    {:>9.3}  {:<7}  {}", e.ms, e.stream, e.label);
    }
    if let Some(path) = &a.json {
        std::fs::write(path, r.to_json() + "\n").map_err(|e| kiln::Error::File {
            path: path.to_path_buf(),
            msg: format!("writing the JSON report: {e}"),
        })?;
        println!("  wrote {}", path.display());
    }
    Ok(true)
}

pub(crate) fn allreduce(
    bytes: usize,
    gpus: usize,
    reps: usize,
    warmup: usize,
    json: Option<PathBuf>,
) -> kiln::Result<bool> {
    let b = kiln::dist::bench_all_reduce(gpus, bytes, reps, warmup)?;
    println!(
        "kiln all_reduce f32 sum: {} bytes on {} GPUs: {:.3} ms  algbw {:.1} GB/s  busbw {:.1} GB/s",
        b.bytes,
        b.gpus,
        b.seconds * 1e3,
        b.algbw_gbs,
        b.busbw_gbs
    );
    if let Some(path) = json {
        let text = format!(
            "{{\"bytes\":{},\"gpus\":{},\"ms\":{:.4},\"algbw_gbs\":{:.2},\"busbw_gbs\":{:.2}}}\n",
            b.bytes,
            b.gpus,
            b.seconds * 1e3,
            b.algbw_gbs,
            b.busbw_gbs
        );
        std::fs::write(&path, text).map_err(|e| kiln::Error::File {
            path: path.to_path_buf(),
            msg: format!("writing the JSON report: {e}"),
        })?;
    }
    Ok(true)
}

/// The `x`-separated sizes of a shape argument, each 1 or more; `form` says how to write it.
fn parse_dims(s: &str, form: &str) -> Result<Vec<u32>, String> {
    s.split('x')
        .map(|x| x.trim().parse::<u32>().ok().filter(|&d| d >= 1))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("{form} (and at most {})", u32::MAX))
}

pub(crate) fn parse_attention_shape(s: &str) -> Result<kiln::cuda::attention::AttentionShape, String> {
    let form = "write the shape as BxHxSxD, e.g. 4x16x4096x128, each of B, H, S and D 1 or more";
    let v = parse_dims(s, form)?;
    match v[..] {
        [batch, heads, seq, head_dim] => {
            Ok(kiln::cuda::attention::AttentionShape { batch, heads, q_len: seq, kv_len: seq, head_dim })
        }
        _ => Err(form.into()),
    }
}

/// `kiln attention`: one flash forward kernel on random inputs, checked and timed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    kernel: Option<String>,
    shape: kiln::cuda::attention::AttentionShape,
    kv_len: Option<u32>,
    causal: bool,
    (backward, backward_kernel): (bool, Option<String>),
    blocks: Option<u32>,
    reps: usize,
    seed: u64,
) -> kiln::Result<bool> {
    use kiln::cuda::attention::{FLASH_KERNELS, FlashBwdKernel, flash_entry};
    let backward_kernel = backward_kernel.as_deref().map(FlashBwdKernel::from_name).transpose()?;
    let backward = backward || backward_kernel.is_some();
    let Some(name) = kernel else {
        say!("kernels (--kernel NAME), rung by rung (head dims 64 and 128):");
        for &(n, dtype) in kiln::tools::attention::NAIVE_KERNELS {
            say!("  {n:22} rung 0, {dtype:?}: tensor ops (S and P materialized; any head dim)");
        }
        for e in FLASH_KERNELS {
            say!("  {:22} rung {}, {:?} in and out", e.name, e.rung, e.dtype);
        }
        return Ok(true);
    };
    if let Some(&(_, dtype)) = kiln::tools::attention::NAIVE_KERNELS.iter().find(|(n, _)| *n == name) {
        return attention_naive(&name, dtype, shape, kv_len, causal, backward, reps, seed);
    }
    // the name, the sizes and the table first: a mistake there is reported before the device opens
    let entry = flash_entry(&name)?;
    let shape = kiln::cuda::attention::AttentionShape { kv_len: kv_len.unwrap_or(shape.q_len), ..shape };
    let scale = 1.0 / (shape.head_dim as f32).sqrt();
    let lens = [shape.q_elems(), shape.kv_elems(), shape.kv_elems(), shape.q_elems(), shape.lse_elems()];
    kiln::cuda::attention::check_forward(entry.kernel, entry.dtype, shape, scale, lens, [0; 5])?;
    kiln::cuda::attention::check_blocks(entry.kernel, blocks)?;
    // the backward kernel (--backward-kernel, or the one the forward's rung pairs with) takes the
    // forward's dtype and head dim; its module is checked once the device is open
    let bwd_kernel = backward.then(|| backward_kernel.unwrap_or(FlashBwdKernel::of_forward(entry.kernel)));
    if let Some(b) = bwd_kernel {
        let grads = [shape.q_elems(), shape.q_elems(), shape.kv_elems(), shape.kv_elems()];
        let all = [lens[0], lens[1], lens[2], lens[3], lens[4], grads[0], grads[1], grads[2], grads[3]];
        kiln::cuda::attention::check_backward(b, entry.dtype, shape, scale, all, [0; 9])?;
    }
    // host: f32 inputs, their f64 copies and the outputs read back; device: inputs and outputs
    let (q, kv, l) = (shape.q_elems() as u64, shape.kv_elems() as u64, shape.lse_elems() as u64);
    let elem = entry.dtype.size() as u64;
    let bwd = backward as u64;
    let need = kiln::train::MemoryNeed {
        // with --backward: dO (f32 and f64), the gradients read back and the reference's
        host: (q + 2 * kv) * (4 + 8 + elem) + q * (4 + elem) + l * 4 + bwd * (q * 12 + (q + 2 * kv) * (4 + 8)),
        device: (2 * q + 2 * kv) * elem + l * 4 + bwd * ((2 * q + 2 * kv) * elem + l * 4),
    };
    let what = format!(
        "attention {}x{}x{}x{} (inputs, outputs and their f64 copies)",
        shape.batch, shape.heads, shape.q_len, shape.head_dim
    );
    let Some(dev) = kernel_device(&what, need)? else { return Ok(false) };
    say!("device: {} ({})", dev.name(), dev.arch().name());
    let r = kiln::tools::attention::run(&dev, &name, shape, causal, reps, seed, bwd_kernel, blocks)?;
    say!("{r}");
    Ok(r.passed())
}

/// `kiln attention --kernel naive`: the naive rung (tensor ops) on random inputs, checked and timed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_naive(
    name: &str,
    dtype: kiln::DType,
    shape: kiln::cuda::attention::AttentionShape,
    kv_len: Option<u32>,
    causal: bool,
    backward: bool,
    reps: usize,
    seed: u64,
) -> kiln::Result<bool> {
    if backward {
        return Err(kiln::Error::Unsupported {
            op: "attention",
            what: format!(
                "--backward (or --backward-kernel) with {name}: the naive rung's gradients come from autograd (tests/attention_op.rs); use flash_fwd_wgmma_bf16 or flash_fwd_mma_bf16 for a timed backward"
            ),
        });
    }
    let shape = kiln::cuda::attention::AttentionShape { kv_len: kv_len.unwrap_or(shape.q_len), ..shape };
    // host: f32 inputs, their rounded f64 copies, O; device: inputs, S and P (f32 or bf16), the mask, O
    let (q, kv) = (shape.q_elems() as u64, shape.kv_elems() as u64);
    let scores = shape.batch as u64 * shape.heads as u64 * shape.q_len as u64 * shape.kv_len as u64;
    let elem = dtype.size() as u64;
    let need = kiln::train::MemoryNeed {
        host: (q + 2 * kv) * (4 + 8 + elem) + q * 8,
        device: (2 * q + 2 * kv) * elem + 3 * scores * elem + q * 4,
    };
    let what = format!(
        "naive attention {}x{}x{}x{} (inputs, scores, probabilities, outputs)",
        shape.batch, shape.heads, shape.q_len, shape.head_dim
    );
    let Some(dev) = kernel_device(&what, need)? else { return Ok(false) };
    say!("device: {} ({})", dev.name(), dev.arch().name());
    let r = kiln::tools::attention::run_naive(name, shape, causal, reps, seed)?;
    say!("{r}");
    Ok(r.passed())
}

pub(crate) fn parse_shape(s: &str) -> Result<kiln::gpu::kernels::mma_tile::GemmShape, String> {
    let form = "write the shape as MxNxK, e.g. 4096x4096x4096, each of M, N and K 1 or more";
    let v = parse_dims(s, form)?;
    match v[..] {
        [m, n, k] => Ok(kiln::gpu::kernels::mma_tile::GemmShape { m, n, k }),
        _ => Err(form.into()),
    }
}

/// The memory `kiln gemm` holds for an `m x n x k` product: on the host the f32 operands, their
/// f64 reference copies, the poisoned and the read-back output; on the GPU the operands (and their
/// 16-bit copies) and the output. `--ladder` adds `gemm_bf16`'s packed copies and cuBLAS's on the
/// GPU (f32, bf16 and f16 operands, an output). Checked arithmetic: a size beyond 64 bits reads as `u64::MAX`.
pub(crate) fn gemm_memory(s: kiln::gpu::kernels::mma_tile::GemmShape, ladder: bool) -> kiln::train::MemoryNeed {
    let (m, n, k) = (s.m as u64, s.n as u64, s.k as u64);
    let need = || -> Option<kiln::train::MemoryNeed> {
        let operands = m.checked_mul(k)?.checked_add(k.checked_mul(n)?)?;
        let output = m.checked_mul(n)?;
        let (operand_bytes, output_bytes) = if ladder { (4 + 2 + 2 + 4 + 2 + 2, 4 + 4) } else { (4 + 2, 4) };
        Some(kiln::train::MemoryNeed {
            host: operands.checked_mul(4 + 8)?.checked_add(output.checked_mul(4 + 4)?)?,
            device: operands.checked_mul(operand_bytes)?.checked_add(output.checked_mul(output_bytes)?)?,
        })
    };
    need().unwrap_or(kiln::train::MemoryNeed { host: u64::MAX, device: u64::MAX })
}

/// Device 0 for `kiln gemm` and `kiln attention`, once `need` (of the work `what`) fits the host's
/// memory and then the device's (an error saying to lower `--shape` otherwise); `None`, said as
/// such, where there is no usable GPU.
pub(crate) fn kernel_device(what: &str, need: kiln::train::MemoryNeed) -> kiln::Result<Option<Device>> {
    kiln::train::check_memory(what, need, None, "lower --shape")?;
    let dev = match Device::new(0) {
        Ok(dev) => dev,
        Err(e) => {
            eprintln!(
                "error: no usable GPU: {e}. `kiln gemm` and `kiln attention` run their kernels on a CUDA GPU of \
                 compute capability 8.0 or newer"
            );
            return Ok(None);
        }
    };
    kiln::train::check_memory(what, need, Some(&dev), "lower --shape")?;
    Ok(Some(dev))
}

/// `kiln gemm --ladder`: every kernel on the same inputs, cuBLAS around each, as the guide's table.
pub(crate) fn gemm_ladder(
    shape: kiln::gpu::kernels::mma_tile::GemmShape,
    reps: usize,
    seed: u64,
    json: Option<PathBuf>,
) -> kiln::Result<bool> {
    let kiln::gpu::kernels::mma_tile::GemmShape { m, n, k } = shape;
    let what = format!("gemm --ladder {m}x{n}x{k} (operands, output, their f64 reference and cuBLAS's copies)");
    let need = gemm_memory(shape, true);
    let Some(dev) = kernel_device(&what, need)? else { return Ok(false) };
    // the JSON's file is created before the ladder runs, so a bad path fails at once
    let file_error = |path: &PathBuf, e: std::io::Error| kiln::Error::File { path: path.clone(), msg: e.to_string() };
    let json_file = match &json {
        Some(path) => Some(std::fs::File::create(path).map_err(|e| file_error(path, e))?),
        None => None,
    };
    let table = kiln::tools::ladder_table::run_ladder(&dev, shape, reps, seed)?;
    say!("{table}");
    if let (Some(path), Some(mut file)) = (json, json_file) {
        let p = kiln::tools::ladder_table::Provenance {
            date: kiln::tools::ladder_table::utc_date_today(),
            commit: source_commit(),
            command: std::env::args().collect::<Vec<_>>().join(" "),
        };
        file.write_all(table.to_json(&p).as_bytes()).map_err(|e| file_error(&path, e))?;
        say!("wrote {}", path.display());
    }
    Ok(table.passed())
}

/// The commit the binary's source is at: `KILN_COMMIT` if set, else `git rev-parse --short HEAD`
/// in the source tree it was built from, if that is still here (not on a machine that runs a GPU
/// bundle: there, set `KILN_COMMIT`).
pub(crate) fn source_commit() -> Option<String> {
    if let Ok(c) = std::env::var("KILN_COMMIT") {
        return Some(c);
    }
    let out = std::process::Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|c| !c.is_empty())
}

pub(crate) fn gemm(
    kernel: Option<String>,
    shape: kiln::gpu::kernels::mma_tile::GemmShape,
    reps: usize,
    seed: u64,
    split_k: Option<u32>,
) -> kiln::Result<bool> {
    let Some(name) = kernel else {
        say!("kernels (--kernel NAME), in ladder order:");
        for n in kiln::tools::gemm_ladder::kernel_names() {
            say!("  {n}");
        }
        return Ok(true);
    };
    // the name and the sizes first: a mistake there is reported before the device is opened
    let names = kiln::tools::gemm_ladder::kernel_names();
    if !names.contains(&name.as_str()) {
        return Err(kiln::Error::Unsupported {
            op: "gemm",
            what: format!("--kernel {name}: no such kernel; known: {}", names.join(", ")),
        });
    }
    let kiln::gpu::kernels::mma_tile::GemmShape { m, n, k } = shape;
    let what = format!("gemm {m}x{n}x{k} (operands, output and their f64 reference)");
    let need = gemm_memory(shape, false);
    let Some(dev) = kernel_device(&what, need)? else { return Ok(false) };
    say!("device: {} ({})", dev.name(), dev.arch().name());
    let r = kiln::tools::gemm_ladder::run(&dev, &name, shape, reps, seed, split_k)?;
    say!("{r}");
    Ok(r.passed())
}

pub(crate) fn info(load_time: bool) -> kiln::Result<()> {
    say!("kiln {}", env!("CARGO_PKG_VERSION"));
    say!("PTX modules built into this binary:");
    for arch in Arch::ALL {
        let entries = kiln::ptx::entries(kiln::ptx::embedded(arch));
        say!("  {:8} {:2} kernels: {}", arch.name(), entries.len(), entries.join(", "));
    }
    say!("{}", kiln::ptx::cubin_summary());
    match Device::new(0) {
        Ok(dev) => {
            let (major, minor) = dev.compute_capability();
            let forced =
                if kiln::ptx::force_ptx() { format!(" ({}=1)", kiln::ptx::FORCE_PTX_ENV) } else { String::new() };
            say!(
                "device 0: {} (compute capability {major}.{minor}), loads the {} module: {}{forced}",
                dev.name(),
                dev.arch().name(),
                dev.module_source()
            );
            if load_time {
                for t in dev.time_module_loads()? {
                    say!("  loading {}: {:.1} ms", t.source, t.elapsed.as_secs_f64() * 1e3);
                }
                say!(
                    "  {}",
                    if kiln::cuda::jit_cache_disabled() {
                        "the driver's JIT cache is off (CUDA_CACHE_DISABLE=1): a PTX time is its compilation"
                    } else {
                        "the driver's JIT cache is on: a PTX time may be a cache hit (CUDA_CACHE_DISABLE=1 times the compilation)"
                    }
                );
            }
        }
        Err(e) if load_time => return Err(e),
        Err(e) => say!("no usable GPU: {e}"),
    }
    say!("CPU backend: {} threads", kiln::tensor::cpu::num_threads());
    Ok(())
}
