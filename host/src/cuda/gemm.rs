//! The FP32 GEMM ladder on the host: one table row per rung (kernel, block, tile, shared memory,
//! alignment), one launcher for all, and a chooser.

use super::{Device, DeviceBuffer, LaunchConfig};
use crate::error::{Error, Result};
use kiln_gpu::kernels::mma_tile::GemmShape;
use kiln_gpu::kernels::sgemm as k;
use kiln_gpu::{DevicePtr, DevicePtrMut, Kernel};

type SgemmArgs = (DevicePtr<f32>, DevicePtr<f32>, DevicePtrMut<f32>, GemmShape);
type Launch = unsafe fn(&Device, LaunchConfig, SgemmArgs) -> Result<()>;

unsafe fn launch<K: Kernel<Args = SgemmArgs>>(dev: &Device, cfg: LaunchConfig, args: SgemmArgs) -> Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe { dev.launch(K::default(), cfg, args) }
}

/// The kernels index in u32: every operand must hold fewer than 2^31 elements.
pub const MAX_OPERAND_ELEMENTS: usize = (1 << 31) - 1;

/// Checks that a (m x k), b (k x n or n x k: both k * n elements) and c (m x n) fit `s`.
fn check_operands(op: &'static str, a: usize, b: usize, c: usize, s: GemmShape) -> Result<()> {
    let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
    if a != m * k || b != k * n || c != m * n {
        return Err(Error::shape(
            op,
            format!("{m}x{n}x{k} needs a: {}, b: {}, c: {}; got {a}, {b}, {c}", m * k, k * n, m * n),
        ));
    }
    if [m * k, k * n, m * n].iter().any(|&x| x > MAX_OPERAND_ELEMENTS) {
        return Err(Error::Unsupported {
            op,
            what: format!(
                "{m}x{n}x{k}: an operand over {MAX_OPERAND_ELEMENTS} elements (the kernels index in 32 bits); split the product"
            ),
        });
    }
    Ok(())
}

/// 16-byte loads (`cp.async`, vector loads) need 16-byte-aligned operands.
fn check_aligned(op: &'static str, addrs: &[u64]) -> Result<()> {
    if let Some(a) = addrs.iter().find(|a| *a % 16 != 0) {
        return Err(Error::Unsupported {
            op,
            what: format!("an operand at {a:#x}: 16-byte loads need 16-byte-aligned buffers"),
        });
    }
    Ok(())
}

/// Grid y is limited to 65535 blocks.
fn check_grid(op: &'static str, cfg: &LaunchConfig) -> Result<()> {
    if cfg.grid_dim.1 > 65535 {
        return Err(Error::Unsupported {
            op,
            what: format!("a grid of {} blocks in y (at most 65535): split the product", cfg.grid_dim.1),
        });
    }
    Ok(())
}

/// How a rung maps threads to C.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mapping {
    /// A (32, 32) block, x along rows of C (rung 1, uncoalesced on purpose).
    RowsX,
    /// A 1-D block over a `tile_m x tile_n` tile of C, blocks along x over columns.
    Tiled,
}

/// How a product's operands are stored (row-major): `C = op(A) op(B)` with `C` m x n.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `C = A B`: A m x k, B k x n.
    NN,
    /// `C = A B^T`: A m x k, B stored n x k (`Y = X W^T`).
    NT,
    /// `C = A^T B`: A stored k x m, B k x n (`dW = dY^T X`).
    TN,
}

impl Layout {
    /// Whether the layout's rungs take `s`: 16-byte loads of every stored row and 16-byte stores
    /// of C (the innermost dimension of each stored operand, and n, a multiple of 4), and k a
    /// multiple of 4 as their NN twins need (the rungs are those twins with other loaders, so a TN
    /// product with k = 6 has no rung even though its stored rows are aligned).
    pub fn rows_aligned(self, s: GemmShape) -> bool {
        let inner_a = if self == Layout::TN { s.m } else { s.k };
        let inner_b = if self == Layout::NT { s.k } else { s.n };
        inner_a.is_multiple_of(4) && inner_b.is_multiple_of(4) && s.n.is_multiple_of(4) && s.k.is_multiple_of(4)
    }
}

/// One rung of the ladder.
#[derive(Clone, Copy, Debug)]
pub struct Rung {
    /// Name (also the kernel's name).
    pub name: &'static str,
    /// The rung's number in the guide (1..=7).
    pub level: u32,
    /// Rows of C per block.
    pub tile_m: u32,
    /// Columns of C per block.
    pub tile_n: u32,
    /// Threads per block.
    pub threads: u32,
    /// Dynamic shared memory per block, bytes.
    pub smem: u32,
    /// Needs `k % 4 == 0` and `n % 4 == 0` (16-byte loads).
    pub vec4: bool,
    /// Thread mapping.
    pub mapping: Mapping,
    /// How it reads its operands.
    pub layout: Layout,
    launch: Launch,
}

macro_rules! rung {
    ($K:ty, $level:expr, $tm:expr, $tn:expr, $threads:expr, $smem:expr, $vec4:expr, $map:ident) => {
        rung!($K, $level, $tm, $tn, $threads, $smem, $vec4, $map, NN)
    };
    ($K:ty, $level:expr, $tm:expr, $tn:expr, $threads:expr, $smem:expr, $vec4:expr, $map:ident, $layout:ident) => {
        Rung {
            name: <$K as Kernel>::NAME,
            level: $level,
            tile_m: $tm,
            tile_n: $tn,
            threads: $threads,
            smem: $smem,
            vec4: $vec4,
            mapping: Mapping::$map,
            layout: Layout::$layout,
            launch: launch::<$K>,
        }
    };
}

/// Every rung, in ladder order.
pub const RUNGS: &[Rung] = &[
    rung!(k::SgemmNaive, 1, 32, 32, 1024, 0, false, RowsX),
    rung!(k::SgemmCoalesced, 2, 32, 32, 1024, 0, false, Tiled),
    rung!(k::SgemmSmem, 3, 32, 32, 1024, 2 * 32 * 32 * 4, false, Tiled),
    rung!(k::SgemmTile1d64x64x88, 4, 64, 64, 512, (64 * 8 + 8 * 64) * 4, false, Tiled),
    rung!(k::SgemmTile2d64x64x84x4, 5, 64, 64, 256, (64 * 8 + 8 * 64) * 4, false, Tiled),
    rung!(k::SgemmTile2d128x128x88x8, 5, 128, 128, 256, (128 * 8 + 8 * 128) * 4, false, Tiled),
    rung!(k::SgemmVec128x128x88x8, 6, 128, 128, 256, (128 * 8 + 8 * 128) * 4, true, Tiled),
    rung!(k::SgemmVec128x128x168x8, 6, 128, 128, 256, (128 * 16 + 16 * 128) * 4, true, Tiled),
    rung!(k::SgemmWarptile128x128x16, 7, 128, 128, 128, (128 * 16 + 16 * 128) * 4, true, Tiled),
    rung!(k::SgemmWarptile128x128x88x8Db, 7, 128, 128, 256, k::warptile_db_smem(128, 128, 8), true, Tiled),
    rung!(k::SgemmWarptile128x128x168x8Db, 7, 128, 128, 256, k::warptile_db_smem(128, 128, 16), true, Tiled),
    rung!(k::SgemmWarptile128x256x88x16Db, 7, 128, 256, 256, k::warptile_db_smem(128, 256, 8), true, Tiled),
    rung!(k::SgemmWarptile256x128x816x8Db, 7, 256, 128, 256, k::warptile_db_smem(256, 128, 8), true, Tiled),
    rung!(k::SgemmWarptile64x128x84x8Db, 7, 64, 128, 256, k::warptile_db_smem(64, 128, 8), true, Tiled),
];

/// The tuned rungs again, reading a transposed operand in place (`Layout::NT`, `Layout::TN`): the
/// products of a linear layer's forward and backward passes without transposed copies. Each
/// computes the same chains as its NN twin, bit for bit.
pub const LAYOUT_RUNGS: &[Rung] = &[
    rung!(k::SgemmWarptile128x256x88x16DbNt, 7, 128, 256, 256, k::warptile_db_smem(128, 256, 8), true, Tiled, NT),
    rung!(k::SgemmWarptile128x256x88x16DbTn, 7, 128, 256, 256, k::warptile_db_smem(128, 256, 8), true, Tiled, TN),
    rung!(k::SgemmWarptile64x128x84x8DbNt, 7, 64, 128, 256, k::warptile_db_smem(64, 128, 8), true, Tiled, NT),
    rung!(k::SgemmWarptile64x128x84x8DbTn, 7, 64, 128, 256, k::warptile_db_smem(64, 128, 8), true, Tiled, TN),
];

/// The rung named `name` (either table).
pub fn rung(name: &str) -> Result<&'static Rung> {
    RUNGS.iter().chain(LAYOUT_RUNGS).find(|r| r.name == name).ok_or_else(|| Error::Unsupported {
        op: "sgemm",
        what: format!(
            "kernel `{name}`; known: {}",
            RUNGS.iter().chain(LAYOUT_RUNGS).map(|r| r.name).collect::<Vec<_>>().join(", ")
        ),
    })
}

/// Size classes of the FP32 chooser: how many 128 x 128 tiles C has, against the H200's 132 SMs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SizeClass {
    /// Fewer than 66 tiles: under half a wave of 128 x 128 tiles.
    Small,
    /// 66 to 131 tiles.
    Medium,
    /// 132 to 527 tiles: one to four waves.
    Large,
    /// 528 tiles and more.
    Huge,
}

impl SizeClass {
    /// Every class, smallest first.
    pub const ALL: [SizeClass; 4] = [SizeClass::Small, SizeClass::Medium, SizeClass::Large, SizeClass::Huge];

    /// The class of `s`.
    pub fn of(s: GemmShape) -> SizeClass {
        let tiles = s.m.div_ceil(128) as u64 * s.n.div_ceil(128) as u64;
        match tiles {
            0..66 => SizeClass::Small,
            66..132 => SizeClass::Medium,
            132..528 => SizeClass::Large,
            _ => SizeClass::Huge,
        }
    }

    /// The shapes (m, n, k, all multiples of 4) the tuning run measures for this class: squares,
    /// and the tall, wide and long-k products of linear layers.
    pub const fn shapes(self) -> &'static [(u32, u32, u32)] {
        match self {
            SizeClass::Small => &[(1024, 1024, 1024), (512, 1024, 4096), (4096, 256, 1024)],
            SizeClass::Medium => &[(1280, 1280, 1280), (1024, 2048, 2048), (4096, 384, 2048)],
            SizeClass::Large => &[(2048, 2048, 2048), (4096, 1024, 4096), (1024, 4096, 1024)],
            SizeClass::Huge => &[(4096, 4096, 4096), (8192, 2048, 2048), (2048, 8192, 1024)],
        }
    }
}

/// The rungs the tuning run compares for a layout and alignment: every NN rung from level 4 up
/// that takes the alignment (16-byte rows or not), or every layout rung of NT or TN (aligned only).
pub fn tuning_candidates(layout: Layout, aligned: bool) -> Vec<&'static Rung> {
    match layout {
        Layout::NN => RUNGS.iter().filter(|r| r.level >= 4 && r.vec4 == aligned).collect(),
        _ if !aligned => Vec::new(),
        _ => LAYOUT_RUNGS.iter().filter(|r| r.layout == layout).collect(),
    }
}

/// The tuning run's pick among candidates from their times: for each candidate, the sum over the
/// class's shapes of its time over the fastest candidate's time on that shape; the smallest sum
/// wins (ties: the first candidate). `times[c][s]` is candidate `c`'s milliseconds on shape `s`.
pub fn tuning_pick(times: &[Vec<f64>]) -> Option<usize> {
    let shapes = times.first()?.len();
    let best: Vec<f64> = (0..shapes).map(|s| times.iter().map(|t| t[s]).fold(f64::INFINITY, f64::min)).collect();
    let score = |t: &Vec<f64>| t.iter().zip(&best).map(|(x, b)| x / b).sum::<f64>();
    (0..times.len()).min_by(|&a, &b| score(&times[a]).total_cmp(&score(&times[b])))
}

/// The rung for `s` in `layout`, from the tuned table ([`super::gemm_tuned::TUNED`]). `None` for
/// NT and TN products whose stored rows are not 16-byte multiples (no scalar kernel reads them in
/// place; transpose one operand and use [`choose`]).
pub fn choose_layout(s: GemmShape, layout: Layout) -> Option<&'static Rung> {
    let aligned = match layout {
        Layout::NN => s.k.is_multiple_of(4) && s.n.is_multiple_of(4),
        _ => layout.rows_aligned(s),
    };
    if layout != Layout::NN && !aligned {
        return None;
    }
    let class = SizeClass::of(s);
    let name = super::gemm_tuned::TUNED
        .iter()
        .find(|t| t.0 == layout && t.1 == aligned && t.2 == class)
        .map(|t| t.3)
        .expect("the tuned table has a row for every layout, alignment and class");
    Some(rung(name).expect("the tuned table names rungs of the tables"))
}

/// The NN rung for `s`: the tuned table's pick for its alignment (16-byte rows: `k` and `n`
/// multiples of 4) and size class ([`SizeClass`]); see [`super::gemm_tuned`] for where the table
/// comes from.
pub fn choose(s: GemmShape) -> &'static Rung {
    choose_layout(s, Layout::NN).expect("every NN shape has a rung")
}

impl Rung {
    /// The launch configuration for `s`.
    pub fn config(&self, s: GemmShape) -> LaunchConfig {
        let (gm, gn) = (s.m.div_ceil(self.tile_m), s.n.div_ceil(self.tile_n));
        match self.mapping {
            Mapping::RowsX => LaunchConfig { grid_dim: (gm, gn, 1), block_dim: (32, 32, 1), shared_mem_bytes: 0 },
            Mapping::Tiled => {
                LaunchConfig { grid_dim: (gn, gm, 1), block_dim: (self.threads, 1, 1), shared_mem_bytes: self.smem }
            }
        }
    }

    /// `c = op(a) op(b)` with this rung in its [`Layout`]: `a` m x k (NN, NT) or k x m (TN), `b`
    /// k x n (NN, TN) or n x k (NT), `c` m x n, row-major and dense.
    pub fn run(
        &self,
        dev: &Device,
        a: &DeviceBuffer<f32>,
        b: &DeviceBuffer<f32>,
        c: &mut DeviceBuffer<f32>,
        s: GemmShape,
    ) -> Result<()> {
        let (m, n, kk) = (s.m as usize, s.n as usize, s.k as usize);
        check_operands("sgemm", a.len(), b.len(), c.len(), s)?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        if self.vec4 && !self.layout.rows_aligned(s) {
            return Err(Error::Unsupported {
                op: "sgemm",
                what: format!(
                    "{} ({:?}) with m = {m}, n = {n}, k = {kk}: it loads 16-byte rows, so each stored operand's \
                     row length and n must be multiples of 4",
                    self.name, self.layout
                ),
            });
        }
        if self.vec4 {
            // the `_db` rungs also store C in 16-byte vectors
            check_aligned("sgemm", &[a.addr(), b.addr(), c.addr()])?;
        }
        if kk == 0 {
            // an empty sum (c holds exactly m n elements), and the tuned rungs' unchecked body
            // must not run
            return dev.zero(c);
        }
        let cfg = self.config(s);
        check_grid("sgemm", &cfg)?;
        // SAFETY: the sizes are checked above (k > 0); the kernel masks the edges.
        unsafe { (self.launch)(dev, cfg, (a.ptr(), b.ptr(), c.ptr_mut(), s)) }
    }
}

/// `c = a b` with the chosen rung.
pub fn sgemm(
    dev: &Device,
    a: &DeviceBuffer<f32>,
    b: &DeviceBuffer<f32>,
    c: &mut DeviceBuffer<f32>,
    s: GemmShape,
) -> Result<()> {
    choose(s).run(dev, a, b, c, s)
}

/// `c = op(a) op(b)` in `layout` with the chosen rung; NT and TN products with unaligned rows are
/// refused (see [`choose_layout`]).
pub fn sgemm_layout(
    dev: &Device,
    a: &DeviceBuffer<f32>,
    b: &DeviceBuffer<f32>,
    c: &mut DeviceBuffer<f32>,
    s: GemmShape,
    layout: Layout,
) -> Result<()> {
    let r = choose_layout(s, layout).ok_or_else(|| Error::Unsupported {
        op: "sgemm",
        what: format!(
            "{layout:?} {}x{}x{}: in-place transposed reads need 16-byte rows (m, n, k multiples of 4 as the layout \
             stores them); transpose the operand and multiply NN",
            s.m, s.n, s.k
        ),
    })?;
    r.run(dev, a, b, c, s)
}

/// `c = op(a) op(b)` for f32 operands on the tensor cores, in bf16 with f32 accumulation (the
/// [`MatmulPrecision::Bf16`](super::MatmulPrecision::Bf16) of f32 tensors): each operand is packed
/// once by `pack_bf16` into the k-major rows the tensor-core kernels read (rounded nearest-even,
/// transposed where `layout` stores it the other way, each row zero-padded to a multiple of 8), then
/// multiplied by the persistent `wgmma` kernel on sm_90a and by `mma.sync` ([`hgemm`]) elsewhere
/// ([`TensorCores::Best`]; [`gemm_bf16_on`] chooses). Any m, n and k; `a`, `b` and `c` hold `m k`,
/// `k n` and `m n` f32 values stored as `layout` says. The padding adds zero products, so each output is the tensor-core
/// kernel's sum over the rounded inputs: reproducible, and row i depends only on row i of `op(a)`.
pub fn gemm_bf16(
    dev: &Device,
    a: &DeviceBuffer<f32>,
    b: &DeviceBuffer<f32>,
    c: &mut DeviceBuffer<f32>,
    s: GemmShape,
    layout: Layout,
) -> Result<()> {
    gemm_bf16_on(dev, TensorCores::Best, a, b, c, s, layout)
}

/// Whether [`TensorCores::Best`] may pick [`gemm_tcgen05`] on compute capability 10.x. False until
/// that kernel has passed its GPU test (`gemm_tcgen05_bf16_sm100`) on a Blackwell GPU, which kiln's
/// developers have not had: until then a Blackwell GPU runs the bf16 path on `mma.sync`, and the
/// `tcgen05` kernel only when asked for by name ([`TensorCores::Tcgen05`], `kiln gemm --kernel
/// gemm_tcgen05_bf16`).
pub const TCGEN05_VERIFIED: bool = false;

/// Which tensor-core kernel [`gemm_bf16_on`] multiplies the packed operands with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorCores {
    /// The fastest verified kernel this device has: the persistent `wgmma` kernel on sm_90a,
    /// `tcgen05` on 10.x once [`TCGEN05_VERIFIED`], `mma.sync` otherwise (what [`gemm_bf16`] uses).
    Best,
    /// `mma.sync` ([`hgemm`]), on every supported GPU.
    MmaSync,
    /// The persistent `wgmma` kernel (sm_90a).
    Wgmma,
    /// [`gemm_tcgen05`] (compute capability 10.x).
    Tcgen05,
}

/// [`gemm_bf16`] with the tensor-core kernel chosen (a kernel the device lacks is
/// [`Error::KernelUnavailable`]): so that each path can be tested on one GPU.
pub fn gemm_bf16_on(
    dev: &Device,
    cores: TensorCores,
    a: &DeviceBuffer<f32>,
    b: &DeviceBuffer<f32>,
    c: &mut DeviceBuffer<f32>,
    s: GemmShape,
    layout: Layout,
) -> Result<()> {
    use kiln_gpu::kernels::convert::{PACK_K_MULTIPLE, PACK_ROWS, PACK_TILE_COLS, PACK_TILE_ROWS, PackBf16};
    let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
    check_operands("bf16 gemm", a.len(), b.len(), c.len(), s)?;
    if m * n == 0 {
        return Ok(());
    }
    if k == 0 {
        return dev.zero(c); // an empty sum
    }
    let kp = s.k.next_multiple_of(PACK_K_MULTIPLE);
    let packed = GemmShape { k: kp, ..s };
    check_operands("bf16 gemm", m * kp as usize, kp as usize * n, m * n, packed)?;
    // (source rows, source columns, transposed) of each operand, read as op(x) = x or x^T
    let (a_src, b_src) = match layout {
        Layout::NN => ((s.m, s.k, false), (s.k, s.n, true)),
        Layout::NT => ((s.m, s.k, false), (s.n, s.k, false)),
        Layout::TN => ((s.k, s.m, true), (s.k, s.n, true)),
    };
    let pack = |src: &DeviceBuffer<f32>, (rows, cols, t): (u32, u32, bool)| -> Result<DeviceBuffer<half::bf16>> {
        let out_rows = if t { cols } else { rows };
        let dst = dev.alloc_uninit_bf16(out_rows as usize * kp as usize)?;
        // row tiles in slices the grid's y dimension can hold
        let (row_tiles, mut first) = (out_rows.div_ceil(PACK_TILE_ROWS), 0u32);
        while first < row_tiles {
            let slice = (row_tiles - first).min(65535);
            let cfg = LaunchConfig {
                grid_dim: (kp.div_ceil(PACK_TILE_COLS), slice, 1),
                block_dim: (32, PACK_ROWS, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: src holds rows x cols f32 (check_operands); dst out_rows x kp 16-bit values
            // (written as pairs: kp is even, allocations 256-byte aligned), and kp is at least the
            // packed rows' live length (cols, or rows when transposed, is k); the kernel masks rows
            // past out_rows.
            unsafe {
                let out = kiln_gpu::DevicePtrMut::<u32>::from_addr(dst.addr());
                dev.launch(PackBf16, cfg, (src.ptr(), out, rows, cols, kp, t as u32, first))?;
            }
            first += slice;
        }
        Ok(dst)
    };
    use kiln_gpu::kernels::{gemm_tcgen05::GemmTcgen05Bf16, gemm_wgmma::GemmWgmmaBf16Persistent};
    let (tcgen05, wgmma) = (dev.supports::<GemmTcgen05Bf16>(), dev.supports::<GemmWgmmaBf16Persistent>());
    let cores = match cores {
        TensorCores::Best if tcgen05 && TCGEN05_VERIFIED => TensorCores::Tcgen05,
        TensorCores::Best if wgmma => TensorCores::Wgmma,
        TensorCores::Best => TensorCores::MmaSync,
        chosen => chosen,
    };
    // a kernel this device lacks is refused before any packing
    match cores {
        TensorCores::Tcgen05 => dev.require::<GemmTcgen05Bf16>()?,
        TensorCores::Wgmma => dev.require::<GemmWgmmaBf16Persistent>()?,
        _ => {}
    }
    let (a16, b16) = (pack(a, a_src)?, pack(b, b_src)?);
    match cores {
        TensorCores::Tcgen05 => gemm_tcgen05(dev, &a16, &b16, c, packed),
        TensorCores::Wgmma => WgmmaGemm::new(dev, &a16, &b16, packed)?.run(c),
        _ => hgemm(dev, &a16, &b16, c, packed),
    }
}

/// The tensor map of a K-major bf16 operand of the TMA-fed kernels (`wgmma`, `tcgen05`, the
/// TMA-fed `mma.sync`): `rows` rows of `k`, boxes of `box_rows` rows by one 64-wide k tile, 128-byte
/// swizzle.
fn operand_spec(rows: u32, k: u32, box_rows: u32) -> super::TensorMapSpec {
    use kiln_gpu::kernels::gemm_wgmma::{WG_BK, WG_SWIZZLE};
    super::TensorMapSpec {
        dtype: super::TmaDtype::Bf16,
        rows: rows as u64,
        cols: k as u64,
        row_pitch: k as u64,
        box_rows,
        box_cols: WG_BK,
        swizzle: WG_SWIZZLE,
    }
}

/// `c = a b^T` on Blackwell's tensor cores (`gemm_tcgen05_bf16`: TMA ring, one thread issuing
/// `tcgen05.mma` into tensor memory, an epilogue warpgroup reading it back; persistent, one block
/// per SM): `a` m x k, `b` n x k bf16, `c` m x n f32, `k % 8 == 0`. Only on compute capability
/// 10.x (the sm_100a module); elsewhere [`Error::KernelUnavailable`]. No Blackwell GPU has run it
/// yet: it is assembled by ptxas for sm_100a and its encodings are host-tested.
pub fn gemm_tcgen05(
    dev: &Device,
    a: &DeviceBuffer<half::bf16>,
    b: &DeviceBuffer<half::bf16>,
    c: &mut DeviceBuffer<f32>,
    s: GemmShape,
) -> Result<()> {
    use kiln_gpu::kernels::gemm_tcgen05::{GemmTcgen05Bf16, TC_BM, TC_BN, TC_SMEM_BYTES, TC_THREADS};
    check_operands("tcgen05 gemm", a.len(), b.len(), c.len(), s)?;
    if s.m == 0 || s.n == 0 || s.k == 0 {
        return Err(Error::shape("tcgen05 gemm", format!("empty product {}x{}x{}", s.m, s.n, s.k)));
    }
    if !s.k.is_multiple_of(8) {
        return Err(Error::Unsupported {
            op: "tcgen05 gemm",
            what: format!("k = {}: TMA needs 16-byte row pitches, so k must be a multiple of 8", s.k),
        });
    }
    check_aligned("tcgen05 gemm", &[c.addr()])?;
    let a_map = dev.tensor_map_cached(a.addr(), &operand_spec(s.m, s.k, TC_BM))?;
    let b_map = dev.tensor_map_cached(b.addr(), &operand_spec(s.n, s.k, TC_BN))?;
    let tiles = s.m.div_ceil(TC_BM) as u64 * s.n.div_ceil(TC_BN) as u64;
    let blocks = tiles.min(dev.sm_count()? as u64) as u32;
    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (TC_THREADS, 1, 1), shared_mem_bytes: TC_SMEM_BYTES };
    // SAFETY: the maps describe the borrowed operands with the kernel's boxes (A 128 rows, B 256);
    // c holds m n f32 (checked), 16-byte aligned; stores are masked at m and n.
    unsafe { dev.launch(GemmTcgen05Bf16, cfg, (a_map.ptr(), b_map.ptr(), c.ptr_mut(), s)) }
}

/// Input types of the `mma.sync` tensor-core GEMM: one table row each, with the kernel of each
/// block tile.
pub trait HgemmInput: cudarc::driver::DeviceRepr + Copy + 'static {
    /// The kernel for [`HGEMM_NARROW`](kiln_gpu::kernels::hgemm_mma::HGEMM_NARROW).
    type Narrow: Kernel<Args = HgemmArgs<Self>>;
    /// The kernel for [`HGEMM_WIDE`](kiln_gpu::kernels::hgemm_mma::HGEMM_WIDE).
    type Wide: Kernel<Args = HgemmArgs<Self>>;
}
/// The `mma.sync` kernels' arguments.
pub type HgemmArgs<T> = (DevicePtr<T>, DevicePtr<T>, DevicePtrMut<f32>, GemmShape);
impl HgemmInput for half::bf16 {
    type Narrow = kiln_gpu::kernels::hgemm_mma::HgemmMmaBf16;
    type Wide = kiln_gpu::kernels::hgemm_mma::HgemmMmaBf16Wide;
}
impl HgemmInput for half::f16 {
    type Narrow = kiln_gpu::kernels::hgemm_mma::HgemmMmaF16;
    type Wide = kiln_gpu::kernels::hgemm_mma::HgemmMmaF16Wide;
}

/// The `mma.sync` block tile for `s` on a device of `sms` SMs whose blocks may use `max_smem` bytes
/// of shared memory: the wide tile where it fits and makes at least one block per SM, the narrow
/// one otherwise (where the wide tile would leave SMs idle, or on an sm_80 part without 192 KiB per
/// block).
pub fn hgemm_tile_for(s: GemmShape, max_smem: u32, sms: u32) -> kiln_gpu::kernels::hgemm_mma::HgemmTile {
    use kiln_gpu::kernels::hgemm_mma::{HGEMM_NARROW, HGEMM_WIDE};
    if HGEMM_WIDE.blocks(s) >= sms as u64 && HGEMM_WIDE.smem_bytes() <= max_smem { HGEMM_WIDE } else { HGEMM_NARROW }
}

/// `c = a b^T` on the tensor cores (`mma.sync`, `cp.async` pipeline) with the tile
/// [`hgemm_tile_for`] picks: `a` m x k, `b` n x k (bf16 or f16), `c` m x n f32; `k % 8 == 0`.
pub fn hgemm<T: HgemmInput>(
    dev: &Device,
    a: &DeviceBuffer<T>,
    b: &DeviceBuffer<T>,
    c: &mut DeviceBuffer<f32>,
    s: GemmShape,
) -> Result<()> {
    use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as OPTIN;
    let max_smem = dev.attribute(OPTIN)?.max(0) as u32;
    hgemm_with_tile(dev, hgemm_tile_for(s, max_smem, dev.sm_count()? as u32), a, b, c, s)
}

/// As [`hgemm`], with the block tile given: [`HGEMM_NARROW`](kiln_gpu::kernels::hgemm_mma::HGEMM_NARROW)
/// or [`HGEMM_WIDE`](kiln_gpu::kernels::hgemm_mma::HGEMM_WIDE).
pub fn hgemm_with_tile<T: HgemmInput>(
    dev: &Device,
    tile: kiln_gpu::kernels::hgemm_mma::HgemmTile,
    a: &DeviceBuffer<T>,
    b: &DeviceBuffer<T>,
    c: &mut DeviceBuffer<f32>,
    s: GemmShape,
) -> Result<()> {
    use kiln_gpu::kernels::hgemm_mma::{HGEMM_NARROW, HGEMM_THREADS, HGEMM_WIDE};
    let (m, n, kk) = (s.m as usize, s.n as usize, s.k as usize);
    check_operands("hgemm", a.len(), b.len(), c.len(), s)?;
    if !s.k.is_multiple_of(8) {
        return Err(Error::Unsupported {
            op: "hgemm",
            what: format!("k = {kk}: rows are copied in 16-byte chunks, so k must be a multiple of 8"),
        });
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let blocks = u32::try_from(tile.blocks(s)).map_err(|_| {
        Error::shape("hgemm", format!("{} tiles exceed the 1-D grid; split the product", tile.blocks(s)))
    })?;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (HGEMM_THREADS, 1, 1),
        shared_mem_bytes: tile.smem_bytes(),
    };
    // `c` is written in 8-byte pairs where n is even
    check_aligned("hgemm", &[a.addr(), b.addr(), c.addr()])?;
    let args = (a.ptr(), b.ptr(), c.ptr_mut(), s);
    // SAFETY: sizes checked above; the kernels mask the edges and read `tile`'s shared memory.
    unsafe {
        match tile {
            HGEMM_NARROW => dev.launch(T::Narrow::default(), cfg, args),
            HGEMM_WIDE => dev.launch(T::Wide::default(), cfg, args),
            other => Err(Error::Unsupported {
                op: "hgemm",
                what: format!("the tile {other:?}: use HGEMM_NARROW or HGEMM_WIDE"),
            }),
        }
    }
}

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

/// What a GEMM's epilogue applies to each output: `c = act(a b^T + bias)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct GemmEpilogue<'a> {
    /// `n` biases, one per column of C.
    pub bias: Option<&'a DeviceBuffer<f32>>,
    /// The activation, after the bias.
    pub act: Option<crate::nn::Activation>,
}

/// A Hopper `wgmma` GEMM bound to its operands: `c = a b^T` with `a` (m x k) and `b` (n x k) bf16,
/// `c` (m x n) f32, `k % 8 == 0`. The tensor maps are encoded once; [`WgmmaGemm::run`] launches.
/// Needs the sm_90a module (compute capability 9.0); elsewhere the persistent tiles fail to build
/// (their occupancy is queried in `with_tile`) and `run` of the others returns
/// [`Error::KernelUnavailable`].
pub struct WgmmaGemm<'a> {
    dev: &'a Device,
    a_map: std::sync::Arc<super::DeviceTensorMap>,
    b_map: std::sync::Arc<super::DeviceTensorMap>,
    s: GemmShape,
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
    c_map: std::cell::RefCell<Option<std::sync::Arc<super::DeviceTensorMap>>>,
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
        check_operands("wgmma gemm", a.len(), b.len(), m * n, s)?;
        Self::build(dev, a, b, s, tile, kiln_gpu::kernels::gemm_wgmma::Batch::ONE, s.m, s.n)
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
        if [m * kk, n * kk, m * n].iter().any(|&x| x > MAX_OPERAND_ELEMENTS) {
            return Err(Error::Unsupported {
                op: "wgmma gemm",
                what: format!(
                    "{m}x{n}x{kk}: an operand over {MAX_OPERAND_ELEMENTS} elements (the kernels index in 32 bits); split the product"
                ),
            });
        }
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
        Self::build(dev, a, b, s, WgmmaTile::Persistent, spec, a_total, b_total)
    }

    /// Encodes the maps (A over `a_rows` stacked rows, B over `b_rows`) and sets the plan up.
    #[allow(clippy::too_many_arguments)]
    fn build(
        dev: &'a Device,
        a: &'a DeviceBuffer<half::bf16>,
        b: &'a DeviceBuffer<half::bf16>,
        s: GemmShape,
        tile: WgmmaTile,
        batch: kiln_gpu::kernels::gemm_wgmma::Batch,
        a_rows: u32,
        b_rows: u32,
    ) -> Result<Self> {
        use kiln_gpu::kernels::gemm_wgmma::{WG_BM, WG_BN, WW_BN};
        let (m, n, kk) = (s.m as usize, s.n as usize, s.k as usize);
        if m == 0 || n == 0 || kk == 0 {
            return Err(Error::shape("wgmma gemm", format!("empty product {m}x{n}x{kk}")));
        }
        if !s.k.is_multiple_of(8) {
            return Err(Error::Unsupported {
                op: "wgmma gemm",
                what: format!("k = {kk}: TMA needs 16-byte row pitches, so k must be a multiple of 8"),
            });
        }
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
            s,
            tile,
            clusters: 0,
            resident,
            splits: 1,
            workspace: std::cell::RefCell::new(None),
            batch,
            c_map: std::cell::RefCell::new(None),
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
        choose_split_k(self.cluster_tiles(), self.s.k.div_ceil(WG_BK), self.resident)
    }

    /// The persistent kernel's cluster tiles (256 x 256) for this shape.
    fn cluster_tiles(&self) -> u32 {
        use kiln_gpu::kernels::gemm_wgmma::{WP_BM, WW_BN};
        self.s.m.div_ceil(WP_BM) * self.s.n.div_ceil(WW_BN)
    }

    /// The same product with the persistent kernel's k cut into `splits` parts (1: none, the
    /// default), each a work unit; a fixed-order reduction then sums the parts and applies the
    /// epilogue. The bits stay reproducible for a given split, but differ from the unsplit
    /// product's (see [`WgmmaGemm::suggested_split_k`]). Needs a persistent tile and every part
    /// non-empty.
    pub fn with_split_k(mut self, splits: u32) -> Result<Self> {
        use kiln_gpu::kernels::gemm_wgmma::{WG_BK, split_k_fits};
        let k_tiles = self.s.k.div_ceil(WG_BK);
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
        if splits > 1 && (self.s.m as u64 * self.s.n as u64 * splits as u64) > isize::MAX as u64 / 4 {
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
        if !staged || self.batch.count > 1 || !tma_store_fits(self.s.n, c.addr()) {
            return Ok(0);
        }
        let spec = super::TensorMapSpec {
            dtype: super::TmaDtype::F32,
            rows: self.s.m as u64,
            cols: self.s.n as u64,
            row_pitch: self.s.n as u64,
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
        use kiln_gpu::kernels::gemm_wgmma::{
            ACT_NONE, Epilogue, GemmWgmmaBf16, GemmWgmmaBf16Persistent, GemmWgmmaBf16Wide, WG_BM, WG_BN, WG_SMEM_BYTES,
            WG_THREADS, WP_SMEM_BYTES, WW_BN, WW_SMEM_BYTES,
        };
        use kiln_gpu::kernels::tensor_ops::unary;
        let s = self.s;
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
            act: match epi.act {
                None => ACT_NONE,
                Some(crate::nn::Activation::Relu) => unary::RELU,
                Some(crate::nn::Activation::Gelu) => unary::GELU,
            },
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
                check_grid("wgmma gemm", &cfg)?;
                // SAFETY: the maps describe the borrowed operands; c is checked above; stores are masked.
                unsafe { self.dev.launch(GemmWgmmaBf16, cfg, args) }
            }
            WgmmaTile::T128x256 | WgmmaTile::MmaSyncTma => {
                use kiln_gpu::kernels::hgemm_mma::{HGEMM_TMA_THREADS, HgemmMmaBf16Tma};
                let tiles = s.m.div_ceil(WG_BM) as u64 * s.n.div_ceil(WW_BN) as u64;
                let blocks = u32::try_from(tiles).map_err(|_| {
                    Error::shape("wgmma gemm", format!("{tiles} tiles exceed the 1-D grid; split the product"))
                })?;
                let threads = if self.tile == WgmmaTile::MmaSyncTma { HGEMM_TMA_THREADS } else { WG_THREADS };
                let cfg = LaunchConfig {
                    grid_dim: (blocks, 1, 1),
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: WW_SMEM_BYTES,
                };
                check_grid("wgmma gemm", &cfg)?;
                // SAFETY: as above; both kernels read the B map with the 256-row box it was made with,
                // and the same 4-stage ring (WW_SMEM_BYTES).
                unsafe {
                    if self.tile == WgmmaTile::MmaSyncTma {
                        self.dev.launch(HgemmMmaBf16Tma, cfg, args)
                    } else {
                        self.dev.launch(GemmWgmmaBf16Wide, cfg, args)
                    }
                }
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
                    return unsafe {
                        self.dev.launch(
                            K::default(),
                            cfg,
                            (args.0, args.1, args.2, args.3, fused, multicast, c_map, 1, batch),
                        )
                    };
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
                unsafe {
                    let k_args =
                        (args.0, args.1, ws.ptr_mut(), s, ACT_NONE_EPILOGUE, multicast, null, self.splits, batch);
                    self.dev.launch(K::default(), cfg, k_args)?;
                    let blocks = (mn as u32).div_ceil(256).min(132 * 16);
                    let rcfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
                    self.dev.launch(GemmSplitKReduce, rcfg, (ws.ptr(), c.ptr_mut(), mn as u32, s.n, self.splits, fused))
                }
            }
        }
    }
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

/// A 16-bit float type of the deterministic typed tier ([`typed_gemm`]).
pub trait TypedTier: cudarc::driver::DeviceRepr + Copy + 'static {
    /// `kiln_gpu::kernels::convert::format` code.
    const FORMAT: u32;
}
impl TypedTier for half::bf16 {
    const FORMAT: u32 = kiln_gpu::kernels::convert::format::BF16;
}
impl TypedTier for half::f16 {
    const FORMAT: u32 = kiln_gpu::kernels::convert::format::F16;
}

/// The deterministic typed tier: `c = a b` for bf16 or f16 `a` (m x k) and `b` (k x n), row-major,
/// computed as the f32 tier's ascending-k FMA chains on the exactly widened inputs (the rung
/// [`choose`] picks), then rounded once to `T`, nearest-even. Bit-identical to
/// `kiln::deterministic::matmul_chain` on the widened inputs followed by one rounding, on every
/// run, and batch-invariant like the f32 tier.
pub fn typed_gemm<T: TypedTier>(
    dev: &Device,
    a: &DeviceBuffer<T>,
    b: &DeviceBuffer<T>,
    c: &mut DeviceBuffer<T>,
    s: GemmShape,
) -> Result<()> {
    use kiln_gpu::kernels::convert::{NarrowF32B16, WidenB16F32};
    use kiln_gpu::{DevicePtr, DevicePtrMut};
    let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
    check_operands("typed gemm", a.len(), b.len(), c.len(), s)?;
    if m * n == 0 {
        return Ok(());
    }
    // Operand sizes are below 2^31 (check_operands), so they fit the kernels' u32 counts.
    let cfg = |len: usize| LaunchConfig::for_num_elems(len as u32);
    let c32 = if k == 0 {
        dev.zeros::<f32>(m * n)? // an empty sum
    } else {
        let (mut a32, mut b32) = (dev.alloc_uninit_f32(m * k)?, dev.alloc_uninit_f32(k * n)?);
        let mut c32 = dev.alloc_uninit_f32(m * n)?;
        // SAFETY: each conversion reads and writes `len` elements of buffers that hold them; the
        // 16-bit buffers are read as their bit patterns.
        unsafe {
            let src = DevicePtr::<u16>::from_addr(a.addr());
            dev.launch(WidenB16F32, cfg(m * k), (src, a32.ptr_mut(), (m * k) as u32, T::FORMAT))?;
            let src = DevicePtr::<u16>::from_addr(b.addr());
            dev.launch(WidenB16F32, cfg(k * n), (src, b32.ptr_mut(), (k * n) as u32, T::FORMAT))?;
        }
        sgemm(dev, &a32, &b32, &mut c32, s)?;
        c32
    };
    // SAFETY: c holds m * n 16-bit values, c32 as many f32.
    unsafe {
        let dst = DevicePtrMut::<u16>::from_addr(c.addr());
        dev.launch(NarrowF32B16, cfg(m * n), (c32.ptr(), dst, (m * n) as u32, T::FORMAT))
    }
}
