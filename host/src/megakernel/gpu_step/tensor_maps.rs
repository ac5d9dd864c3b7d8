//! The TMA tensor maps of a tensor-core [`GpuStep`]: one set per copy of the weights, in
//! `kiln_gpu::megakernel::map` order per layer, describing the buffers the kernel's loader reads
//! pages from and its storer writes to.

use super::GpuStep;
use crate::error::Result;
use crate::megakernel::DataPath;
use kiln_gpu::megakernel::pitch;

impl GpuStep {
    /// The tensor maps of the tensor-core path, in `kiln_gpu::megakernel::map` order per layer:
    /// K-major, a box of `tile` rows by one page's columns (32 f32, or 64 bf16 on
    /// [`DataPath::Bf16`], whose maps all describe bf16 copies). Where the step reads its operands
    /// in place (`kiln_gpu::megakernel::reads_in_place`: bf16 at tile 128), the maps of the
    /// transposed operands describe the operands themselves (`act_bf16`, `grad_bf16`, `w_op`),
    /// MN-major: a box of one page's K rows by `MN_BOX` columns. The weights' maps describe copy
    /// `copy` (`w_op[copy]`, `w_t[copy]`); `LOGITS`, the f32 logits, boxes of `tile` rows by
    /// `F32_BOX_COLS` f32.
    pub(super) fn encode_maps(
        &self,
        w_off: &[u32],
        a_off: &[u32],
        t_off: &[u32],
        wt_off: &[u32],
        copy: usize,
    ) -> Result<crate::cuda::DeviceTensorMap> {
        use crate::cuda::{TensorMapSpec, TmaDtype};
        use kiln_gpu::megakernel::map;
        use kiln_gpu::swizzle::Swizzle;
        let (d, b, tile) = (&self.shape.dims, self.shape.batch, self.tile);
        let bf16 = self.path == DataPath::Bf16;
        let page_k = kiln_gpu::megakernel::page_k(self.path.code());
        let spec = |rows: usize, cols: usize| TensorMapSpec {
            dtype: if bf16 { TmaDtype::Bf16 } else { TmaDtype::F32 },
            rows: rows as u64,
            cols: cols as u64,
            row_pitch: pitch(cols as u32) as u64,
            box_rows: tile,
            box_cols: page_k,
            swizzle: Swizzle::B128,
        };
        // an operand read in place, MN-major: rows are K
        let mn_spec = |rows: usize, cols: usize| TensorMapSpec {
            box_rows: page_k,
            box_cols: kiln_gpu::megakernel::MN_BOX,
            ..spec(rows, cols)
        };
        let in_place = self.reads_in_place();
        let f32_at = |buf: &crate::cuda::DeviceBuffer<f32>, off: u32| buf.addr() + 4 * off as u64;
        // the forward's A and the input gradient's A: bf16 copies on the bf16 path, else the f32
        // arrays themselves (stored rounded on the tf32 path)
        let act = |off| if bf16 { self.act_bf16.addr_of(off) } else { f32_at(&self.act, off) };
        let grad = |off| if bf16 { self.grad_bf16.addr_of(off) } else { f32_at(&self.grad, off) };
        let mut maps = Vec::new();
        for l in 0..self.shape.layers() {
            // the forward's weights: the rounded copy on tf32 and bf16, else the weights themselves
            let w = match self.path {
                DataPath::Tf32 | DataPath::Bf16 => self.w_op[copy].addr_of(w_off[l]),
                DataPath::CudaCores | DataPath::Tf32x3 => f32_at(&self.weights, w_off[l]),
            };
            let mut layer = [(0u64, spec(1, 1)); map::PER_LAYER as usize];
            layer[map::ACT as usize] = (act(a_off[l]), spec(b, d[l]));
            layer[map::GRAD as usize] = (grad(a_off[l + 1]), spec(b, d[l + 1]));
            layer[map::W as usize] = (w, spec(d[l + 1], d[l]));
            if in_place {
                layer[map::ACT_T as usize] = (act(a_off[l]), mn_spec(b, d[l]));
                layer[map::GRAD_T as usize] = (grad(a_off[l + 1]), mn_spec(b, d[l + 1]));
                layer[map::W_T as usize] = (w, mn_spec(d[l + 1], d[l]));
            } else {
                layer[map::ACT_T as usize] = (self.act_t.addr_of(t_off[l]), spec(d[l], b));
                layer[map::GRAD_T as usize] = (self.grad_t.addr_of(t_off[l + 1]), spec(d[l + 1], b));
                layer[map::W_T as usize] = (self.w_t[copy].addr_of(wt_off[l]), spec(d[l], d[l + 1]));
            }
            // f32 in boxes of `F32_BOX_COLS`: the logits (read where `box_slot_uses` stages them;
            // the same in every layer's and both copies' maps) and the weights themselves (where
            // a fused update stages its tile: `kiln_gpu::megakernel::staged`)
            let boxes = |rows: usize, cols: usize| TensorMapSpec {
                dtype: TmaDtype::F32,
                box_cols: kiln_gpu::megakernel::F32_BOX_COLS,
                ..spec(rows, cols)
            };
            let last = self.shape.layers();
            layer[map::LOGITS as usize] = (f32_at(&self.act, a_off[last]), boxes(b, d[last]));
            layer[map::WEIGHTS as usize] = (f32_at(&self.weights, w_off[l]), boxes(d[l + 1], d[l]));
            // the copy the updates write; elsewhere unread (the CUDA-core and 3xTF32 paths'
            // products read `weights`, which the updates write, so there it is the same array)
            let next = match self.path {
                DataPath::Tf32 | DataPath::Bf16 => self.w_op[1 - copy].addr_of(w_off[l]),
                DataPath::CudaCores | DataPath::Tf32x3 => f32_at(&self.weights, w_off[l]),
            };
            layer[map::W_NEXT as usize] = (next, spec(d[l + 1], d[l]));
            maps.extend(layer);
        }
        self.dev.tensor_maps(&maps)
    }
}
