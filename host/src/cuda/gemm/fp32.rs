//! The FP32 GEMM ladder on the host: one table row per rung (kernel, block, tile, shared memory,
//! alignment), one launcher for all, and the chooser that reads the tuned table.

use super::check::Checked;
use super::layout::{Layout, SizeClass};
use crate::cuda::{Device, DeviceBuffer, LaunchConfig};
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

/// How a rung maps threads to C.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mapping {
    /// A (32, 32) block, x along rows of C (rung 1, uncoalesced on purpose).
    RowsX,
    /// A 1-D block over a `tile_m x tile_n` tile of C, blocks along x over columns.
    Tiled,
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

/// The rung for `s` in `layout`, from the tuned table ([`super::tuned::TUNED`]). `None` for
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
    let name = super::tuned::TUNED
        .iter()
        .find(|t| t.0 == layout && t.1 == aligned && t.2 == class)
        .map(|t| t.3)
        .expect("the tuned table has a row for every layout, alignment and class");
    Some(rung(name).expect("the tuned table names rungs of the tables"))
}

/// The NN rung for `s`: the tuned table's pick for its alignment (16-byte rows: `k` and `n`
/// multiples of 4) and size class ([`SizeClass`]); see [`super::tuned`] for where the table
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
        let checked = Checked::operands("sgemm", a.len(), b.len(), c.len(), s)?;
        if checked.writes_nothing() {
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
        let checked = if self.vec4 {
            // the `_db` rungs also store C in 16-byte vectors
            checked.aligned(&[a.addr(), b.addr(), c.addr()])?
        } else {
            checked
        };
        if kk == 0 {
            // an empty sum (c holds exactly m n elements), and the tuned rungs' unchecked body
            // must not run
            return dev.zero(c);
        }
        // SAFETY: the sizes are checked above (k > 0); the kernel masks the edges.
        checked.launch(self.config(s), |cfg| unsafe { (self.launch)(dev, cfg, (a.ptr(), b.ptr(), c.ptr_mut(), s)) })
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
