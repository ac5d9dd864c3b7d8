// Included in `mod dev` (see `mod.rs`). The loader warp (lane 0): for every product of the
// block's list, in order, it acquires the instruction's counters and fills the page ring with TMA,
// up to the whole ring ahead; it also stages a loss tile's logits in the ring and a staged
// update's old weights in the weight buffer.

/// Issues the TMA loads of one operand's page for K block `kt` of `page_k` columns (rows, M or
/// N, from `m0`): K-major, one box of `tile` rows by `page_k` columns; MN-major (`mn`), `tile /
/// MN_BOX` boxes of `page_k` rows (K) by [`MN_BOX`] columns, one after another (see
/// [`mn_page_descriptor`](super::mn_page_descriptor)).
#[inline(always)]
unsafe fn load_page(
    dst: u32,
    maps: crate::DevicePtr<tma::TensorMap>,
    (m, mn): (u32, bool),
    (m0, tile): (u32, u32),
    kt: u32,
    page_k: u32,
    bar: u32,
) {
    let map = unsafe { maps.as_ptr().add(m as usize) };
    if !mn {
        unsafe { tma::load_2d(dst, map, (kt * page_k) as i32, m0 as i32, bar) };
        return;
    }
    let mut j = 0;
    while j < tile / MN_BOX {
        let at = dst + j * page_k * 2 * MN_BOX;
        unsafe { tma::load_2d(at, map, (m0 + j * MN_BOX) as i32, (kt * page_k) as i32, bar) };
        j += 1;
    }
}

/// The loader takes ring use `v` (instruction `idx`) for `bytes` of copies: from the second lap
/// on, waits until the consumers have freed the slot's previous use, then announces the bytes
/// on its ready barrier. False (after recording the stall) when the wait gave up.
#[inline(always)]
unsafe fn claim_slot(b: &MegaBuffers, cfg: &MegaConfig, sm: Smem, v: u32, idx: u32, bytes: u32) -> bool {
    let slot = page_slot(v);
    if v >= PAGE_STAGES && !unsafe { bounded_wait(b, cfg, sm.free(slot), free_parity(v)) } {
        unsafe { record_stall(b, cfg, LOADER, idx, PAGE_TAG | PAGE_FREE << 16 | slot, free_parity(v), v) };
        return false;
    }
    unsafe { mbarrier::arrive_expect_tx(sm.ready(slot), bytes) };
    true
}

/// The loader (one thread): fills pages for every product of `lo..hi`, in order. Returns early
/// after recording a stall; then it waits (briefly) for the loads it issued, so that no copy lands
/// in the shared memory of a block that has exited.
#[inline(always)]
unsafe fn load_pages<const TM: usize, const P: u32>(
    b: &MegaBuffers,
    cfg: &MegaConfig,
    sm: Smem,
    lt: Layers,
    lo: u32,
    hi: u32,
) {
    // the kernel's tile (the consumers trap where `cfg.tile` differs), a constant
    let tile = 32 * TM as u32;
    // ring uses, and staged updates whose old weights were loaded
    let (mut u, mut updates) = (0u32, 0u32);
    let mut idx = lo;
    let mut next = unsafe { prefetch(b, lo, hi) };
    'instructions: while idx < hi {
        let ins = next;
        next = unsafe { prefetch(b, idx + 1, hi) };
        let product = product::<TM, P>(cfg, lt, &ins);
        let boxes = box_slot_uses(ins.opcode, P, tile);
        if product.is_some() || boxes > 0 {
            unsafe { stamp(b, idx, trace::LOADER_START) };
            // (the fused update's second wait, its write-after-read guard, is met here too:
            // the consumers write W only after pages this loader issued after it)
            if !unsafe {
                wait(b, cfg, ins.wait, ins.wait_value, idx, LOADER)
                    && wait(b, cfg, ins.wait2, ins.wait2_value, idx, LOADER)
            } {
                break 'instructions;
            }
            unsafe { stamp(b, idx, trace::LOADER_DEPS) };
            // The producers' generic stores were acquired above; TMA (the async proxy) reads them next.
            fence::proxy_async_global();
            let (c0, mut free_wait) = (thread::clock64(), 0u64);
            // ring uses a K block takes: its pages' slots are those of uses u .. u + per
            let per = slot_uses_per_block(tile);
            let (mut kt, pages) = (0, product.map_or(0, |p| p.pages));
            // a staged update's old weights, loaded halfway through its pages: late enough
            // that the storer has long stored the last update's out of the buffer (the
            // consumers staged it before their first page of this one), early enough to land
            // before the last page
            let weights = ins.opcode == opcode::LINEAR_BWD_WEIGHT_SGD && stores_through_tma(P, tile);
            while let Some(p) = product
                && kt < pages
            {
                if weights && kt == pages / 2 {
                    if !unsafe { load_weights(b, cfg, sm, &ins, updates, idx) } {
                        break 'instructions;
                    }
                    updates += 1;
                }
                let w0 = thread::clock64();
                let mut v = u;
                while v < u + per {
                    if !unsafe { claim_slot(b, cfg, sm, v, idx, stage_tx_bytes(tile)) } {
                        break 'instructions;
                    }
                    v += 1;
                }
                free_wait += thread::clock64() - w0;
                // (the B page's barrier is the last use's: the A page's when both share a slot)
                let (a_bar, b_bar) = (sm.ready(page_slot(u)), sm.ready(page_slot(u + per - 1)));
                unsafe {
                    load_page(sm.a_page_at(u), b.maps, (p.a_map, p.a_mn), (p.m0, tile), kt, p.page_k, a_bar);
                    load_page(sm.b_page_at(u, per), b.maps, (p.b_map, p.b_mn), (p.n0, tile), kt, p.page_k, b_bar);
                }
                u += per;
                kt += 1;
            }
            // f32 boxes (see `box_slot_uses`), a box a slot: a loss tile's logits
            let at = map::PER_LAYER * (cfg.layers - 1) + map::LOGITS;
            let (m0, n0) = (ins.tile_row * tile, ins.tile_col * tile);
            let mut j = 0;
            while j < boxes {
                if !unsafe { claim_slot(b, cfg, sm, u, idx, stage_tx_bytes(tile)) } {
                    break 'instructions;
                }
                let (slot, map) = (page_slot(u), unsafe { b.maps.as_ptr().add(at as usize) });
                let col = (n0 + j * F32_BOX_COLS) as i32;
                unsafe { tma::load_2d(sm.a_page(slot), map, col, m0 as i32, sm.ready(slot)) };
                u += 1;
                j += 1;
            }
            unsafe {
                stamp(b, idx, trace::LOADER_ISSUED);
                record(b, idx, trace::FREE_WAIT_CLK, free_wait);
                record(b, idx, trace::ISSUE_CLK, thread::clock64() - c0);
            }
        }
        idx += 1;
    }
    if idx < hi {
        // Gave up: let the copies in flight (the last use of each slot, the last weights) land
        // before exiting.
        let mut back = 1;
        while back <= PAGE_STAGES && back <= u {
            let v = u - back;
            let _ = unsafe { mbarrier::wait_parity_bounded(sm.ready(page_slot(v)), ready_parity(v), 10_000_000) };
            back += 1;
        }
        if updates > 0 {
            let last = page_parity(updates - 1);
            let _ = unsafe { mbarrier::wait_parity_bounded(sm.weights_ready(), last, 10_000_000) };
        }
    }
}

/// The loader loads the old weights of the `n`-th staged fused update of the block (instruction
/// `idx`, `ins`) into the weight buffer: once the storer has released the buffer from the
/// update before (its phase `n - 1` of *weights free*), announces the bytes on *weights
/// ready* and issues the tile's [`map::WEIGHTS`] boxes. The weights are this tile's alone
/// during the step (no other instruction writes them), so no counter guards them. False
/// (after recording the stall) when the wait gave up.
#[inline(always)]
unsafe fn load_weights(b: &MegaBuffers, cfg: &MegaConfig, sm: Smem, ins: &Instruction, n: u32, idx: u32) -> bool {
    if n > 0 && !unsafe { bounded_wait(b, cfg, sm.weights_free(), page_parity(n - 1)) } {
        let what = PAGE_TAG | WEIGHTS_FREE << 16;
        unsafe { record_stall(b, cfg, LOADER, idx, what, page_parity(n - 1), n - 1) };
        return false;
    }
    let tile = BIGGEST_TILE;
    let map = unsafe { b.maps.as_ptr().add((map::PER_LAYER * ins.layer + map::WEIGHTS) as usize) };
    let (m0, n0) = (ins.tile_row * tile, ins.tile_col * tile);
    unsafe { mbarrier::arrive_expect_tx(sm.weights_ready(), weight_buffer_bytes(tile)) };
    let mut j = 0;
    while j < tile / F32_BOX_COLS {
        let col = (n0 + j * F32_BOX_COLS) as i32;
        unsafe { tma::load_2d(sm.weights + j * F32_BOX_BYTES, map, col, m0 as i32, sm.weights_ready()) };
        j += 1;
    }
    true
}
