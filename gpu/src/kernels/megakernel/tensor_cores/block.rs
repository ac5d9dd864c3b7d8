// Included in `mod dev` (see `mod.rs`). One block's start, the body of every kernel ([`run`]):
// the block's barriers initialized and its layer table copied, then each warp to its role (the
// loader, the storer, the consumers).

/// A kernel's body: barriers initialized by thread 0, then the loader and the consumers, which
/// multiply with [`consume`]`::<MT, NT, TM, P, L>` (one instantiation per kernel).
#[inline(always)]
pub(super) unsafe fn run<const MT: usize, const NT: usize, const TM: usize, const P: u32, const L: u32>(
    b: &MegaBuffers,
    cfg: &MegaConfig,
) {
    let base = shared::dynamic_smem_addr();
    let sm = Smem { base, weights: base + super::weight_buffer_offset(cfg.layers) };
    if sm.base % 1024 != 0 {
        thread::trap();
    }
    if thread::thread_idx_x() == 0 {
        let mut s = 0;
        while s < PAGE_STAGES {
            unsafe {
                mbarrier::init(sm.ready(s), PAGE_READY_ARRIVALS);
                mbarrier::init(sm.free(s), page_free_arrivals(32 * TM as u32) + cfg.extra_free_arrivals);
            }
            s += 1;
        }
        unsafe {
            mbarrier::init(sm.rendezvous(), CONSUMERS);
            mbarrier::init(sm.drained(), 1);
            mbarrier::init(sm.staged(), CONSUMERS);
            mbarrier::init(sm.stage_free(), 1);
            mbarrier::init(sm.mask_ready(), PAGE_READY_ARRIVALS);
            mbarrier::init(sm.weights_ready(), PAGE_READY_ARRIVALS);
            mbarrier::init(sm.weights_free(), 1);
        }
        fence::mbarrier_init_release_cluster();
    }
    let lt = Layers::new(cfg);
    unsafe { lt.fill(b) };
    crate::sync::sync_threads();
    let block = thread::block_idx_x();
    let (lo, hi) = unsafe { (b.sm_offsets.read(block as usize), b.sm_offsets.read(block as usize + 1)) };
    if thread::warp_id() >= CONSUMER_WARPS {
        if thread::lane_id() == 0 {
            if thread::warp_id() == CONSUMER_WARPS {
                unsafe { load_pages::<TM, P>(b, cfg, sm, lt, lo, hi) };
            } else if stores_through_tma(P, 32 * TM as u32) {
                unsafe { store_tiles(b, cfg, sm, lo, hi) };
            }
        }
        return;
    }
    unsafe { consume::<MT, NT, TM, P, L>(b, cfg, sm, lt, lo, hi) }
}
