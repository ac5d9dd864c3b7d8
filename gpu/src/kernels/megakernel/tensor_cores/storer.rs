// Included in `mod dev` (see `mod.rs`). The storer warp (lane 0; kernels that
// [`stores_through_tma`]): writes the staged tiles with TMA, releases the staging and weight
// buffers, and signals the instructions' counters.

/// The storer (one thread; kernels that [`stores_through_tma`]): for each staged instruction
/// of `lo..hi` ([`staged`]), in order:
/// - on an input gradient, puts its ReLU mask (`act[l]` at the output tile, through layer
///   `l`'s [`map::ACT`]) into the staging buffer with TMA, completing *mask ready*: the
///   buffer is free, since the storer itself is the one that frees it (its stores of the last
///   staged tile have read it) and the consumers write it only after *stage free* or the
///   mask. First it acquires the instruction's dependency counter, as the loader does for the
///   pages (the forward that wrote `act[l]` precedes the gradients it waits for);
/// - waits for the consumers to stage the tile ([`stage_tile`]);
/// - stores its two boxes with TMA (`act[l + 1]` through layer `l + 1`'s [`map::ACT`], or
///   `grad[l]` through layer `l - 1`'s [`map::GRAD`]: the maps the products read them with;
///   a fused update's rounded weights through [`map::W_NEXT`], and its f32 weights from the
///   weight buffer through [`map::WEIGHTS`]), frees the buffer (*stage free*, and *weights
///   free*) as soon as the stores have read it, and once they are written fences them for the
///   other proxies and signals the instruction's counters (what the consumers do themselves
///   for other instructions; a fused update has none: the next step reads its weights).
///
/// (The storer loads the masks, not the loader: a loader running two staged tiles ahead of the
/// stores, as small K allows, would wait for *stage free* on a parity two phases ahead of the
/// barrier and pass at once. The storer never runs ahead of its own frees.) Gives up (recording the stall as the storer's) when a wait
/// passes the step's limit or another block aborts; a mask it loaded lands before it returns.
#[inline(always)]
unsafe fn store_tiles(b: &MegaBuffers, cfg: &MegaConfig, sm: Smem, lo: u32, hi: u32) {
    let (mut stages, mut masks) = (0u32, 0u32);
    let mut idx = lo;
    let mut next = unsafe { prefetch(b, lo, hi) };
    while idx < hi {
        let ins = next;
        next = unsafe { prefetch(b, idx + 1, hi) };
        if staged(ins.opcode, ins.layer, cfg.layers) {
            let l = ins.layer;
            let (m0, n0) = (ins.tile_row * BIGGEST_TILE, ins.tile_col * BIGGEST_TILE);
            if ins.opcode == opcode::LINEAR_BWD_INPUT {
                if !unsafe { wait(b, cfg, ins.wait, ins.wait_value, idx, STORER) } {
                    return;
                }
                // the producers' generic stores were acquired above; TMA reads them next
                fence::proxy_async_global();
                let act = unsafe { b.maps.as_ptr().add((map::PER_LAYER * l + map::ACT) as usize) };
                unsafe { mbarrier::arrive_expect_tx(sm.mask_ready(), 2 * STAGE_BOX_BYTES) };
                let mut j = 0;
                while j < 2 {
                    let dst = sm.staging() + j * STAGE_BOX_BYTES;
                    unsafe { tma::load_2d(dst, act, (n0 + j * MN_BOX) as i32, m0 as i32, sm.mask_ready()) };
                    j += 1;
                }
                masks += 1;
            }
            let parity = page_parity(stages);
            if !unsafe { bounded_wait(b, cfg, sm.staged(), parity) } {
                unsafe { record_stall(b, cfg, STORER, idx, PAGE_TAG | STAGED << 16, parity, stages) };
                if masks > 0 {
                    // let the last mask land before the block may exit
                    let last = page_parity(masks - 1);
                    let _ = unsafe { mbarrier::wait_parity_bounded(sm.mask_ready(), last, 10_000_000) };
                }
                return;
            }
            let update = ins.opcode == opcode::LINEAR_BWD_WEIGHT_SGD;
            let at = match ins.opcode {
                opcode::LINEAR_FWD => map::PER_LAYER * (l + 1) + map::ACT,
                opcode::LINEAR_BWD_INPUT => map::PER_LAYER * (l - 1) + map::GRAD,
                _ => map::PER_LAYER * l + map::W_NEXT,
            };
            let out = unsafe { b.maps.as_ptr().add(at as usize) };
            let mut j = 0;
            while j < 2 {
                let src = sm.staging() + j * STAGE_BOX_BYTES;
                unsafe { tma::store_2d(out, (n0 + j * MN_BOX) as i32, m0 as i32, src) };
                j += 1;
            }
            if update {
                // the new f32 weights, from the weight buffer
                let out = unsafe { b.maps.as_ptr().add((map::PER_LAYER * l + map::WEIGHTS) as usize) };
                let mut j = 0;
                while j < BIGGEST_TILE / F32_BOX_COLS {
                    let src = sm.weights + j * F32_BOX_BYTES;
                    unsafe { tma::store_2d(out, (n0 + j * F32_BOX_COLS) as i32, m0 as i32, src) };
                    j += 1;
                }
            }
            tma::commit_group();
            tma::wait_group_read::<0>();
            unsafe { mbarrier::arrive(sm.stage_free()) };
            if update {
                unsafe { mbarrier::arrive(sm.weights_free()) };
            }
            tma::wait_group::<0>();
            // the async proxy wrote the tile; the next readers acquire it through the counters
            fence::proxy_async_global();
            unsafe {
                signal(b, &ins);
                stamp(b, idx, trace::SIGNALED);
            }
            stages += 1;
        }
        idx += 1;
    }
}
