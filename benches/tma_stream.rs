//! How fast one loader thread streams TMA boxes into an SM: the megakernel's page protocol without
//! its math (`kiln_gpu::kernels::tma_stream`), over variants that each change one thing against
//! the megakernel's own loads (f32, 128-byte swizzle, two 8 KiB boxes per 16 KiB stage, a ring
//! of 12, the megakernel's bounded wait loop): the element type and box shape of the GEMM kernels,
//! the wait loop, the ring depth, descriptor prefetch, proxy fences, many maps, consumer work,
//! fewer blocks, a tensor larger than L2.
//!
//! Per variant: the grid's bytes over the span from the first block's start to the last block's end
//! (in-kernel global timer), the per-block rate and time per stage, and from the SM clock the mean
//! time from a stage's `arrive.expect_tx` to consumer thread 0 seeing it ready, and the shares of
//! the span the consumers and the loader spent waiting. Writes JSON to `$KILN_BENCH_OUT` (default
//! `tma_stream.json`); `KILN_BENCH_VARIANTS=name,...` picks a subset.
//!
//! Run: `cargo bench --bench tma_stream`, or `benches/tma_stream` from a GPU bundle. Without a
//! GPU it prints why and exits 0.

use kiln::cuda::{LaunchConfig, TensorMapSpec, TmaDtype};
use kiln_gpu::kernels::tma_stream::{
    STREAM_REPORT_WORDS, STREAM_SMEM_BYTES, STREAM_THREADS, StreamConfig, TmaStream, WAIT_BOUNDED, WAIT_SPIN, report,
};
use kiln_gpu::swizzle::Swizzle;

#[path = "timing.rs"]
mod timing;

/// One streaming experiment.
#[derive(Clone, Copy)]
struct Variant {
    name: &'static str,
    what: &'static str,
    dtype: TmaDtype,
    box_cols: u32,
    box_rows: u32,
    boxes: u32,
    swizzle: Swizzle,
    ring: u32,
    maps: u32,
    wait: u32,
    work_cycles: u32,
    fence_every: u32,
    prefetch: bool,
    /// Blocks in the grid (0: one per SM).
    blocks: u32,
    /// Rows of the tensor (its rows are 4 KiB).
    rows: u32,
}

/// The megakernel's loads: f32 boxes of 32 x 64 (8 KiB), A and B from two maps, 12 stages.
const MEGAKERNEL: Variant = Variant {
    name: "megakernel",
    what: "f32 32x64 boxes, 2 per stage from 2 maps, 128B swizzle, ring 12, bounded wait",
    dtype: TmaDtype::F32,
    box_cols: 32,
    box_rows: 64,
    boxes: 2,
    swizzle: Swizzle::B128,
    ring: 12,
    maps: 2,
    wait: WAIT_BOUNDED,
    work_cycles: 0,
    fence_every: 0,
    prefetch: false,
    blocks: 0,
    rows: 2048,
};

const fn v(name: &'static str, what: &'static str, base: Variant) -> Variant {
    Variant { name, what, ..base }
}

fn variants() -> Vec<Variant> {
    let m = MEGAKERNEL;
    vec![
        m,
        Variant { wait: WAIT_SPIN, ..v("spin", "bare try_wait loop", m) },
        Variant { dtype: TmaDtype::Bf16, box_cols: 64, ..v("bf16", "bf16 64x64 boxes (the GEMM kernels')", m) },
        Variant { prefetch: true, ..v("prefetch", "prefetch.tensormap first", m) },
        Variant { box_rows: 32, boxes: 4, ..v("m-major", "four 32x32 boxes per stage (M-major pages)", m) },
        Variant { swizzle: Swizzle::None, ..v("no-swizzle", "no swizzle", m) },
        Variant { ring: 2, ..v("ring2", "ring of 2", m) },
        Variant { ring: 4, ..v("ring4", "ring of 4", m) },
        Variant { ring: 8, ..v("ring8", "ring of 8", m) },
        Variant { fence_every: 1, ..v("fence", "fence.proxy.async.global before every stage", m) },
        Variant { fence_every: 32, ..v("fence32", "fence.proxy.async.global every 32 stages", m) },
        Variant { maps: 24, ..v("maps24", "boxes rotate over 24 maps", m) },
        Variant { work_cycles: 1000, ..v("work1000", "consumers spin 1000 cycles per stage", m) },
        Variant { work_cycles: 2000, ..v("work2000", "consumers spin 2000 cycles per stage", m) },
        Variant { blocks: 64, ..v("blocks64", "64 blocks", m) },
        Variant { rows: 32768, ..v("dram", "128 MiB tensor (beyond L2)", m) },
    ]
}

/// Stages each block streams.
const STAGES_PER_BLOCK: u32 = 1024;

fn main() {
    let Some(dev) = timing::gpu_or_skip("tma_stream bench") else { return };
    if let Err(e) = dev.require::<TmaStream>() {
        println!("tma_stream bench: {e}; nothing measured");
        return;
    }
    let sms = dev.sm_count().expect("SM count") as u32;
    println!(
        "device: {}; {STAGES_PER_BLOCK} stages of 16 KiB per block; GB/s = grid bytes over the span of all blocks",
        dev.name()
    );
    println!(
        "| variant | what | GB/s | GB/s per block | us per stage | issue to ready (us) | consumer wait | loader wait |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    let max_rows = variants().iter().map(|v| v.rows).max().unwrap_or(0);
    let tensor = dev.zeros::<u32>(1024 * max_rows as usize).expect("tensor");
    let flag = dev.zeros::<u32>(1).expect("flag");
    let mut json = vec![];
    for var in variants().into_iter().filter(|v| timing::wanted("KILN_BENCH_VARIANTS", v.name)) {
        let elem = var.dtype.size();
        let cols = 4096 / elem;
        let blocks = if var.blocks == 0 { sms } else { var.blocks };
        // `maps` maps over disjoint row bands of the tensor (A and B of a page are different tensors).
        let band = var.rows / var.maps;
        let specs: Vec<(u64, TensorMapSpec)> = (0..var.maps)
            .map(|i| {
                let spec = TensorMapSpec {
                    dtype: var.dtype,
                    rows: band as u64,
                    cols: cols as u64,
                    row_pitch: cols as u64,
                    box_rows: var.box_rows,
                    box_cols: var.box_cols,
                    swizzle: var.swizzle,
                };
                (tensor.addr() + i as u64 * band as u64 * 4096, spec)
            })
            .collect();
        let maps = dev.tensor_maps(&specs).expect("tensor maps");
        let cfg = StreamConfig {
            stages_per_block: STAGES_PER_BLOCK,
            ring: var.ring,
            boxes: var.boxes,
            box_bytes: var.box_cols * var.box_rows * elem,
            box_cols: var.box_cols,
            box_rows: var.box_rows,
            cols,
            rows: band,
            maps: var.maps,
            wait: var.wait,
            work_cycles: var.work_cycles,
            fence_every: var.fence_every,
            prefetch: var.prefetch as u32,
        };
        let mut out = dev.zeros::<u64>((blocks * STREAM_REPORT_WORDS) as usize).expect("report");
        let launch = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (STREAM_THREADS, 1, 1),
            shared_mem_bytes: STREAM_SMEM_BYTES,
        };
        // warm-up, then the best of five runs (by span)
        let mut best: Option<Stats> = None;
        for run in 0..6 {
            dev.zero(&mut out).expect("clear report");
            // SAFETY: the maps describe `tensor` (in bounds: every box lies inside its band); `out`
            // holds a report per block.
            unsafe { dev.launch(TmaStream, launch, (maps.ptr(), flag.ptr(), cfg, out.ptr_mut())) }.expect("launch");
            let words = dev.download(&out).expect("report");
            if run == 0 {
                continue;
            }
            let s = Stats::new(&words, blocks, cfg.boxes * cfg.box_bytes);
            if best.as_ref().is_none_or(|b| s.span_ns < b.span_ns) {
                best = Some(s);
            }
        }
        let s = best.expect("five runs");
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.3} | {:.2} | {:.0} % | {:.0} % |",
            var.name,
            var.what,
            s.gbps,
            s.gbps_per_block,
            s.us_per_stage,
            s.issue_to_ready_us,
            100.0 * s.consumer_wait,
            100.0 * s.loader_wait
        );
        json.push(format!(
            "{{\"variant\":\"{}\",\"what\":\"{}\",\"blocks\":{blocks},\"gbps\":{:.1},\"gbps_per_block\":{:.2},\"us_per_stage\":{:.4},\"issue_to_ready_us\":{:.3},\"consumer_wait\":{:.3},\"loader_wait\":{:.3}}}",
            var.name, var.what, s.gbps, s.gbps_per_block, s.us_per_stage, s.issue_to_ready_us, s.consumer_wait, s.loader_wait
        ));
    }
    let path = std::env::var("KILN_BENCH_OUT").unwrap_or_else(|_| "tma_stream.json".into());
    let body = format!(
        "{{\"device\":\"{}\",\"stages_per_block\":{STAGES_PER_BLOCK},\"variants\":[{}]}}\n",
        dev.name(),
        json.join(",")
    );
    std::fs::write(&path, body).expect("writing the results");
    println!("wrote {path}");
}

/// One run's figures, from the blocks' reports.
struct Stats {
    span_ns: f64,
    gbps: f64,
    gbps_per_block: f64,
    us_per_stage: f64,
    issue_to_ready_us: f64,
    consumer_wait: f64,
    loader_wait: f64,
}

impl Stats {
    fn new(words: &[u64], blocks: u32, stage_bytes: u32) -> Stats {
        let r = |b: u32, w: usize| words[(b * STREAM_REPORT_WORDS) as usize + w];
        let start = (0..blocks).map(|b| r(b, report::START_NS)).min().unwrap_or(0);
        let end = (0..blocks).map(|b| r(b, report::END_NS)).max().unwrap_or(0);
        let span_ns = end.saturating_sub(start) as f64;
        let (mut stages, mut block_ns, mut clk, mut lat, mut cw, mut lw) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        for b in 0..blocks {
            stages += r(b, report::STAGES) as f64;
            block_ns += r(b, report::END_NS).saturating_sub(r(b, report::START_NS)) as f64;
            clk += r(b, report::END_CLK).saturating_sub(r(b, report::START_CLK)) as f64;
            lat += r(b, report::ISSUE_TO_READY) as f64;
            cw += r(b, report::CONSUMER_WAIT) as f64;
            lw += r(b, report::LOADER_WAIT) as f64;
        }
        let ghz = clk / block_ns;
        Stats {
            span_ns,
            gbps: stages * stage_bytes as f64 / span_ns,
            gbps_per_block: stages * stage_bytes as f64 / block_ns,
            us_per_stage: block_ns / stages / 1e3,
            issue_to_ready_us: lat / ghz / stages / 1e3,
            consumer_wait: cw / clk,
            loader_wait: lw / clk,
        }
    }
}
