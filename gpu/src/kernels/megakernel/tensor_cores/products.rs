// Included in `mod dev` (see `mod.rs`). The consumers' products: the instruction's product
// ([`Product`]), its pages walked in ring order ([`group_pages`], which also keeps a warp that
// gave up in step with its warpgroup), and multiplied on `mma.sync` from `ldmatrix` fragments
// ([`tile_mma`]) or on `wgmma` straight from the pages through descriptors ([`tile_wgmma`],
// [`tile_wgmma_rows`]).

/// `mma` k steps (of 8) per page.
const KSTEPS: usize = (PAGE_K / 8) as usize;
// the page loop takes k steps in pairs
const _: () = assert!(KSTEPS >= 2 && KSTEPS.is_multiple_of(2));

/// The product an instruction computes, `C[m][n] = sum_k A(m, k) B(n, k)` over `k < k`, each
/// operand one of the step's tensor maps ([`map`]), in `pages` K blocks of `page_k`
/// ([`page_k`]: 32 f32 or 64 bf16 columns). Every operand is K-major but where `a_mn` /
/// `b_mn` say it is read in place, MN-major ([`reads_in_place`]).
#[derive(Clone, Copy)]
struct Product {
    a_map: u32,
    b_map: u32,
    m0: u32,
    n0: u32,
    pages: u32,
    page_k: u32,
    a_mn: bool,
    b_mn: bool,
}

/// The product of a `LINEAR_*` instruction (see the table in [`crate::megakernel`]), or `None`.
#[inline(always)]
fn product<const TM: usize, const P: u32>(cfg: &MegaConfig, lt: Layers, i: &Instruction) -> Option<Product> {
    let l = i.layer;
    let at = |kind: u32| map::PER_LAYER * l + kind;
    let (m0, n0) = (i.tile_row * cfg.tile, i.tile_col * cfg.tile);
    let dim = |k: u32| lt.dim(k);
    // the operands read transposed, MN-major, where the step keeps no transposed copies
    // (from the kernel's tile and data path, constants: the consumers trap where `cfg` differs)
    let mn = reads_in_place(P, 32 * TM as u32);
    let ((a, a_mn), (b, b_mn), k) = match i.opcode {
        // act[l+1] = act[l] W[l]^T: k is the input feature
        opcode::LINEAR_FWD => ((map::ACT, false), (map::W, false), dim(l)),
        // grad[l] = grad[l+1] W[l]: k is the output feature, rows of W (columns of w_t)
        opcode::LINEAR_BWD_INPUT => ((map::GRAD, false), (map::W_T, mn), dim(l + 1)),
        // dW[l] = grad[l+1]^T act[l]: k is the batch row (the fused update's product too)
        opcode::LINEAR_BWD_WEIGHT | opcode::LINEAR_BWD_WEIGHT_SGD => ((map::GRAD_T, mn), (map::ACT_T, mn), cfg.batch),
        _ => return None,
    };
    let page_k = page_k(P);
    Some(Product { a_map: at(a), b_map: at(b), m0, n0, pages: k.div_ceil(page_k), page_k, a_mn, b_mn })
}

/// Which fragments a [`Frags`] loads: the four registers of an `m16n8k8` A tile (16 rows), or
/// the two registers of each of a pair of B tiles (16 columns).
#[derive(Clone, Copy, PartialEq, Eq)]
enum FragKind {
    A,
    BPair,
}

/// One lane's addressing of a warp's fragments in an operand page, computed once per product:
/// `G` groups of 16 rows (m for A, n for B) from row `base` of the (K-major) page, one
/// `ldmatrix.x4` per group. Its four 8 x 8 b16 matrices are four 8-row x 4-f32 blocks, and a
/// lane receives element `lane % 4` of row `lane / 4` of each: exactly the tf32 fragment (A:
/// rows +0/+8 x k +0/+4; B: k +0/+4 x columns +0/+8). Lane `l` points at row `l % 8 (+8)`,
/// 16-byte chunk `(l / 8)`; the 128-byte swizzle XORs the chunk with the row, and since the
/// page is 1024-byte aligned and `kk / 4` only sets chunk bits, the address for k step `kk` is
/// the lane's address XOR `(kk / 4) << 4`.
#[derive(Clone, Copy)]
struct Frags<const G: usize> {
    off: [u32; G],
}

impl<const G: usize> Frags<G> {
    #[inline(always)]
    fn new(base: u32, kind: FragKind) -> Self {
        let lane = thread::lane_id();
        let (q, r) = (lane / 8, lane % 8);
        // A: matrices (rows +0, k +0), (+8, +0), (+0, +4), (+8, +4);
        // B pair: (columns +0, k +0), (+0, +4), (+8, +0), (+8, +4)
        let (drow, dchunk) = if kind == FragKind::A { (8 * (q % 2), q / 2) } else { (8 * (q / 2), q % 2) };
        Frags { off: core::array::from_fn(|gi| (base + 16 * gi as u32 + r + drow) * 128 + ((dchunk ^ r) << 4)) }
    }

    /// The four fragment registers of group `gi` at k step `kk` of the page at `page`.
    #[inline(always)]
    unsafe fn load(&self, page: u32, gi: usize, kk: u32) -> [u32; 4] {
        unsafe { matrix::ldmatrix_x4(page + (self.off[gi] ^ ((kk / 4) << 4))) }
    }
}

/// An f32 as tf32 operands: on [`precision::TF32X3`], `(head, tail)` with `head = tf32(x)` and
/// `tail = tf32(x - head)`; on [`precision::TF32`], `x` is already a tf32 value (see
/// [`rounded_operand`]) and passes as it is.
#[inline(always)]
fn split<const P: u32>(x: f32) -> (u32, u32) {
    if P != precision::TF32X3 {
        return (x.to_bits(), 0);
    }
    let head = convert::f32_to_tf32(x);
    (head, convert::f32_to_tf32(x - f32::from_bits(head)))
}

/// One k step's raw fragments: A groups, then B groups (see [`Frags`]).
type Step<const MT: usize> = ([[u32; 4]; MT], [[u32; 4]; MT]);

/// Loads k step `ks` of the page pair at `pa`, `pb`.
#[inline(always)]
unsafe fn load_step<const MT: usize>(a_frag: &Frags<MT>, b_frag: &Frags<MT>, pa: u32, pb: u32, ks: usize) -> Step<MT> {
    let mut f: Step<MT> = ([[0u32; 4]; MT], [[0u32; 4]; MT]);
    for g in 0..MT {
        unsafe {
            f.0[g] = a_frag.load(pa, g, 8 * ks as u32);
            f.1[g] = b_frag.load(pb, g, 8 * ks as u32);
        }
    }
    f
}

/// Frees the slots of the K block at ring uses `u .. u + per` after this warp's last reads of
/// them: the warp's lanes meet, lane 0 arrives on each.
#[inline(always)]
unsafe fn free_pages(sm: Smem, u: u32, per: u32) {
    crate::sync::sync_warp(u32::MAX);
    if thread::lane_id() == 0 {
        let mut v = u;
        while v < u + per {
            unsafe { mbarrier::arrive(sm.free(page_slot(v))) };
            v += 1;
        }
    }
}

/// One k step's products: splits the fragments into tf32 heads and tails (3xTF32; on tf32
/// they are stored, already rounded operands) and accumulates the `MT x NT` `m16n8k8`
/// products into `acc`.
#[inline(always)]
fn mma_step<const MT: usize, const NT: usize, const P: u32>((ra, rb): Step<MT>, acc: &mut [[[f32; 4]; NT]; MT]) {
    let mut fa = [[(0u32, 0u32); 4]; MT];
    for (f, raw) in fa.iter_mut().zip(ra.iter()) {
        for e in 0..4 {
            f[e] = split::<P>(f32::from_bits(raw[e]));
        }
    }
    // B group g holds tiles 2g and 2g + 1 (registers b0, b1 of each)
    let mut fb = [[(0u32, 0u32); 2]; NT];
    for (j, f) in fb.iter_mut().enumerate() {
        for (e, v) in f.iter_mut().enumerate() {
            *v = split::<P>(f32::from_bits(rb[j / 2][2 * (j % 2) + e]));
        }
    }
    for (j, fb) in fb.iter().enumerate() {
        let bh = [fb[0].0, fb[1].0];
        for i in 0..MT {
            let ah = [fa[i][0].0, fa[i][1].0, fa[i][2].0, fa[i][3].0];
            let mut c = acc[i][j];
            if P == precision::TF32X3 {
                let at = [fa[i][0].1, fa[i][1].1, fa[i][2].1, fa[i][3].1];
                c = mma::mma_m16n8k8_tf32(at, bh, c);
                c = mma::mma_m16n8k8_tf32(ah, [fb[0].1, fb[1].1], c);
            }
            acc[i][j] = mma::mma_m16n8k8_tf32(ah, bh, c);
        }
    }
}

/// A product's pages as one consumer warp walks them: the step, the block's shared memory, the
/// product, its first page use `*u` (advanced past the product's pages), the instruction
/// index (for stall records and the trace), and whether the warp has abandoned the step.
struct Pages<'a> {
    b: &'a MegaBuffers,
    cfg: &'a MegaConfig,
    sm: Smem,
    p: &'a Product,
    u: &'a mut u32,
    idx: u32,
    /// This warp gave up an earlier instruction of the step: the walk only drains (see
    /// [`consume`]).
    abandoned: bool,
}

/// The part of a product's page loop that does not depend on how a page is multiplied: steps
/// through the product's K blocks from ring use `*u` on (each taking [`slot_uses_per_block`]
/// uses) and, for each K block this warp's group multiplies (every one when the groups split
/// rows, [`groups_split_rows`], else those of [`page_group`]), waits for its pages' bytes and
/// runs `multiply(u, free)` with the block's first use `u` (which frees the block's slots when
/// `free`: always, unless the walk only drains). `TM` is the tile over 32.
/// `on_first` runs once the group's first page has arrived (the producers' stores are then
/// visible, see [`Prefetched`]), and not at all in a group that has no page. Thread 0 stamps
/// the first page and records its cycles waiting for pages after the first and from the
/// first page on. False when the step was given up (a stall recorded).
///
/// Each warp waits for a page by itself, and may give up (its limit, or another block's
/// abort) while another warp sees the bytes arrive. Without `WARPGROUP` a warp that gave up
/// leaves the walk at once. With it (the group multiplies as one warpgroup, whose `wgmma` must
/// be executed by all four warps, the same instruction) it walks on, running `multiply` on
/// every remaining page of its group without waiting for the page and without freeing it
/// (the step is abandoned: what it multiplies no longer matters), so that the other three
/// never wait in a `wgmma` for it; it waits on [`Smem::drained`] instead, which returns at
/// once, so the walk's loop has one wait, one `multiply` and no branch around either. Either
/// way the stall is recorded after the walk ([`record_page_stall`]; not at all if the warp had
/// already abandoned the step before it, [`Pages::abandoned`]: then the walk only drains), and
/// the walk returns false. (Each of these was measured slower: the stall recorded in the loop,
/// where the warp gives up; a named barrier per page making the four agree first; a branch
/// skipping the wait once given up.)
///
/// `MegaConfig::give_up_warp` with [`give_up::PAGES`] plants the split for the give-up test:
/// that warp gives up the first page of every walk without waiting.
#[inline(always)]
unsafe fn group_pages<const TM: usize, const WARPGROUP: bool>(
    pages: Pages<'_>,
    on_first: &mut impl FnMut(),
    mut multiply: impl FnMut(u32, bool),
) -> bool {
    let Pages { b, cfg, sm, p, u, idx, abandoned } = pages;
    let tile = 32 * TM as u32;
    let (rows, per) = (groups_split_rows(tile), slot_uses_per_block(tile));
    let group = thread::warp_id() / GROUP_WARPS;
    // the K block this group multiplies first
    let first_kt = if rows { 0 } else { group };
    let (mut ready_wait, mut first) = (0u64, 0u64);
    let pages = p.pages;
    // the page use this warp gave up on, if it did (from the start when it abandoned the step;
    // the planted fault gives up the group's first page)
    const NONE: u32 = u32::MAX;
    let planted = thread::warp_id() + 1 == cfg.give_up_warp
        && cfg.give_up_at == give_up::PAGES
        && thread::block_idx_x() == 0
        && first_kt < pages;
    let mut gave_up = if abandoned || planted { *u + per * first_kt } else { NONE };
    if planted && !abandoned {
        // The planted fault's record, at once: it stands for a wait that gave up here, and
        // the other consumer warps, which it strands, may give up (and record) before this
        // walk ends (they do with a ring of 8 or 10 slots).
        unsafe { record_page_stall(b, cfg, idx, gave_up) };
    }
    let mut kt = 0;
    while kt < pages {
        if !rows && page_group(kt) != group {
            // the other group's page
            *u += per;
            kt += 1;
            continue;
        }
        let w0 = thread::clock64();
        // The block's slots last first: the loader issues them in order, so the last lands
        // last, and the others' waits then return at once. (In order, at tile 128, each block
        // would take a second wait that blocks for the B page after waking for the A page.)
        let mut n = per;
        while n > 0 {
            n -= 1;
            let v = *u + n;
            let (bar, parity) =
                if gave_up == NONE { (sm.ready(page_slot(v)), ready_parity(v)) } else { (sm.drained(), 1) };
            let ok = unsafe { bounded_wait(b, cfg, bar, parity) };
            if !warp::all(u32::MAX, ok) {
                // (only while waiting on pages: the drained barrier never fails)
                gave_up = v;
            }
        }
        let w1 = thread::clock64();
        if kt == first_kt {
            first = w1;
        } else {
            ready_wait += w1 - w0;
        }
        if !WARPGROUP && gave_up != NONE {
            break;
        }
        if kt == first_kt {
            on_first();
        }
        if kt == 0 && thread::thread_idx_x() == 0 {
            unsafe { stamp(b, idx, trace::FIRST) };
        }
        // A draining warp frees nothing: its arrivals would run ahead of the pages' phases (a
        // second arrival on a free barrier before the phase of its first has completed).
        multiply(*u, gave_up == NONE);
        *u += per;
        kt += 1;
    }
    if gave_up != NONE {
        if !abandoned && !planted {
            unsafe { record_page_stall(b, cfg, idx, gave_up) };
        }
        return false;
    }
    if thread::thread_idx_x() == 0 {
        unsafe {
            record(b, idx, trace::READY_WAIT_CLK, ready_wait);
            record(b, idx, trace::WORK_CLK, thread::clock64() - first);
        }
    }
    true
}

/// This warp's share of one product on `mma.sync`: `MT x NT` `m16n8` accumulators, `16 MT`
/// rows by `8 NT` columns (`tile = 32 MT`, `NT = 2 MT`; warp `q = w % 4` of its group starts
/// at row `(q / 2) 16 MT`, column `(q % 2) 8 NT` of the tile), summed over its group's pages
/// ([`group_pages`]). False when the step was given up.
#[inline(always)]
unsafe fn tile_mma<const MT: usize, const NT: usize, const TM: usize, const P: u32>(
    pages: Pages<'_>,
    acc: &mut [[[f32; 4]; NT]; MT],
    on_first: &mut impl FnMut(),
) -> bool {
    let sm = pages.sm;
    if P == precision::BF16 {
        // bf16 pages multiply on `tile_wgmma` only (this instantiation is compiled away)
        thread::trap();
    }
    let w = thread::warp_id() % GROUP_WARPS;
    let (rm, rn) = ((w / 2) * 16 * MT as u32, (w % 2) * 8 * NT as u32);
    let a_frag = Frags::<MT>::new(rm, FragKind::A);
    let b_frag = Frags::<MT>::new(rn, FragKind::BPair);
    *acc = [[[0.0f32; 4]; NT]; MT];
    unsafe {
        group_pages::<TM, false>(pages, on_first, |u, free| {
            // Two k steps' fragments at a time (the other group's warps on the same scheduler
            // hide the rest of the latency); the page is freed right after the last loads, so
            // the loader refills it during the last two steps' math.
            let (pa, pb) = (sm.a_page_at(u), sm.b_page_at(u, 1));
            let mut ks = 0;
            while ks < KSTEPS {
                let f0 = load_step(&a_frag, &b_frag, pa, pb, ks);
                let f1 = load_step(&a_frag, &b_frag, pa, pb, ks + 1);
                if free && ks + 2 == KSTEPS {
                    free_pages(sm, u, 1);
                }
                mma_step::<MT, NT, P>(f0, acc);
                mma_step::<MT, NT, P>(f1, acc);
                ks += 2;
            }
        })
    }
}

/// [`tile_mma`] on the asynchronous tensor-core path ([`precision::TF32`] and
/// [`precision::BF16`] at tile 64): each page group is a warpgroup, and it multiplies each of
/// its pages whole with four `wgmma` products (m64n64k8 tf32, or m64n64k16 bf16 from a page
/// twice as deep in K) read straight from the swizzled pages through descriptors (no
/// fragments in registers, nothing converted: every operand is stored in the products'
/// format). A page's products stay in flight while the group waits for its next page and
/// issues that page's products; then it waits for the older group (`wait_group 1`) and frees
/// its page; after the walk, for the last (`wait_group 0`). The other group's products keep
/// the tensor cores busy too. (Waiting for each page's products before the next page would
/// leave the loader waiting for free pages most of its time.) Warp `w` of the group ends with
/// rows `16 w .. 16 w + 16`, all 64 columns ([`wgmma::acc_m64`], which is `acc` as `[1][8]`
/// `m16n8` tiles: `MT = 1`, `NT = 8`, [`layout::WIDE`]).
#[inline(always)]
unsafe fn tile_wgmma<const MT: usize, const NT: usize, const P: u32>(
    pages: Pages<'_>,
    acc: &mut [[[f32; 4]; NT]; MT],
    on_first: &mut impl FnMut(),
) -> bool {
    let sm = pages.sm;
    // four k steps of 32 bytes a row on either format
    const { assert!(PAGE_K == 32 && PAGE_K_BF16 == 2 * PAGE_K) };
    if MT != 1 || NT != 8 {
        // only the tile-64 tf32 and bf16 kernels call it (the other instantiations compile it away)
        thread::trap();
    }
    *acc = [[[0.0f32; 4]; NT]; MT];
    // SAFETY (of the cast): [[[f32; 4]; 8]; 1] and [f32; 32] have the same layout.
    let d = unsafe { &mut *(acc as *mut [[[f32; 4]; NT]; MT] as *mut [f32; 32]) };
    // the page whose products are in flight, and whether to free it (not when draining)
    let mut in_flight: Option<(u32, bool)> = None;
    let ok = unsafe {
        group_pages::<2, true>(pages, on_first, |u, free| {
            let (a, b) = (page_descriptors(sm.a_page_at(u)), page_descriptors(sm.b_page_at(u, 1)));
            if P == precision::BF16 {
                wgmma::mma_m64n64k16x4_bf16(d, a, b);
            } else {
                wgmma::mma_m64n64k8x4_tf32(d, a, b);
            }
            wgmma::wait_group_m64n64::<1>(d);
            if let Some((older, true)) = in_flight {
                free_pages(sm, older, 1);
            }
            in_flight = Some((u, free));
        })
    };
    unsafe { wgmma::wait_group_m64n64::<0>(d) };
    if let Some((last, true)) = in_flight {
        unsafe { free_pages(sm, last, 1) };
    }
    ok
}

/// The four k steps' descriptors of a page at `page`: K-major, 128-byte swizzled, 8-row groups
/// 1024 bytes apart (the GEMM's tile descriptor, whose k step, 16 bf16, is 32 bytes, as 8 tf32
/// are).
#[inline(always)]
fn page_descriptors(page: u32) -> [u64; 4] {
    core::array::from_fn(|kk| tile_descriptor(page, kk as u32))
}

/// [`tile_wgmma`] at tile 128 ([`precision::BF16`], [`layout::ROWS`]): the groups split the
/// tile's rows, and each multiplies every K block (an A page of 128 rows and a B page of 128
/// rows, a ring slot each) with four `wgmma` m64n128k16 products: A from its own 64 rows of
/// the A page (8 KiB in), B the whole B page. Both groups read every page, so every consumer
/// warp frees it ([`page_free_arrivals`]), and the two groups' sums never meet: no exchange.
/// The operands the product reads in place are MN-major pages ([`Product::a_mn`], `b_mn`):
/// the products read them transposed (the group's 64 rows of A are then the A page's second
/// box, 8 KiB in as well).
/// As in [`tile_wgmma`], a block's products stay in flight while the next block is awaited.
/// Warp `w` of group `g` ends with rows `64 g + 16 w .. + 16`, all 128 columns
/// ([`wgmma::acc_m64`]).
#[inline(always)]
unsafe fn tile_wgmma_rows(pages: Pages<'_>, d: &mut [f32; 64], on_first: &mut impl FnMut()) -> bool {
    let sm = pages.sm;
    let (a_mn, b_mn) = (pages.p.a_mn, pages.p.b_mn);
    const PER: u32 = slot_uses_per_block(128);
    const { assert!(PER == 2 && groups_split_rows(128) && page_bytes(128) == STAGE_BYTES) };
    // the group's 64 rows of the A page: 8 row groups of 1024 bytes, or (MN-major) the
    // group's box of 64 K rows of 128 bytes
    let a_rows = (thread::warp_id() / GROUP_WARPS) * 64 * 128;
    let desc = |page: u32, mn: bool| -> [u64; 4] {
        core::array::from_fn(|kk| {
            if mn { super::mn_page_descriptor(page, kk as u32) } else { tile_descriptor(page, kk as u32) }
        })
    };
    *d = [0.0f32; 64];
    let mut in_flight: Option<(u32, bool)> = None;
    let ok = unsafe {
        group_pages::<4, true>(pages, on_first, |u, free| {
            let (a, b) = (desc(sm.a_page_at(u) + a_rows, a_mn), desc(sm.b_page_at(u, PER), b_mn));
            // one asm site per form, every warp of the group on the same one (the forms follow
            // the instruction)
            match (a_mn, b_mn) {
                (false, false) => wgmma::mma_m64n128k16x4_bf16::<0, 0>(d, a, b),
                (false, true) => wgmma::mma_m64n128k16x4_bf16::<0, 1>(d, a, b),
                // (A is read in place only with B: the weight gradient)
                (true, _) => wgmma::mma_m64n128k16x4_bf16::<1, 1>(d, a, b),
            }
            wgmma::wait_group_m64n128::<1>(d);
            if let Some((older, true)) = in_flight {
                free_pages(sm, older, PER);
            }
            in_flight = Some((u, free));
        })
    };
    unsafe { wgmma::wait_group_m64n128::<0>(d) };
    if let Some((last, true)) = in_flight {
        unsafe { free_pages(sm, last, PER) };
    }
    ok
}
