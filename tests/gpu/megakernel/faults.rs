//! The megakernel's failure paths: a wrong wait count, a page that is never freed and a warp that
//! gives up each stop the step with a typed stall report (never a hang) and leave the device
//! usable; a model too deep for shared memory is refused up front.

use super::{dev_arc, mk_weights};
use crate::common::{Outcome, err};
use crate::first_kernels::vector_add_matches_cpu;
use kiln::cuda::Device;

/// A schedule with one wait set one arrival too high: the step stops with a typed error naming the
/// block, instruction and counter, and the device keeps working. On every data path.
pub(crate) fn megakernel_stall(dev: &Device) -> Outcome {
    use kiln::megakernel::{DataPath, GpuStep, Loss, MlpShape, StepInputs, build};
    for path in [DataPath::CudaCores, DataPath::Tf32x3] {
        let shape = MlpShape { batch: 64, dims: vec![8, 8, 4] };
        let mut schedule = build(&shape, 3, path).map_err(err)?;
        let victim = schedule.per_sm[1]
            .iter_mut()
            .find(|i| i.wait != kiln::gpu::megakernel::NO_COUNTER)
            .ok_or("no waiting instruction")?;
        victim.wait_value += 1;
        let mut gpu = GpuStep::new(dev_arc()?, &schedule, &mk_weights(&shape.dims, 2), path).map_err(err)?;
        gpu.wait_limit_ns = 200_000_000;
        let (x, y) = (vec![0.5f32; 64 * 8], vec![0.0f32; 64 * 4]);
        let inp = StepInputs { x: &x, y: &y, classes: &[], loss: Loss::Mse, lr: 0.1, momentum: 0.0 };
        let started = std::time::Instant::now();
        match gpu.step(&inp) {
            Err(kiln::Error::Stalled { msg, .. }) if msg.contains("block 1 at") && msg.contains("counter") => {}
            other => return Err(format!("{path:?}: expected a stall in block 1, got {other:?}")),
        }
        if started.elapsed().as_secs_f64() > 10.0 {
            return Err(format!("{path:?}: the stall took {:?} to report", started.elapsed()));
        }
        // Checked only on demand: two stalled steps run without a wait, and the check reports them.
        gpu.check_every = 0;
        gpu.step(&inp).map_err(err)?;
        gpu.step(&inp).map_err(err)?;
        match gpu.check() {
            Err(kiln::Error::Stalled { msg, .. }) if msg.contains("block 1 at") => {}
            other => return Err(format!("{path:?}: expected a deferred stall report, got {other:?}")),
        }
        gpu.check().map_err(|e| format!("the flag is cleared once reported, got {e}"))?;
    }
    // the context is intact: an ordinary kernel still runs
    vector_add_matches_cpu(dev)
}

/// The page protocol's hang-proofing: every free barrier expects one arrival more than the
/// consumer warps make (`PAGE_FREE_ARRIVALS + 1`), so the loader's first reuse of a page never
/// completes. The step must stop with a report naming the page, its barrier and the parity, within
/// the wait limit; the device keeps working, and a correct step runs after it.
pub(crate) fn megakernel_page_fault_stalls(dev: &Device) -> Outcome {
    use kiln::megakernel::{DataPath, GpuStep, Loss, MlpShape, StepInputs, build};
    let shape = MlpShape { batch: 64, dims: vec![300, 64, 4] };
    let schedule = build(&shape, 4, DataPath::Tf32x3).map_err(err)?;
    let mut gpu = GpuStep::new(dev_arc()?, &schedule, &mk_weights(&shape.dims, 2), DataPath::Tf32x3).map_err(err)?;
    gpu.wait_limit_ns = 200_000_000;
    gpu.set_extra_free_arrivals(1);
    let (x, y) = (vec![0.5f32; 64 * 300], vec![0.0f32; 64 * 4]);
    let inp = StepInputs { x: &x, y: &y, classes: &[], loss: Loss::Mse, lr: 0.1, momentum: 0.0 };
    let started = std::time::Instant::now();
    match gpu.step(&inp) {
        Err(kiln::Error::Stalled { msg, .. })
            if msg.contains("loader of block") && msg.contains("free barrier of page 0 with parity 0") => {}
        other => return Err(format!("expected the loader to stall on page 0's free barrier, got {other:?}")),
    }
    if started.elapsed().as_secs_f64() > 10.0 {
        return Err(format!("the stall took {:?} to report", started.elapsed()));
    }
    gpu.set_extra_free_arrivals(0);
    gpu.step(&inp).map_err(|e| format!("a correct step after the stall: {e}"))?;
    vector_add_matches_cpu(dev)
}

/// The give-up paths: one consumer warp of block 0 gives up (`GpuStep::set_give_up`) while
/// the others go on. On the `wgmma` path (tf32, tile 64) each page group multiplies as one
/// warpgroup, so the warp that gave up must keep issuing its group's products, to the end of its
/// list, or the other three would wait for it in one. Planted at each walk's first page (the rest
/// of the group sees the page arrive), and at each publishing meeting after arriving (the others
/// pass it and multiply the next instruction's pages). Every path and tile must stop with the
/// planted stall as block 0's consumer record (its first instruction), within the wait limit;
/// then a correct step runs and the device keeps working. Four blocks, so that block 0 has a
/// list of several instructions.
pub(crate) fn megakernel_give_up_split(dev: &Device) -> Outcome {
    use kiln::gpu::megakernel::{CONSUMER_WARPS, GROUP_WARPS, groups_split_rows};
    use kiln::megakernel::{DataPath, GiveUp, GpuStep, Loss, MlpShape, StepInputs, Updates, build_with_tile};
    // 300 inputs: ten pages, both groups' on the first instruction
    let shape = MlpShape { batch: 128, dims: vec![300, 64, 64, 4] };
    let (x, y) = (vec![0.5f32; 128 * 300], vec![0.0f32; 128 * 4]);
    let inp = StepInputs { x: &x, y: &y, classes: &[], loss: Loss::Mse, lr: 0.1, momentum: 0.0 };
    for path in [DataPath::Tf32, DataPath::Tf32x3, DataPath::Bf16] {
        for &tile in path.tiles() {
            let schedule = build_with_tile(&shape, 4, tile, Updates::Fused, path.weight_reads()).map_err(err)?;
            let mut gpu = GpuStep::new(dev_arc()?, &schedule, &mk_weights(&shape.dims, 2), path).map_err(err)?;
            // Every stall here is planted: none waits for the limit (the others see the abort),
            // but under compute-sanitizer an honest wait can take far longer than usual.
            gpu.wait_limit_ns = 2_000_000_000;
            match gpu.set_give_up(Some((CONSUMER_WARPS, GiveUp::Pages))) {
                Err(kiln::Error::Unsupported { what, .. }) if what.contains("pick one of them") => {}
                other => return Err(format!("giving up in a warp that is not a consumer: {other:?}")),
            }
            for (warp, at) in [(1, GiveUp::Pages), (CONSUMER_WARPS - 2, GiveUp::Pages), (2, GiveUp::Publish)] {
                let what = format!("{path:?} tile {tile}, warp {warp} at {at:?}");
                // the group's first page use: page g when the groups split the pages, the first
                // K block's A page (use 0) when they split the rows (tile 128)
                let (rows, g) = (groups_split_rows(tile), warp / GROUP_WARPS);
                let first = if rows { 0 } else { g };
                let want = match at {
                    // the group's first page of the first product
                    GiveUp::Pages => format!("the ready barrier of page {first} with parity 0 (page use {first})"),
                    // the first product's publishing meeting: its second (after its sums); at tile
                    // 128, where the first product (a hidden forward) is handed to the storer
                    // instead, the hand-off of its staged tile
                    GiveUp::Publish if rows => "the staged-tile hand-off with parity 0 (staged tile 0)".to_string(),
                    GiveUp::Publish => "the consumers' rendezvous with parity 1 (meeting 1)".to_string(),
                };
                let want = format!("consumers of block 0 at instruction 0 waited on {want}");
                gpu.set_give_up(Some((warp, at))).map_err(err)?;
                let started = std::time::Instant::now();
                match gpu.step(&inp) {
                    Err(kiln::Error::Stalled { msg, .. }) if msg.contains(&want) => {}
                    other => return Err(format!("{what}: expected a stall with \"{want}\", got {other:?}")),
                }
                if started.elapsed().as_secs_f64() > 10.0 {
                    return Err(format!("{what}: the stall took {:?} to report", started.elapsed()));
                }
                gpu.set_give_up(None).map_err(err)?;
                gpu.step(&inp).map_err(|e| format!("{what}: a correct step after the stall: {e}"))?;
            }
        }
    }
    vector_add_matches_cpu(dev)
}

/// A model whose layer table would push the tensor-core kernel's shared memory past the device's
/// opt-in limit (20 bytes a layer after the page ring, and at bf16 tile 128 the weight buffer: a
/// few thousand layers, or 91) is refused by `GpuStep::new` with a typed error that says what to
/// change; the deepest model that fits runs. On tf32 (tile 32) and bf16 at tile 128.
pub(crate) fn megakernel_too_deep(dev: &Device) -> Outcome {
    use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as OPTIN;
    use kiln::gpu::kernels::megakernel_tc::tc_smem_bytes;
    use kiln::megakernel::{DataPath, GpuStep, Loss, MlpShape, StepInputs, Updates, build_with_tile};
    let max_smem = dev.attribute(OPTIN).map_err(err)?.max(0) as u32;
    for (path, tile) in [(DataPath::Tf32, 32), (DataPath::Bf16, 128)] {
        let bytes = |l: u32| tc_smem_bytes(l, path.code(), tile);
        let fits = (1..8192u32).take_while(|&l| bytes(l) <= max_smem).last().ok_or("no depth fits")?;
        for (layers, ok) in [(fits, true), (fits + 1, false)] {
            let shape = MlpShape { batch: 2, dims: vec![3; layers as usize + 1] };
            let schedule = build_with_tile(&shape, 4, tile, Updates::Fused, path.weight_reads()).map_err(err)?;
            match (GpuStep::new(dev_arc()?, &schedule, &mk_weights(&shape.dims, 3), path), ok) {
                (Ok(mut gpu), true) => {
                    let x = vec![0.5f32; 2 * 3];
                    let inp = StepInputs {
                        x: &x,
                        y: &[],
                        classes: &[0, 1],
                        loss: Loss::CrossEntropy,
                        lr: 0.1,
                        momentum: 0.0,
                    };
                    gpu.step(&inp).map_err(|e| format!("{path:?} {layers} layers (the deepest that fits): {e}"))?;
                }
                (Err(kiln::Error::Unsupported { what, .. }), false)
                    if what.contains(&format!("{layers} layers")) && what.contains("use fewer layers") => {}
                (other, _) => {
                    return Err(format!(
                        "{path:?} {layers} layers ({} bytes of shared memory, the device allows {max_smem}): got {:?}",
                        bytes(layers),
                        other.map(|_| "a step")
                    ));
                }
            }
        }
    }
    Ok(())
}
