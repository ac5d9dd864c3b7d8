//! The Hopper `wgmma` GEMMs (sm_90a) on the host: a plan bound to its operands ([`WgmmaGemm`]) with
//! its tensor maps, block tile, persistent grid, k split and strided batches, and its launcher.

use super::check::Checked;
use super::epilogue::{GemmEpilogue, GemmOutput};
use super::operand_spec;
use crate::cuda::{Device, DeviceBuffer, LaunchConfig};
use crate::error::{Error, Result};
use kiln_gpu::kernels::mma_tile::GemmShape;

/// The block tile of a [`WgmmaGemm`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WgmmaTile {
    /// 128 x 128, `m64n128k16`, one wgmma group waited per k tile (`gemm_wgmma_bf16`: the guide's
    /// first Hopper rung).
    T128x128,
    /// 128 x 256, `m64n256k16`, one group kept in flight, `setmaxnreg`, grouped block order
    /// (`gemm_wgmma_bf16_wide`).
    T128x256,
    /// The 128 x 256 tile in a persistent grid of 2-CTA clusters that multicast B, with the
    /// next tile's loads overlapping the epilogue and bias / activation fused into it
    /// (`gemm_wgmma_bf16_persistent`, the default).
    Persistent,
    /// The persistent kernel with each CTA loading all of its B tile (no multicast).
    PersistentUnicast,
    /// The persistent kernel (multicast) storing C from registers even where the staged TMA-store
    /// epilogue would fit: the rung before the staged epilogue, kept for the benchmark and tests.
    PersistentRegisterStore,
    /// Not `wgmma`: the `mma.sync` wide tile's consumers (8 warps of 64 x 64) fed by the same TMA
    /// ring as [`WgmmaTile::T128x256`] (`hgemm_mma_bf16_tma`): the loads change, the products do not.
    MmaSyncTma,
}

impl WgmmaTile {
    /// Whether this is one of the persistent kernel's configurations (which fuse an epilogue).
    pub const fn is_persistent(self) -> bool {
        matches!(self, WgmmaTile::Persistent | WgmmaTile::PersistentUnicast | WgmmaTile::PersistentRegisterStore)
    }
}

/// How a [`WgmmaGemm`]'s operands are stored, for `c` (m x n) summed over k. Every layout reads
/// its operands in place: bf16 `wgmma` reads either operand K-major (k contiguous) or MN-major (m
/// or n contiguous) through its transpose flags, so no transposed copy is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WgmmaLayout {
    /// `a` m x k, `b` n x k: `c = a b^T` (both K-major; `y = x W^T`). Needs `k % 8 == 0`.
    ABt,
    /// `a` m x k, `b` k x n: `c = a b` (`b` read MN-major; the input gradient `dX = dY W` with
    /// `W` stored n_out x k_in). Needs `k % 8 == 0` and `n % 8 == 0` (TMA's 16-byte row pitch).
    AB,
    /// `a` k x m, `b` k x n: `c = a^T b` (both MN-major; the weight gradient `dW = dY^T X`). Needs
    /// `m % 8 == 0` and `n % 8 == 0`; k (the batch of the layer) is free.
    AtB,
}

impl WgmmaLayout {
    /// The fused kernel's code (`kiln_gpu::kernels::gemm_wgmma_fused::layout`).
    fn code(self) -> u32 {
        use kiln_gpu::kernels::gemm_wgmma_fused::layout;
        match self {
            WgmmaLayout::ABt => layout::ABT,
            WgmmaLayout::AB => layout::AB,
            WgmmaLayout::AtB => layout::ATB,
        }
    }

    /// The row pitches (in elements) of `a` and `b` as stored for shape `s`: each must be a
    /// multiple of 8 (16 bytes of bf16) for its tensor map.
    pub fn pitches(self, s: GemmShape) -> (u32, u32) {
        match self {
            WgmmaLayout::ABt => (s.k, s.k),
            WgmmaLayout::AB => (s.k, s.n),
            WgmmaLayout::AtB => (s.m, s.n),
        }
    }
}

/// Strided batches of a [`WgmmaGemm`] ([`WgmmaGemm::batched`]): strides in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchSpec {
    /// Products in the batch.
    pub count: u32,
    /// Elements of A between products (a multiple of k; `m k` when packed, 0 to share one A).
    pub a_stride: usize,
    /// Elements of B between products (a multiple of k; `n k` when packed, 0 to share one B).
    pub b_stride: usize,
    /// Elements of C between products (at least `m n`).
    pub c_stride: usize,
}

/// A Hopper `wgmma` GEMM bound to its operands: `c = a b^T` with `a` (m x k) and `b` (n x k) bf16,
/// `c` (m x n) f32, `k % 8 == 0`. The tensor maps are encoded once; [`WgmmaGemm::run`] launches.
/// Needs the sm_90a module (compute capability 9.0); elsewhere the persistent tiles fail to build
/// (their occupancy is queried in `with_tile`) and `run` of the others returns
/// [`Error::KernelUnavailable`].
pub struct WgmmaGemm<'a> {
    dev: &'a Device,
    a_map: std::sync::Arc<crate::cuda::DeviceTensorMap>,
    b_map: std::sync::Arc<crate::cuda::DeviceTensorMap>,
    /// The product's shape, checked.
    checked: Checked,
    tile: WgmmaTile,
    /// The persistent kernels' grid in clusters (occupancy queried once, here); 0 for other tiles.
    clusters: u32,
    /// Clusters resident at once on this device (persistent tiles; 0 for others).
    resident: u32,
    /// The persistent kernel's k split (1: none).
    splits: u32,
    /// The split products' partials (`splits * m * n` f32), allocated on the first split run.
    workspace: std::cell::RefCell<Option<DeviceBuffer<f32>>>,
    /// Strided batches (persistent tiles; `Batch::ONE` for one product).
    batch: kiln_gpu::kernels::gemm_wgmma::Batch,
    /// The staged epilogue's tensor map of the last C it stored to (from the device's cache).
    c_map: std::cell::RefCell<Option<std::sync::Arc<crate::cuda::DeviceTensorMap>>>,
    /// How the operands are stored ([`WgmmaLayout::ABt`] unless built by [`WgmmaGemm::with_layout`]).
    layout: WgmmaLayout,
    _operands: std::marker::PhantomData<&'a DeviceBuffer<half::bf16>>,
}

impl<'a> WgmmaGemm<'a> {
    /// Checks the shapes and encodes the two tensor maps, for the default (persistent) kernel.
    pub fn new(
        dev: &'a Device,
        a: &'a DeviceBuffer<half::bf16>,
        b: &'a DeviceBuffer<half::bf16>,
        s: GemmShape,
    ) -> Result<Self> {
        Self::with_tile(dev, a, b, s, WgmmaTile::Persistent)
    }

    /// As [`WgmmaGemm::new`], for the given block tile.
    pub fn with_tile(
        dev: &'a Device,
        a: &'a DeviceBuffer<half::bf16>,
        b: &'a DeviceBuffer<half::bf16>,
        s: GemmShape,
        tile: WgmmaTile,
    ) -> Result<Self> {
        let (m, n) = (s.m as usize, s.n as usize);
        let checked = Checked::operands("wgmma gemm", a.len(), b.len(), m * n, s)?;
        Self::build(dev, a, b, checked, tile, kiln_gpu::kernels::gemm_wgmma::Batch::ONE, s.m, s.n)
    }

    /// The persistent kernel's product with its operands stored in `layout` (`a` and `b` hold m k
    /// and n k elements either way): [`WgmmaLayout::ABt`] is [`WgmmaGemm::new`]; the others run the
    /// fused kernel (`gemm_wgmma_bf16_fused`), which reads MN-major operands in place through
    /// 64 x 64 boxes of their k x m (k x n) tensor maps. One product; a k split through
    /// [`WgmmaGemm::with_split_k`] (see [`WgmmaGemm::auto_split_k`]).
    pub fn with_layout(
        dev: &'a Device,
        a: &'a DeviceBuffer<half::bf16>,
        b: &'a DeviceBuffer<half::bf16>,
        s: GemmShape,
        layout: WgmmaLayout,
    ) -> Result<Self> {
        use kiln_gpu::kernels::gemm_wgmma::WG_BM;
        if layout == WgmmaLayout::ABt {
            return Self::new(dev, a, b, s);
        }
        let (m, n) = (s.m as usize, s.n as usize);
        let checked = Checked::operands("wgmma gemm", a.len(), b.len(), m * n, s)?.non_empty()?;
        let (pa, pb) = layout.pitches(s);
        if let Some((which, p)) = [("a", pa), ("b", pb)].into_iter().find(|(_, p)| !p.is_multiple_of(8)) {
            return Err(Error::Unsupported {
                op: "wgmma gemm",
                what: format!(
                    "{which} stored with rows of {p} elements in the {layout:?} layout: TMA needs 16-byte row pitches, so a multiple of 8"
                ),
            });
        }
        let a_spec = if layout == WgmmaLayout::AtB { mn_operand_spec(s.k, s.m) } else { operand_spec(s.m, s.k, WG_BM) };
        let a_map = dev.tensor_map_cached(a.addr(), &a_spec)?;
        let b_map = dev.tensor_map_cached(b.addr(), &mn_operand_spec(s.k, s.n))?;
        let resident = resident_clusters(dev)?;
        let g = WgmmaGemm {
            dev,
            a_map,
            b_map,
            checked,
            tile: WgmmaTile::Persistent,
            clusters: 0,
            resident,
            splits: 1,
            workspace: std::cell::RefCell::new(None),
            batch: kiln_gpu::kernels::gemm_wgmma::Batch::ONE,
            c_map: std::cell::RefCell::new(None),
            layout,
            _operands: std::marker::PhantomData,
        };
        g.with_split_k(1)
    }

    /// The layout the plan reads its operands in.
    pub fn layout(&self) -> WgmmaLayout {
        self.layout
    }

    /// `batch.count` products `c_i = a_i b_i^T` (persistent kernel) with `a_i` at element
    /// `i * batch.a_stride` of `a`, `b_i` at `i * batch.b_stride` of `b` (0: one B for all) and
    /// `c_i` at `i * batch.c_stride` of the output; each `a_i` m x k, `b_i` n x k, `c_i` m x n,
    /// row-major. The input strides must be multiples of k (the operands are read through one
    /// tensor map each, as stacked rows), the output stride at least m n. Each product has the
    /// bits it has alone.
    pub fn batched(
        dev: &'a Device,
        a: &'a DeviceBuffer<half::bf16>,
        b: &'a DeviceBuffer<half::bf16>,
        s: GemmShape,
        batch: BatchSpec,
    ) -> Result<Self> {
        let (m, n, kk) = (s.m as usize, s.n as usize, s.k as usize);
        let count = batch.count as usize;
        let bad = |what: String| Err(Error::shape("wgmma gemm", what));
        if count == 0 {
            return bad("a batch of 0 products".into());
        }
        if kk == 0 || !batch.a_stride.is_multiple_of(kk) || !batch.b_stride.is_multiple_of(kk) {
            return bad(format!(
                "strides {} (a) and {} (b) must be multiples of k = {kk}: each batch starts on a row",
                batch.a_stride, batch.b_stride
            ));
        }
        // each product within the kernels' 32-bit indexing, as for one product
        let checked = Checked::indexable("wgmma gemm", s)?;
        if batch.c_stride < m * n {
            return bad(format!("c stride {} is below m n = {}: the products would overlap", batch.c_stride, m * n));
        }
        // elements the batch spans from the first product's start (None: past any buffer)
        let span = |stride: usize, one: usize| (count - 1).checked_mul(stride).and_then(|x| x.checked_add(one));
        let (a_need, b_need) = (span(batch.a_stride, m * kk), span(batch.b_stride, n * kk));
        let c_need = span(batch.c_stride, m * n).filter(|&x| x <= isize::MAX as usize / 4);
        if c_need.is_none() {
            return bad(format!("{count} products {} elements apart do not fit memory", batch.c_stride));
        }
        if a_need.is_none_or(|x| a.len() < x) || b_need.is_none_or(|x| b.len() < x) {
            return bad(format!(
                "a holds {} elements and b {}; the batch reads {a_need:?} and {b_need:?}",
                a.len(),
                b.len()
            ));
        }
        let rows = |stride: usize, one: usize| -> Result<(u32, u32)> {
            let step = stride / kk;
            let total = (count - 1) * step + one;
            if total > i32::MAX as usize {
                return Err(Error::Unsupported {
                    op: "wgmma gemm",
                    what: format!("{total} stacked rows: tensor-map coordinates are 32-bit; split the batch"),
                });
            }
            Ok((step as u32, total as u32))
        };
        let ((a_rows, a_total), (b_rows, b_total)) = (rows(batch.a_stride, m)?, rows(batch.b_stride, n)?);
        let c_stride = batch.c_stride as u64;
        let spec = kiln_gpu::kernels::gemm_wgmma::Batch { count: batch.count, a_rows, b_rows, pad: 0, c_stride };
        Self::build(dev, a, b, checked, WgmmaTile::Persistent, spec, a_total, b_total)
    }

    /// Encodes the maps (A over `a_rows` stacked rows, B over `b_rows`) and sets the plan up.
    #[allow(clippy::too_many_arguments)]
    fn build(
        dev: &'a Device,
        a: &'a DeviceBuffer<half::bf16>,
        b: &'a DeviceBuffer<half::bf16>,
        checked: Checked,
        tile: WgmmaTile,
        batch: kiln_gpu::kernels::gemm_wgmma::Batch,
        a_rows: u32,
        b_rows: u32,
    ) -> Result<Self> {
        use kiln_gpu::kernels::gemm_wgmma::{WG_BM, WG_BN, WW_BN};
        let checked = checked.non_empty()?.k_multiple_of(8, "TMA needs 16-byte row pitches")?;
        let s = checked.shape();
        // Cached on the device: plans built per call over recycled buffers reuse their maps.
        let a_map = dev.tensor_map_cached(a.addr(), &operand_spec(a_rows, s.k, WG_BM))?;
        let bn = match tile {
            WgmmaTile::T128x128 => WG_BN,
            WgmmaTile::T128x256 | WgmmaTile::MmaSyncTma => WW_BN,
            // each CTA of a cluster loads its share of the 256 rows and multicasts it
            WgmmaTile::Persistent | WgmmaTile::PersistentUnicast | WgmmaTile::PersistentRegisterStore => {
                kiln_gpu::kernels::gemm_wgmma::WP_B_SHARE
            }
        };
        let b_map = dev.tensor_map_cached(b.addr(), &operand_spec(b_rows, s.k, bn))?;
        let resident = if tile.is_persistent() { resident_clusters(dev)? } else { 0 };
        let mut g = WgmmaGemm {
            dev,
            a_map,
            b_map,
            checked,
            tile,
            clusters: 0,
            resident,
            splits: 1,
            workspace: std::cell::RefCell::new(None),
            batch,
            c_map: std::cell::RefCell::new(None),
            layout: WgmmaLayout::ABt,
            _operands: std::marker::PhantomData,
        };
        if tile.is_persistent() {
            g = g.with_split_k(1)?;
        }
        Ok(g)
    }

    /// The k split [`choose_split_k`](kiln_gpu::kernels::gemm_wgmma::choose_split_k) suggests for
    /// this product on this device (1 for non-persistent tiles). Not applied by default: a split
    /// changes the order of each output's reduction, and a split chosen from the shape would make
    /// row i's bits depend on m, breaking the tensor-core tier's batch invariance. Apply it with
    /// [`WgmmaGemm::with_split_k`] where speed matters more than that.
    pub fn suggested_split_k(&self) -> u32 {
        use kiln_gpu::kernels::gemm_wgmma::{WG_BK, choose_split_k};
        if !self.tile.is_persistent() || self.batch.count > 1 {
            return 1; // batches are not split
        }
        choose_split_k(self.cluster_tiles(), self.checked.shape().k.div_ceil(WG_BK), self.resident)
    }

    /// The k split the tensor engine applies to this product: [`engine_split_k`] of its cluster
    /// tiles, k tiles and resident clusters (1 for batches and non-persistent tiles). For products
    /// whose bits may depend on their shape, such as weight gradients (a split changes the order
    /// of each output's sum; the bits stay the same on every run of a shape).
    pub fn auto_split_k(&self) -> u32 {
        use kiln_gpu::kernels::gemm_wgmma::WG_BK;
        if !self.tile.is_persistent() || self.batch.count > 1 {
            return 1;
        }
        engine_split_k(self.cluster_tiles(), self.checked.shape().k.div_ceil(WG_BK), self.resident)
    }

    /// The persistent kernel's cluster tiles (256 x 256) for this shape.
    fn cluster_tiles(&self) -> u32 {
        use kiln_gpu::kernels::gemm_wgmma::{WP_BM, WW_BN};
        self.checked.shape().m.div_ceil(WP_BM) * self.checked.shape().n.div_ceil(WW_BN)
    }

    /// The same product with the persistent kernel's k cut into `splits` parts (1: none, the
    /// default), each a work unit; a fixed-order reduction then sums the parts and applies the
    /// epilogue. The bits stay reproducible for a given split, but differ from the unsplit
    /// product's (see [`WgmmaGemm::suggested_split_k`]). Needs a persistent tile and every part
    /// non-empty.
    pub fn with_split_k(mut self, splits: u32) -> Result<Self> {
        use kiln_gpu::kernels::gemm_wgmma::{WG_BK, split_k_fits};
        let k_tiles = self.checked.shape().k.div_ceil(WG_BK);
        if !self.tile.is_persistent() && splits != 1 {
            return Err(Error::Unsupported {
                op: "wgmma gemm",
                what: format!("a k split with the {:?} tile: use a persistent tile", self.tile),
            });
        }
        if !split_k_fits(k_tiles, splits) {
            return Err(Error::Unsupported {
                op: "wgmma gemm",
                what: format!(
                    "{splits} k parts of {k_tiles} k tiles of {WG_BK}: some part would be empty; use fewer parts"
                ),
            });
        }
        if splits != 1 && self.batch.count > 1 {
            return Err(Error::Unsupported {
                op: "wgmma gemm",
                what: "a k split of a batched product: split the batch's products one by one instead".into(),
            });
        }
        self.splits = splits;
        let units = self.cluster_tiles() as u64 * splits as u64 * self.batch.count as u64;
        self.clusters = units.min(self.resident as u64) as u32;
        if splits > 1
            && (self.checked.shape().m as u64 * self.checked.shape().n as u64 * splits as u64) > isize::MAX as u64 / 4
        {
            return Err(Error::shape("wgmma gemm", "the split partials do not fit memory; use fewer parts"));
        }
        Ok(self)
    }

    /// The persistent kernel's k split (1: none).
    pub fn split_k(&self) -> u32 {
        self.splits
    }

    /// The address of C's tensor map for the staged epilogue, or 0 where C cannot take TMA stores
    /// ([`kiln_gpu::kernels::gemm_wgmma::tma_store_fits`]) or the tile stores from registers.
    fn staged_c_map(&self, c: &DeviceBuffer<f32>) -> Result<u64> {
        use kiln_gpu::kernels::gemm_wgmma::{WP_EPI_COLS, tma_store_fits};
        let staged = matches!(self.tile, WgmmaTile::Persistent | WgmmaTile::PersistentUnicast);
        if !staged || self.batch.count > 1 || !tma_store_fits(self.checked.shape().n, c.addr()) {
            return Ok(0);
        }
        let spec = crate::cuda::TensorMapSpec {
            dtype: crate::cuda::TmaDtype::F32,
            rows: self.checked.shape().m as u64,
            cols: self.checked.shape().n as u64,
            row_pitch: self.checked.shape().n as u64,
            box_rows: 64,
            box_cols: WP_EPI_COLS,
            swizzle: kiln_gpu::kernels::gemm_wgmma::WG_SWIZZLE,
        };
        let map = self.dev.tensor_map_cached(c.addr(), &spec)?;
        let addr = map.ptr().addr();
        // kept with the plan, so that the map outlives this launch whatever the cache does
        *self.c_map.borrow_mut() = Some(map);
        Ok(addr)
    }

    /// The persistent kernel's grid, in clusters: one per cluster tile, at most as many as fit on
    /// the device at once (0 for the other tiles).
    pub fn persistent_clusters(&self) -> u32 {
        self.clusters
    }

    /// Launches into `c` (m x n f32).
    pub fn run(&self, c: &mut DeviceBuffer<f32>) -> Result<()> {
        self.run_with(c, GemmEpilogue::default())
    }

    /// Launches into `c` (m x n f32) with the epilogue applied to each output. The persistent
    /// kernel fuses it; the other tiles refuse a non-empty epilogue.
    pub fn run_with(&self, c: &mut DeviceBuffer<f32>, epi: GemmEpilogue<'_>) -> Result<()> {
        if self.layout != WgmmaLayout::ABt || epi.has_additions() {
            return self.run_fused(c, epi);
        }
        use kiln_gpu::kernels::gemm_wgmma::{
            ACT_NONE, Epilogue, GemmWgmmaBf16, GemmWgmmaBf16Persistent, GemmWgmmaBf16Wide, WG_BM, WG_BN, WG_SMEM_BYTES,
            WG_THREADS, WP_SMEM_BYTES, WW_BN, WW_SMEM_BYTES,
        };
        let s = self.checked.shape();
        let mn = s.m as usize * s.n as usize;
        let batch = self.batch;
        // fits: `batched` checked the batch's span
        let c_need = (batch.count as usize - 1) * batch.c_stride as usize + mn;
        if (batch.count == 1 && c.len() != mn) || c.len() < c_need {
            return Err(Error::shape("wgmma gemm", format!("c needs {c_need} elements, has {}", c.len())));
        }
        if let Some(b) = epi.bias
            && b.len() != s.n as usize
        {
            return Err(Error::shape("wgmma gemm", format!("the bias needs n = {} elements, has {}", s.n, b.len())));
        }
        let fused = Epilogue {
            bias: epi.bias.map_or(kiln_gpu::DevicePtr::from_addr(0), |b| b.ptr()),
            has_bias: epi.bias.is_some() as u32,
            act: epi.act.map_or(ACT_NONE, |a| a.code()),
        };
        let persistent = self.tile.is_persistent();
        if !persistent && (epi.bias.is_some() || epi.act.is_some()) {
            return Err(Error::Unsupported {
                op: "wgmma gemm",
                what: format!(
                    "a bias or activation with the {:?} tile: use WgmmaTile::Persistent, which fuses them",
                    self.tile
                ),
            });
        }
        let args = (self.a_map.ptr(), self.b_map.ptr(), c.ptr_mut(), s);
        match self.tile {
            WgmmaTile::T128x128 => {
                let cfg = LaunchConfig {
                    grid_dim: (s.n.div_ceil(WG_BN), s.m.div_ceil(WG_BM), 1),
                    block_dim: (WG_THREADS, 1, 1),
                    shared_mem_bytes: WG_SMEM_BYTES,
                };
                // SAFETY: the maps describe the borrowed operands; c is checked above; stores are masked.
                self.checked.launch(cfg, |cfg| unsafe { self.dev.launch(GemmWgmmaBf16, cfg, args) })
            }
            WgmmaTile::T128x256 | WgmmaTile::MmaSyncTma => {
                use kiln_gpu::kernels::hgemm_mma::{HGEMM_TMA_THREADS, HgemmMmaBf16Tma};
                let tiles = s.m.div_ceil(WG_BM) as u64 * s.n.div_ceil(WW_BN) as u64;
                let blocks = self.checked.grid_1d(tiles, "tiles")?;
                let threads = if self.tile == WgmmaTile::MmaSyncTma { HGEMM_TMA_THREADS } else { WG_THREADS };
                let cfg = LaunchConfig {
                    grid_dim: (blocks, 1, 1),
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: WW_SMEM_BYTES,
                };
                // SAFETY: as above; both kernels read the B map with the 256-row box it was made with,
                // and the same 4-stage ring (WW_SMEM_BYTES).
                self.checked.launch(cfg, |cfg| unsafe {
                    if self.tile == WgmmaTile::MmaSyncTma {
                        self.dev.launch(HgemmMmaBf16Tma, cfg, args)
                    } else {
                        self.dev.launch(GemmWgmmaBf16Wide, cfg, args)
                    }
                })
            }
            WgmmaTile::Persistent | WgmmaTile::PersistentUnicast | WgmmaTile::PersistentRegisterStore => {
                type K = GemmWgmmaBf16Persistent;
                let multicast = (self.tile != WgmmaTile::PersistentUnicast) as u32;
                let cfg = LaunchConfig {
                    grid_dim: (self.clusters * <K as kiln_gpu::Kernel>::CLUSTER, 1, 1),
                    block_dim: (WG_THREADS, 1, 1),
                    shared_mem_bytes: WP_SMEM_BYTES,
                };
                if self.splits == 1 {
                    let c_map = kiln_gpu::DevicePtr::from_addr(self.staged_c_map(c)?);
                    // SAFETY: as above; the B map's box is the 128-row share each CTA multicasts; the
                    // bias (when present) holds n floats, checked above; the C map (when not null)
                    // describes c with the 32 x 64 box the staged epilogue stores.
                    return self.checked.launch(cfg, |cfg| unsafe {
                        self.dev.launch(
                            K::default(),
                            cfg,
                            (args.0, args.1, args.2, args.3, fused, multicast, c_map, 1, batch),
                        )
                    });
                }
                use kiln_gpu::kernels::gemm_wgmma::GemmSplitKReduce;
                let parts = self.splits as usize * mn;
                let mut ws = self.workspace.borrow_mut();
                if ws.as_ref().is_none_or(|w| w.len() != parts) {
                    *ws = Some(self.dev.alloc_uninit_f32(parts)?);
                }
                let ws = ws.as_mut().expect("allocated above");
                let null = kiln_gpu::DevicePtr::from_addr(0);
                // SAFETY: as above, with the partials (splits * m * n f32) as the kernel's output and
                // every k part non-empty (with_split_k); then the reduction reads the partials and
                // writes the m * n outputs of c.
                let k_args = (args.0, args.1, ws.ptr_mut(), s, ACT_NONE_EPILOGUE, multicast, null, self.splits, batch);
                self.checked.launch(cfg, |cfg| unsafe { self.dev.launch(K::default(), cfg, k_args) })?;
                let blocks = (mn as u32).div_ceil(256).min(132 * 16);
                let rcfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
                self.checked.launch(rcfg, |rcfg| unsafe {
                    self.dev.launch(GemmSplitKReduce, rcfg, (ws.ptr(), c.ptr_mut(), mn as u32, s.n, self.splits, fused))
                })
            }
        }
    }
}

impl WgmmaGemm<'_> {
    /// Launches into `c` (m x n of `T`: f32, bf16 or f16) with the whole fused epilogue
    /// ([`GemmEpilogue`]: `c = act(acc + bias) + residual + table[row % period]`, rounded once to
    /// `T`), on the fused kernel (`gemm_wgmma_bf16_fused`, stores from registers). Needs a
    /// persistent tile and one product; the buffers are checked against the shape (typed errors).
    /// With a k split ([`WgmmaGemm::with_split_k`]) the parts run on `gemm_wgmma_bf16_fused_split`
    /// into an f32 workspace and `gemm_split_k_reduce_fused` adds them in order and applies the
    /// epilogue. [`WgmmaGemm::run_with`] comes here for f32 outputs with additions or a
    /// layout other than [`WgmmaLayout::ABt`].
    pub fn run_fused<T: GemmOutput>(&self, c: &mut DeviceBuffer<T>, epi: GemmEpilogue<'_, T>) -> Result<()> {
        use kiln_gpu::kernels::gemm_wgmma::{ACT_NONE, WG_THREADS, WP_SMEM_BYTES};
        use kiln_gpu::kernels::gemm_wgmma_fused::{FusedEpilogue, GemmWgmmaBf16Fused};
        if !self.tile.is_persistent() || self.batch.count != 1 {
            return Err(Error::Unsupported {
                op: "wgmma gemm",
                what: format!(
                    "the fused epilogue with the {:?} tile and {} products: it needs a persistent tile and one product",
                    self.tile, self.batch.count
                ),
            });
        }
        let elem = std::mem::size_of::<T>() as u64;
        let at = |b: &DeviceBuffer<T>| (b.len(), b.addr());
        self.checked.epilogue(
            elem,
            at(c),
            epi.bias.map(|b| (b.len(), b.addr())),
            epi.residual.map(at),
            epi.periodic.map(|(t, p)| (at(t), p)),
        )?;
        let null = kiln_gpu::DevicePtr::from_addr(0);
        let fused = FusedEpilogue {
            bias: epi.bias.map_or(null, |b| b.ptr()),
            residual: kiln_gpu::DevicePtr::from_addr(epi.residual.map_or(0, |r| r.addr())),
            table: kiln_gpu::DevicePtr::from_addr(epi.periodic.map_or(0, |(t, _)| t.addr())),
            has_bias: epi.bias.is_some() as u32,
            act: epi.act.map_or(ACT_NONE, |a| a.code()),
            has_residual: epi.residual.is_some() as u32,
            period: epi.periodic.map_or(0, |(_, p)| p),
            format: T::FORMAT,
            pad: 0,
        };
        type K = GemmWgmmaBf16Fused;
        let multicast = (self.tile != WgmmaTile::PersistentUnicast) as u32;
        let cfg = LaunchConfig {
            grid_dim: (self.clusters * <K as kiln_gpu::Kernel>::CLUSTER, 1, 1),
            block_dim: (WG_THREADS, 1, 1),
            shared_mem_bytes: WP_SMEM_BYTES,
        };
        let c_ptr = kiln_gpu::DevicePtrMut::<u8>::from_addr(c.addr());
        let s = self.checked.shape();
        if self.splits > 1 {
            return self.run_fused_split(c_ptr, fused, multicast);
        }
        let c_map = kiln_gpu::DevicePtr::from_addr(self.fused_c_map::<T>(c.addr())?);
        let args = (self.a_map.ptr(), self.b_map.ptr(), c_ptr, s, fused, multicast, self.layout.code(), c_map);
        // SAFETY: the maps describe the borrowed operands in the plan's layout (boxes as the
        // kernel loads them); c, the bias, the residual and the table are checked against the
        // shape and aligned to their elements above; stores are masked, or clipped by the C map
        // (when not null: c in T with the staging box); the shared memory is the persistent
        // kernel's ring and staging boxes.
        self.checked.launch(cfg, |cfg| unsafe { self.dev.launch(K::default(), cfg, args) })
    }
}

impl WgmmaGemm<'_> {
    /// [`WgmmaGemm::run_fused`] with a k split: the parts into the workspace
    /// (`gemm_wgmma_bf16_fused_split`), then their fixed-order sum and `fused` into `c`
    /// (`gemm_split_k_reduce_fused`). `c` and the epilogue's buffers are checked by the caller.
    fn run_fused_split(
        &self,
        c: kiln_gpu::DevicePtrMut<u8>,
        fused: kiln_gpu::kernels::gemm_wgmma_fused::FusedEpilogue,
        multicast: u32,
    ) -> Result<()> {
        use kiln_gpu::kernels::gemm_wgmma::{WG_THREADS, WP_SMEM_BYTES};
        use kiln_gpu::kernels::gemm_wgmma_fused::{GemmSplitKReduceFused, GemmWgmmaBf16FusedSplit};
        type K = GemmWgmmaBf16FusedSplit;
        let s = self.checked.shape();
        let mn = s.m as usize * s.n as usize;
        let parts = self.splits as usize * mn;
        let mut ws = self.workspace.borrow_mut();
        if ws.as_ref().is_none_or(|w| w.len() != parts) {
            *ws = Some(self.dev.alloc_uninit_f32(parts)?);
        }
        let ws = ws.as_mut().expect("allocated above");
        let cfg = LaunchConfig {
            grid_dim: (self.clusters * <K as kiln_gpu::Kernel>::CLUSTER, 1, 1),
            block_dim: (WG_THREADS, 1, 1),
            shared_mem_bytes: WP_SMEM_BYTES,
        };
        let args = (self.a_map.ptr(), self.b_map.ptr(), ws.ptr_mut(), s, multicast, self.layout.code(), self.splits);
        // SAFETY: the maps describe the borrowed operands in the plan's layout; the workspace holds
        // the splits * m * n f32 partials the kernel stores (masked at the edges), every k part is
        // non-empty (with_split_k); the shared memory is the persistent kernel's ring.
        self.checked.launch(cfg, |cfg| unsafe { self.dev.launch(K::default(), cfg, args) })?;
        let blocks = (mn as u32).div_ceil(256).min(132 * 16);
        let rcfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the reduction reads the m * n * splits partials written above and writes the
        // m * n outputs of c in `fused.format`, reading the epilogue's buffers, all checked by
        // run_fused against the shape.
        self.checked.launch(rcfg, |rcfg| unsafe {
            self.dev.launch(GemmSplitKReduceFused, rcfg, (ws.ptr(), c, s, self.splits, fused))
        })
    }

    /// The address of C's tensor map for the fused kernel's staged epilogue (C of `T` at
    /// `c_addr`), or 0 where C cannot take TMA stores
    /// ([`kiln_gpu::kernels::gemm_wgmma_fused::staged_store_fits`]) or the tile stores from
    /// registers ([`WgmmaTile::PersistentRegisterStore`]).
    fn fused_c_map<T: GemmOutput>(&self, c_addr: u64) -> Result<u64> {
        use kiln_gpu::kernels::gemm_wgmma_fused::{format, staged_box_cols, staged_store_fits};
        let s = self.checked.shape();
        if self.tile == WgmmaTile::PersistentRegisterStore || !staged_store_fits(s.n, T::FORMAT, c_addr) {
            return Ok(0);
        }
        let dtype = match T::FORMAT {
            format::F32 => crate::cuda::TmaDtype::F32,
            format::BF16 => crate::cuda::TmaDtype::Bf16,
            _ => crate::cuda::TmaDtype::F16,
        };
        let spec = crate::cuda::TensorMapSpec {
            dtype,
            rows: s.m as u64,
            cols: s.n as u64,
            row_pitch: s.n as u64,
            box_rows: 64,
            box_cols: staged_box_cols(T::FORMAT),
            swizzle: kiln_gpu::kernels::gemm_wgmma::WG_SWIZZLE,
        };
        let map = self.dev.tensor_map_cached(c_addr, &spec)?;
        let addr = map.ptr().addr();
        // kept with the plan, so that the map outlives this launch whatever the cache does
        *self.c_map.borrow_mut() = Some(map);
        Ok(addr)
    }
}

/// The k split the tensor engine applies ([`WgmmaGemm::auto_split_k`]) to a product of `tiles`
/// cluster tiles (256 x 256) with `k_tiles` k tiles (of 64) on `clusters` resident clusters:
/// [`choose_split_k`](kiln_gpu::kernels::gemm_wgmma::choose_split_k)'s split (1 unless the tiles
/// leave at least half the clusters idle), lowered until every part has at least 4 k tiles
/// (shorter parts spend more on their partials than they gain); 1 where that leaves no split.
pub const fn engine_split_k(tiles: u32, k_tiles: u32, clusters: u32) -> u32 {
    let mut s = kiln_gpu::kernels::gemm_wgmma::choose_split_k(tiles, k_tiles, clusters);
    while s > 1 && (k_tiles < 4 * s || !kiln_gpu::kernels::gemm_wgmma::split_k_fits(k_tiles, s)) {
        s -= 1;
    }
    s
}

/// The tensor map of an operand read MN-major by the fused kernel: the k x `mn` bf16 matrix
/// (row pitch `mn`), boxes of 64 k rows by 64 columns, 128-byte swizzle.
fn mn_operand_spec(k: u32, mn: u32) -> crate::cuda::TensorMapSpec {
    use kiln_gpu::kernels::gemm_wgmma::{WG_BK, WG_SWIZZLE};
    use kiln_gpu::kernels::gemm_wgmma_fused::MN_BOX;
    crate::cuda::TensorMapSpec {
        dtype: crate::cuda::TmaDtype::Bf16,
        rows: k as u64,
        cols: mn as u64,
        row_pitch: mn as u64,
        box_rows: WG_BK,
        box_cols: MN_BOX,
        swizzle: WG_SWIZZLE,
    }
}

/// `out[col] = sum over rows of x[row][col]` for the m x n row-major `x` (f32, bf16 or f16), in f32
/// (`gemm_column_sums`: the rows cut into [`column_sum_chunks`] chunks whose f32 partials a second
/// launch adds in order, so the bits are the same on every run of a shape). The bias gradient of
/// `y = x W^T + b` is the column sums of dY.
pub fn column_sums<T: GemmOutput>(
    dev: &Device,
    x: &DeviceBuffer<T>,
    out: &mut DeviceBuffer<f32>,
    m: u32,
    n: u32,
) -> Result<()> {
    use kiln_gpu::kernels::gemm_wgmma_fused::{COLSUM_SMEM_BYTES, COLSUM_THREADS, GemmColumnSums, format};
    let op = "column sums";
    if x.len() as u64 != m as u64 * n as u64 || out.len() != n as usize {
        return Err(Error::shape(
            op,
            format!(
                "{m} x {n}: x needs {} elements and out {n}; got {} and {}",
                m as u64 * n as u64,
                x.len(),
                out.len()
            ),
        ));
    }
    if x.len() > super::MAX_OPERAND_ELEMENTS {
        return Err(Error::Unsupported {
            op,
            what: format!("{m} x {n}: over 2^31 elements (32-bit indexing); split the rows"),
        });
    }
    if n == 0 {
        return Ok(());
    }
    let (chunks, rows) = column_sum_chunks(m, n);
    let cfg = |chunks: u32| LaunchConfig {
        grid_dim: (n.div_ceil(32), chunks, 1),
        block_dim: (COLSUM_THREADS, 1, 1),
        shared_mem_bytes: COLSUM_SMEM_BYTES,
    };
    let x_ptr = kiln_gpu::DevicePtr::<u8>::from_addr(x.addr());
    if chunks == 1 {
        // SAFETY: x holds m n elements of T and out n f32 (checked above); one chunk of m rows.
        return unsafe { dev.launch(GemmColumnSums, cfg(1), (x_ptr, out.ptr_mut(), m, n, T::FORMAT, m.max(1))) };
    }
    let mut partials = dev.alloc_uninit_f32(chunks as usize * n as usize)?;
    // SAFETY: as above; the partials hold chunks x n f32, and each chunk of `rows` rows writes its
    // row of them; then one chunk of `chunks` rows sums them into out.
    unsafe {
        dev.launch(GemmColumnSums, cfg(chunks), (x_ptr, partials.ptr_mut(), m, n, T::FORMAT, rows))?;
        let p = kiln_gpu::DevicePtr::<u8>::from_addr(partials.addr());
        dev.launch(GemmColumnSums, cfg(1), (p, out.ptr_mut(), chunks, n, format::F32, chunks))
    }
}

/// How [`column_sums`] cuts m rows of n columns: `(chunks, rows per chunk)`, enough blocks of 32
/// columns by one chunk to fill about 264 (two per SM of an H100 or H200) with chunks of at least
/// 64 rows; one chunk when the columns alone give that many blocks or m is small.
pub fn column_sum_chunks(m: u32, n: u32) -> (u32, u32) {
    let col_blocks = n.div_ceil(32).max(1);
    let chunks = 264u32.div_ceil(col_blocks).min(m.div_ceil(64)).max(1);
    let rows = m.div_ceil(chunks).max(1);
    // every chunk non-empty
    (m.div_ceil(rows).max(1), rows)
}

/// The epilogue of a split product's parts: none (the reduction applies the real one).
const ACT_NONE_EPILOGUE: kiln_gpu::kernels::gemm_wgmma::Epilogue = kiln_gpu::kernels::gemm_wgmma::Epilogue::NONE;

/// Clusters of the persistent wgmma kernel resident at once on `dev`.
fn resident_clusters(dev: &Device) -> Result<u32> {
    use kiln_gpu::kernels::gemm_wgmma::{GemmWgmmaBf16Persistent, WG_THREADS, WP_SMEM_BYTES};
    let resident = dev.max_active_clusters::<GemmWgmmaBf16Persistent>(WG_THREADS, WP_SMEM_BYTES)?;
    if resident == 0 {
        return Err(Error::Unsupported {
            op: "wgmma gemm",
            what: "no cluster of two 384-thread blocks with 225 KiB of shared memory fits this device".into(),
        });
    }
    Ok(resident)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_gpu::kernels::gemm_wgmma::{
        WG_TILE_BYTES, WP_B_SHARE_BYTES, WW_STAGE_BYTES, persistent_stage_bytes, tma_store_fits,
    };
    use kiln_gpu::kernels::gemm_wgmma_fused::{
        FusedEpilogue, MN_BOX_BYTES, format, fused_stage_bytes, layout, mn_descriptor, staged_box_cols,
        staged_store_fits,
    };

    #[test]
    fn mn_descriptor_is_the_megakernels_verified_one() {
        // the megakernel reads its MN-major pages (boxes of 64 k rows by 64 columns) with this
        // descriptor on the GPU; the fused kernel's boxes are the same
        for page in [0u32, 1024, 16384, 65536 + 8192] {
            for kk in 0..4 {
                assert_eq!(mn_descriptor(page, kk), kiln_gpu::kernels::megakernel_tc::mn_page_descriptor(page, kk));
            }
        }
    }

    #[test]
    fn fused_stage_bytes_count_the_boxes_loaded() {
        let s = |m, n| GemmShape { m, n, k: 64 };
        // A B^T: the persistent kernel's count
        for (m0, n0, sh) in
            [(0, 0, s(1000, 1000)), (128, 0, s(130, 300)), (256, 256, s(200, 300)), (0, 256, s(10, 300))]
        {
            assert_eq!(fused_stage_bytes(m0, n0, sh, layout::ABT), persistent_stage_bytes(m0, n0, sh));
        }
        assert_eq!(fused_stage_bytes(0, 0, s(1000, 1000), layout::ATB), WW_STAGE_BYTES);
        assert_eq!(fused_stage_bytes(0, 0, s(1000, 1000), layout::AB), WW_STAGE_BYTES);
        // MN-major A: 64-row boxes; one in, one out
        assert_eq!(fused_stage_bytes(0, 0, s(64, 1000), layout::ATB), MN_BOX_BYTES + 2 * WP_B_SHARE_BYTES);
        assert_eq!(fused_stage_bytes(0, 0, s(65, 1000), layout::ATB), WW_STAGE_BYTES);
        // K-major A, MN-major B: 64-column boxes of B (n = 65: two boxes of the first share)
        assert_eq!(fused_stage_bytes(0, 0, s(1, 65), layout::AB), WG_TILE_BYTES + 2 * MN_BOX_BYTES);
        assert_eq!(fused_stage_bytes(0, 0, s(1, 192), layout::AB), WG_TILE_BYTES + 3 * MN_BOX_BYTES);
        assert_eq!(fused_stage_bytes(0, 256, s(1, 300), layout::AB), WG_TILE_BYTES + MN_BOX_BYTES);
        // a tile wholly below A loads only B
        assert_eq!(fused_stage_bytes(128, 0, s(100, 256), layout::ATB), 2 * WP_B_SHARE_BYTES);
        assert_eq!(MN_BOX_BYTES * 2, WG_TILE_BYTES);
    }

    #[test]
    fn engine_split_k_splits_few_tiles_of_long_k_only() {
        use kiln_gpu::kernels::gemm_wgmma::{choose_split_k, split_k_fits, split_k_range};
        let tiles = |m: u32, n: u32| m.div_ceil(256) * n.div_ceil(256);
        // the GPT char-mini weight gradients (k = 16384 rows: 256 k tiles) on an H100/H200's 66 clusters
        assert_eq!(engine_split_k(tiles(384, 384), 256, 66), 16);
        for (m, n) in [(384, 384), (1536, 384), (384, 1536), (1152, 384)] {
            let s = engine_split_k(tiles(m, n), 256, 66);
            assert!(s > 1 && tiles(m, n) * s <= 66, "{m} x {n}: {s}");
        }
        // many tiles: no split (tiles x 2 above the clusters)
        assert_eq!(engine_split_k(tiles(16384, 384), 6, 66), 1);
        assert_eq!(engine_split_k(34, 256, 66), 1);
        // short k: no split, or one with parts of at least 4 k tiles
        assert_eq!(engine_split_k(4, 4, 66), 1);
        assert_eq!(engine_split_k(4, 7, 66), 1);
        assert_eq!(engine_split_k(4, 8, 66), 1); // choose_split_k: a split costs more than it saves
        assert_eq!(choose_split_k(4, 48, 66), 16);
        assert_eq!(engine_split_k(4, 48, 66), 12); // lowered to parts of 4 k tiles
        assert_eq!(engine_split_k(4, 64, 66), 16);
        for tiles in 1..40u32 {
            for k_tiles in 1..300u32 {
                let s = engine_split_k(tiles, k_tiles, 66);
                assert!(s >= 1 && s <= choose_split_k(tiles, k_tiles, 66).max(1));
                assert!(split_k_fits(k_tiles, s), "{tiles} tiles, {k_tiles}: {s}");
                if s > 1 {
                    assert!(k_tiles >= 4 * s && tiles * 2 <= 66);
                    // the parts cover the k tiles in order, each non-empty
                    let mut next = 0;
                    for p in 0..s {
                        let (first, count) = split_k_range(k_tiles, s, p);
                        assert!(first == next && count > 0);
                        next += count;
                    }
                    assert_eq!(next, k_tiles);
                }
            }
        }
        // no resident clusters reported: no split
        assert_eq!(engine_split_k(4, 256, 0), 1);
    }

    #[test]
    fn column_sum_chunks_cover_the_rows() {
        for (m, n) in [(1u32, 1u32), (0, 5), (63, 1000), (4096, 1024), (4097, 33), (100_000, 8), (300, 264)] {
            let (chunks, rows) = column_sum_chunks(m, n);
            assert!(chunks >= 1 && rows >= 1);
            assert!(chunks as u64 * rows as u64 >= m as u64, "{m} x {n}: {chunks} x {rows}");
            assert!(((chunks - 1) * rows) < m.max(1), "{m} x {n}: an empty chunk");
        }
        assert_eq!(column_sum_chunks(4096, 1024), (9, 456));
        assert_eq!(column_sum_chunks(40, 8192).0, 1);
    }

    #[test]
    fn layouts_and_staged_stores() {
        assert!(!layout::a_mn(layout::ABT) && !layout::b_mn(layout::ABT));
        assert!(!layout::a_mn(layout::AB) && layout::b_mn(layout::AB));
        assert!(layout::a_mn(layout::ATB) && layout::b_mn(layout::ATB));
        let s = GemmShape { m: 3, n: 5, k: 7 };
        assert_eq!(WgmmaLayout::ABt.pitches(s), (7, 7));
        assert_eq!(WgmmaLayout::AB.pitches(s), (7, 5));
        assert_eq!(WgmmaLayout::AtB.pitches(s), (3, 5));
        // 16-byte rows: 4 f32 or 8 16-bit elements; the f32 rule is the persistent kernel's
        for n in 1..40 {
            assert_eq!(staged_store_fits(n, format::F32, 256), tma_store_fits(n, 256));
            assert_eq!(staged_store_fits(n, format::BF16, 256), n % 8 == 0);
            assert_eq!(staged_store_fits(n, format::F16, 256), n % 8 == 0);
        }
        assert!(!staged_store_fits(64, format::BF16, 264));
        assert_eq!(staged_box_cols(format::F32), kiln_gpu::kernels::gemm_wgmma::WP_EPI_COLS);
        assert_eq!(staged_box_cols(format::BF16), 64);
        assert_eq!(FusedEpilogue::elem_bytes(format::F16), 2);
        assert_eq!(<f32 as GemmOutput>::FORMAT, format::F32);
        assert_eq!(<half::bf16 as GemmOutput>::FORMAT, format::BF16);
        assert_eq!(<half::f16 as GemmOutput>::FORMAT, format::F16);
        // the kernel parameter has the same layout on both sides: 3 pointers, 6 u32
        assert_eq!(std::mem::size_of::<FusedEpilogue>(), 48);
    }
}
