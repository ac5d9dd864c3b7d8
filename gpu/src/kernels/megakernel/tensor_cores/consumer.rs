// Included in `mod dev` (see `mod.rs`). The consumers' instruction loop ([`consume`]): every
// instruction of the block's list in order, a product (with its epilogue, or its hand-off to the
// storer), a loss tile or an update, then published.

/// The consumers: every instruction of `lo..hi` in order (see the module docs). Each warp
/// accumulates `MT x NT` `m16n8` tiles (on [`layout::ROWS`], where a warp's 64 accumulators
/// are two [`Half`]s, `MT x NT` is the shape of one); `TM` is the tile edge over 32 (the loss
/// tile's, as a constant); `P`: the [`precision`] code; `L`: the [`layout`], whose products
/// run on [`tile_mma`], [`tile_wgmma`] or [`tile_wgmma_rows`].
///
/// Per instruction (the comments in the loop number the phases):
/// 1. read the next instruction ahead, and find this one's product ([`product`]);
/// 2. a product on [`layout::ROWS`]: multiply ([`tile_wgmma_rows`]), then either hand a staged
///    tile to the storer (which publishes it: no phase 5) or run its two column halves'
///    epilogues ([`rows_epilogue`]);
/// 3. a product on [`layout::SQUARES`] or [`layout::WIDE`]: prefetch the epilogue's inputs
///    ([`Prefetched`]), multiply the group's pages ([`tile_mma`], [`tile_wgmma`]), exchange the
///    halves through shared memory, and run the [`epilogue`] on this group's half;
/// 4. an element-wise instruction: wait (for the counters, or for the loader's boxes), then the
///    loss tile ([`loss_rows`] or [`LossTile`]) or the SGD update;
/// 5. publish: fence, meet at the rendezvous, signal the counters.
///
/// A wait that gives up abandons the step (`abandon!`; see `abandoned` below). (The phases stay
/// in one function: cutting them into `#[inline(always)]` functions, even only the publishing,
/// changes the six kernels' PTX.)
#[inline(always)]
unsafe fn consume<const MT: usize, const NT: usize, const TM: usize, const P: u32, const L: u32>(
    b: &MegaBuffers,
    cfg: &MegaConfig,
    sm: Smem,
    lt: Layers,
    lo: u32,
    hi: u32,
) {
    if cfg.tile != 32 * TM as u32 || cfg.precision != P {
        // an instantiation for another tile or data path (the host picked the wrong kernel;
        // the loader's page extents follow `cfg.precision`): fail the launch
        thread::trap();
    }
    let t = thread::thread_idx_x();
    let go = shared::dynamic_smem::<u32>(GO as usize);
    let stats = shared::dynamic_smem::<f32>(STATS as usize);
    let (mut u, mut phase, mut products) = (0u32, 0u32, 0u32);
    // tiles staged for the storer, ReLU masks taken from the staging buffer and staged
    // updates (`stores_through_tma`): the storer counts the same, the loader the updates
    let (mut stages, mut masks, mut updates) = (0u32, 0u32, 0u32);
    let group = thread::warp_id() / GROUP_WARPS;
    let mut acc = [[[0.0f32; 4]; NT]; MT];
    let mut idx = lo;
    let mut next = unsafe { prefetch(b, lo, hi) };
    // Set once this warp has given the step up. It then walks the rest of its list without
    // waiting, storing or meeting, but still runs every product's page walk, which only
    // drains (see `group_pages`): on the wgmma path its group's other warps, which may have
    // passed the meeting it gave up at, issue the same warpgroup products as it, however far
    // they get.
    let mut abandoned = false;
    // the give-up test's planted fault at the publishing meetings (`give_up::PUBLISH`)
    let planted =
        thread::warp_id() + 1 == cfg.give_up_warp && cfg.give_up_at == give_up::PUBLISH && thread::block_idx_x() == 0;
    macro_rules! abandon {
        () => {{
            abandoned = true;
            idx += 1;
            continue;
        }};
    }
    while idx < hi {
        // 1. The instruction, the next one read ahead, and its product.
        let ins = next;
        next = unsafe { prefetch(b, idx + 1, hi) };
        if t == 0 {
            unsafe { stamp(b, idx, trace::START) };
        }
        let product = product::<TM, P>(cfg, lt, &ins);
        let is_product = product.is_some();
        if abandoned && !is_product {
            // (its boxes' ring uses counted, as a drained walk counts a product's pages)
            u += box_slot_uses(ins.opcode, P, 32 * TM as u32);
            idx += 1;
            continue;
        }
        if let Some(p) = product
            && L == layout::ROWS
        {
            // 2. A product on `layout::ROWS`.
            // The warp's 64 accumulators (`acc` is `[2][8]` `m16n8` tiles, 64 f32) hold its
            // 16 rows, all 128 columns: no sums to exchange. Its two column halves are two
            // [`Half`]s, each with its own prefetch (see [`Prefetched`]) and epilogue.
            if MT != 2 || NT != 8 || TM != 4 {
                // only the tile-128 kernel takes this layout
                thread::trap();
            }
            // SAFETY (of the cast): [[[f32; 4]; 8]; 2] and [f32; 64] have the same layout.
            let d = unsafe { &mut *(&mut acc as *mut [[[f32; 4]; NT]; MT] as *mut [f32; 64]) };
            let pages = Pages { b, cfg, sm, p: &p, u: &mut u, idx, abandoned };
            if !unsafe { tile_wgmma_rows(pages, d, &mut || {}) } {
                abandon!();
            }
            if t == 0 {
                unsafe { stamp(b, idx, trace::WORK_DONE) };
            }
            if stores_through_tma(P, 32 * TM as u32) && staged(ins.opcode, ins.layer, cfg.layers) {
                // Hand the tile to the storer: wait until the staging buffer is free (the
                // storer has read the last staged tile out of it) or, on an input gradient,
                // holds this tile's ReLU mask (which the storer loads only into a free
                // buffer); write the tile's bf16 outputs there; fence them for the async
                // proxy and arrive. The storer writes and publishes the tile; the consumers
                // go straight on to the next instruction (no phase 5).
                // (An input gradient's mask implies the buffer was freed, since the storer
                // loads it only then; its consumers still wait for *stage free* too, which
                // returns at once, so that every phase of that barrier is waited for before
                // the storer completes the next: compute-sanitizer's synccheck reports a
                // phase completed over one nobody waited for, "Missing wait".)
                // (A staged update also waits for its old weights, which the loader loaded
                // into the weight buffer: `load_weights`.)
                let bwd = ins.opcode == opcode::LINEAR_BWD_INPUT;
                let update = ins.opcode == opcode::LINEAR_BWD_WEIGHT_SGD;
                let (bar, n, kind) = if bwd {
                    (sm.mask_ready(), masks, MASK_READY)
                } else {
                    (sm.stage_free(), stages.wrapping_sub(1), STAGE_FREE)
                };
                let mut ok = (!bwd && stages == 0) || unsafe { bounded_wait(b, cfg, bar, page_parity(n)) };
                if ok && bwd && stages > 0 {
                    // (returns at once: see above)
                    let last = stages - 1;
                    ok = unsafe { bounded_wait(b, cfg, sm.stage_free(), page_parity(last)) };
                }
                let (mut kind, mut n) = (kind, n);
                if ok && update {
                    (kind, n) = (WEIGHTS_READY, updates);
                    ok = unsafe { bounded_wait(b, cfg, sm.weights_ready(), page_parity(updates)) };
                }
                if !warp::all(u32::MAX, ok) {
                    if thread::lane_id() == 0 {
                        unsafe { record_stall(b, cfg, CONSUMER, idx, PAGE_TAG | kind << 16, page_parity(n), n) };
                    }
                    abandon!();
                }
                unsafe {
                    if bwd {
                        stage_tile::<true>(sm.staging(), d);
                    } else if update {
                        stage_update(b, cfg, lt, &ins, sm, d);
                    } else {
                        stage_tile::<false>(sm.staging(), d);
                    }
                }
                fence::proxy_async_shared_cta();
                unsafe { mbarrier::arrive(sm.staged()) };
                masks += bwd as u32;
                updates += update as u32;
                stages += 1;
                if planted {
                    // the give-up test's warp: arrived (the others go on), then gives up
                    if thread::lane_id() == 0 {
                        let parity = page_parity(stages - 1);
                        unsafe { record_stall(b, cfg, CONSUMER, idx, PAGE_TAG | STAGED << 16, parity, stages - 1) };
                    }
                    abandon!();
                }
                if t == 0 {
                    unsafe { stamp(b, idx, trace::STORED) };
                }
                idx += 1;
                continue;
            }
            unsafe {
                rows_epilogue::<MT, NT, P, L, 0>(b, cfg, lt, &ins, d);
                rows_epilogue::<MT, NT, P, L, 1>(b, cfg, lt, &ins, d);
            }
        } else if let Some(p) = product {
            // 3. A product whose page groups split the pages (`layout::SQUARES`, `WIDE`).
            let h = HalfAt::new::<MT, NT, L>(cfg, &ins, 0);
            let mut pre = Prefetched::<MT, NT>::new();
            if ins.opcode == opcode::LINEAR_BWD_WEIGHT_SGD {
                unsafe { pre.load_weights(b, lt, &ins, h) };
            }
            let mut on_first = || {
                if ins.opcode == opcode::LINEAR_BWD_INPUT {
                    unsafe { pre.load_act::<P>(b, cfg, lt, &ins, h) };
                }
            };
            let f = &mut on_first;
            let pages = Pages { b, cfg, sm, p: &p, u: &mut u, idx, abandoned };
            let ok = unsafe {
                if L == layout::WIDE {
                    tile_wgmma::<MT, NT, P>(pages, &mut acc, f)
                } else {
                    tile_mma::<MT, NT, TM, P>(pages, &mut acc, f)
                }
            };
            if !ok {
                abandon!();
            }
            // Each group finishes its [`Half`] of the warp's square: it leaves the other
            // half's sums in its region of a shared-memory buffer, the groups meet, and each
            // adds the other's sums to its own half. The buffers alternate per product, so a
            // group may write the next product's while the other still reads these (it cannot
            // get two products ahead: the groups meet here every product).
            let sums = sm.sums(products);
            products += 1;
            let j = t % (32 * GROUP_WARPS);
            let at = |g: u32, n: usize| sums + 4 * ((g * 2 * (MT * NT) as u32 + n as u32) * 32 * GROUP_WARPS + j);
            let theirs = half::<MT, NT>(&acc, 1 - group);
            let mut mine = half::<MT, NT>(&acc, group);
            for (n, &v) in theirs.as_flattened().as_flattened().iter().enumerate() {
                unsafe { shared::st_shared_b32(at(group, n), v.to_bits()) };
            }
            if !unsafe { rendezvous(b, cfg, sm, &mut phase, idx) } {
                abandon!();
            }
            for (n, v) in mine.as_flattened_mut().as_flattened_mut().iter_mut().enumerate() {
                *v += f32::from_bits(unsafe { shared::ld_shared_b32(at(1 - group, n)) });
            }
            if p.pages <= group && ins.opcode == opcode::LINEAR_BWD_INPUT {
                // A group with no page of its own (k of one page) never ran `on_first`; the
                // rendezvous just met orders its loads after the other group's first page.
                unsafe { pre.load_act::<P>(b, cfg, lt, &ins, h) };
            }
            if t == 0 {
                unsafe { stamp(b, idx, trace::WORK_DONE) };
            }
            unsafe { epilogue::<MT, NT, P, L>(b, cfg, lt, &ins, h, &mine, &pre) };
        } else {
            // 4. An element-wise instruction: a loss tile or an SGD update.
            // f32 boxes the loader stages for this instruction (see `box_slot_uses`): the
            // loader acquired its dependencies before issuing them, so their arrival is the
            // consumers' wait
            let boxes = box_slot_uses(ins.opcode, P, 32 * TM as u32);
            if boxes == 0 {
                if t == 0 {
                    let ok = unsafe {
                        wait(b, cfg, ins.wait, ins.wait_value, idx, CONSUMER)
                            && wait(b, cfg, ins.wait2, ins.wait2_value, idx, CONSUMER)
                    };
                    if ok {
                        unsafe { stamp(b, idx, trace::FIRST) };
                    }
                    unsafe { *go = ok as u32 };
                }
                if !unsafe { rendezvous(b, cfg, sm, &mut phase, idx) } || unsafe { *go } == 0 {
                    abandon!();
                }
            }
            let done = match ins.opcode {
                opcode::LOSS_GRAD if boxes > 0 => unsafe {
                    // the logits' boxes; then each warp's rows (shuffles in `loss_rows` need
                    // every lane: rows and columns are warp-uniform there, so none has left)
                    let c0 = thread::clock64();
                    let mut ok = true;
                    let mut v = u;
                    while v < u + boxes {
                        ok &= bounded_wait(b, cfg, sm.ready(page_slot(v)), ready_parity(v));
                        v += 1;
                    }
                    let ok = warp::all(u32::MAX, ok);
                    let c1 = thread::clock64();
                    if ok {
                        if t == 0 {
                            stamp(b, idx, trace::FIRST);
                        }
                        let (m0, n0) = (ins.tile_row * BIGGEST_TILE, ins.tile_col * BIGGEST_TILE);
                        loss_rows::<P>(b, cfg, lt, &ins, F32Boxes { sm, u, m0, n0 });
                        free_pages(sm, u, boxes);
                    } else {
                        record_page_stall(b, cfg, idx, u);
                    }
                    u += boxes;
                    if t == 0 {
                        record(b, idx, trace::READY_WAIT_CLK, c1 - c0);
                        record(b, idx, trace::WORK_CLK, thread::clock64() - c0);
                    }
                    ok
                },
                opcode::LOSS_GRAD => unsafe {
                    let (c0, mut met) = (thread::clock64(), 0u64);
                    let mut done = true;
                    // every global load of the tile (its logits and targets, then the row
                    // partials) in flight together: one round trip to L2
                    let mut tile_loss = LossTile::<TM>::load(b, cfg, lt, &ins, 0);
                    if cfg.loss != loss::MSE {
                        loss_stats_from_partials::<TM>(b, cfg, lt, &ins, stats);
                        let m0 = thread::clock64();
                        done = rendezvous(b, cfg, sm, &mut phase, idx);
                        met = thread::clock64() - m0;
                    }
                    // the gradients, and their transposed copy through shared memory (the sums
                    // buffers: idle between products, and the meeting before this tile's
                    // signal keeps the next product's sums from overwriting them early), a
                    // quarter at a time, alternating buffers: quarter q + 2 overwrites
                    // quarter q's only after the meeting behind quarter q + 1's gradients,
                    // which every thread reaches after its share of quarter q's transpose.
                    // Where the step keeps no transposed copies (tile 128: the only tile of
                    // several quarters) nothing is staged, so the quarters need no meeting.
                    // (Loading the next quarter before this one's gradients, to hide its
                    // round trip, makes ptxas spill in the products' epilogues: 400 bytes
                    // against 160.)
                    let quarters = LossTile::<TM>::QUARTERS;
                    let transposes = !reads_in_place(P, LossTile::<TM>::TILE);
                    let mut q = 0;
                    while done && q < quarters {
                        let staged = sm.sums(q);
                        tile_loss.store_grads::<P>(b, cfg, lt, &ins, stats, staged);
                        if transposes {
                            done = rendezvous(b, cfg, sm, &mut phase, idx);
                            if done {
                                LossTile::<TM>::store_transposed::<P>(b, cfg, lt, &ins, staged, q);
                            }
                        }
                        q += 1;
                        if q < quarters {
                            tile_loss = LossTile::<TM>::load(b, cfg, lt, &ins, q);
                        }
                    }
                    if t == 0 {
                        record(b, idx, trace::READY_WAIT_CLK, met);
                        record(b, idx, trace::WORK_CLK, thread::clock64() - c0);
                    }
                    done
                },
                opcode::SGD_UPDATE => {
                    let copies = |o, k, w| unsafe { store_weight_copies::<1, P>(b, cfg, lt, ins.layer, o, k, [w]) };
                    unsafe { sgd_update(b, cfg, &ins, cfg.tile, CONSUMERS, t, copies) };
                    true
                }
                _ => true,
            };
            if !done {
                abandon!();
            }
            if t == 0 {
                unsafe { stamp(b, idx, trace::WORK_DONE) };
            }
        }
        // 5. Publishing.
        if t == 0 {
            unsafe { stamp(b, idx, trace::STORED) };
        }
        // A product nobody waits for (a fused update: its weights are read next by the next
        // launch) publishes nothing; the others fence for the async proxy (another block's TMA
        // may read these stores next), meet, and signal. Element-wise instructions always meet
        // (they share the "go" word and the statistics in shared memory).
        let signals = ins.signal != NO_COUNTER || ins.signal2 != NO_COUNTER;
        if signals || !is_product {
            fence::proxy_async_global();
            if !unsafe { rendezvous_or_plant(b, cfg, sm, &mut phase, idx, planted) } {
                abandon!();
            }
        }
        if t == 0 {
            if signals {
                unsafe { signal(b, &ins) };
            }
            unsafe { stamp(b, idx, trace::SIGNALED) };
        }
        idx += 1;
    }
}
