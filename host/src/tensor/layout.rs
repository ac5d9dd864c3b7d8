//! Where a tensor's elements sit in its storage: a [`Layout`] is a shape, a stride per dimension
//! (in elements) and an offset. A freshly made tensor is contiguous (row-major strides, offset 0);
//! the view ops (`permute`, `transpose`, `narrow`, `split`, `chunk`) make new layouts over the same
//! storage. Pure index math, unit-tested here on the CPU.

use super::shape::Shape;
use crate::error::{Error, Result};

/// A shape read from storage through per-dimension strides, starting at an element offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    shape: Shape,
    strides: Vec<usize>,
    offset: usize,
}

impl Layout {
    /// The row-major layout of `shape` at offset 0.
    pub fn contiguous(shape: Shape) -> Layout {
        Layout::contiguous_at(shape, 0)
    }
    /// The row-major layout of `shape` starting at storage element `offset`.
    pub fn contiguous_at(shape: Shape, offset: usize) -> Layout {
        let strides = shape.strides();
        Layout { shape, strides, offset }
    }
    /// `from` (contiguous, offset 0) read as its broadcast `to`: stride 0 along the broadcast
    /// dimensions.
    pub fn broadcast(from: &Shape, to: &Shape) -> Layout {
        Layout { shape: to.clone(), strides: from.broadcast_strides(to), offset: 0 }
    }
    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    /// The stride of each dimension, in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    /// The storage element of the first element.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Whether the elements are in row-major order with no gaps (the offset aside): the strides of
    /// the dimensions longer than 1 are the contiguous ones.
    pub fn is_contiguous(&self) -> bool {
        if self.shape.elem_count() == 0 {
            return true;
        }
        let mut expected = 1;
        for (&d, &s) in self.shape.dims().iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// Whether this layout covers all of a storage of `len` elements, in order: the data can be
    /// used as it is stored.
    pub fn is_dense_in(&self, len: usize) -> bool {
        self.offset == 0 && self.shape.elem_count() == len && self.is_contiguous()
    }

    /// One past the largest storage element this layout reads (0 when empty).
    pub fn span(&self) -> usize {
        if self.shape.elem_count() == 0 {
            return 0;
        }
        self.offset + self.shape.dims().iter().zip(&self.strides).map(|(&d, &s)| (d - 1) * s).sum::<usize>() + 1
    }

    /// The dimensions reordered: dimension `i` of the result is dimension `perm[i]` of this layout.
    pub fn permute(&self, perm: &[usize]) -> Result<Layout> {
        let r = self.shape.rank();
        let mut seen = vec![false; r];
        let ok = perm.len() == r && perm.iter().all(|&p| p < r && !std::mem::replace(&mut seen[p], true));
        if !ok {
            return Err(Error::shape(
                "permute",
                format!("{perm:?} is not a permutation of the {r} dimensions of {}", self.shape),
            ));
        }
        Ok(Layout {
            shape: Shape(perm.iter().map(|&p| self.shape.dims()[p]).collect()),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        })
    }

    /// Dimensions `a` and `b` (resolved, in range) swapped.
    pub fn transpose(&self, a: usize, b: usize) -> Layout {
        let mut l = self.clone();
        l.shape.0.swap(a, b);
        l.strides.swap(a, b);
        l
    }

    /// `len` entries of dimension `dim` (resolved, in range) from `start`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Layout> {
        let size = self.shape.dims()[dim];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::shape(
                "narrow",
                format!(
                    "entries {start}..{} of dimension {dim} of {} are out of range",
                    start.saturating_add(len),
                    self.shape
                ),
            ));
        }
        let mut l = self.clone();
        l.shape.0[dim] = len;
        if len > 0 {
            l.offset += start * self.strides[dim];
        }
        Ok(l)
    }

    /// The storage offset of every element, in row-major order of the shape.
    pub fn offsets(&self) -> Vec<usize> {
        let n = self.shape.elem_count();
        let mut out = Vec::with_capacity(n);
        if n == 0 {
            return out;
        }
        let dims = self.shape.dims();
        let mut idx = vec![0usize; dims.len()];
        let mut off = self.offset;
        for _ in 0..n {
            out.push(off);
            // Increment the multi-index from the last dimension, carrying.
            for d in (0..dims.len()).rev() {
                idx[d] += 1;
                off += self.strides[d];
                if idx[d] < dims[d] {
                    break;
                }
                off -= self.strides[d] * dims[d];
                idx[d] = 0;
            }
        }
        out
    }

    /// The same walk with fewer dimensions (see `coalesce` in this file): `(dims, strides)`, at least one
    /// dimension; the offset is unchanged.
    pub fn coalesced(&self) -> (Vec<usize>, Vec<usize>) {
        let (dims, mut strides) = coalesce(self.shape.dims(), &[&self.strides]);
        (dims, strides.remove(0))
    }

    /// Strides for reading this layout as if it had shape `target` (a broadcast of its shape):
    /// its own strides, 0 for the dimensions it is broadcast along (missing leading ones, and
    /// its 1s that `target` widens).
    pub fn broadcast_strides(&self, target: &Shape) -> Vec<usize> {
        let off = target.rank() - self.shape.rank();
        (0..target.rank())
            .map(|i| {
                if i < off || self.shape.dims()[i - off] == 1 && target.dims()[i] != 1 {
                    0
                } else {
                    self.strides[i - off]
                }
            })
            .collect()
    }

    /// For a 2-D layout: whether it is the transpose of a contiguous (cols x rows) matrix stored at
    /// offset 0 over `len` elements (strides `[1, rows]`), the layout a GEMM reads in place as `T`.
    pub fn is_transposed_matrix_in(&self, len: usize) -> bool {
        let d = self.shape.dims();
        d.len() == 2 && d[0] > 1 && d[1] > 1 && self.offset == 0 && d[0] * d[1] == len && self.strides == [1, d[0]]
    }

    /// Whether this is the last-two-dimensions transpose of a contiguous tensor (rank 3 or more,
    /// offset 0) that fills storage of `len` elements: `[..., r, c]` read from `[..., c, r]`
    /// row-major data. Such a view is read in place by the batched `a b^T` product. Strides of
    /// size-1 dimensions are free.
    pub fn is_batched_transpose_in(&self, len: usize) -> bool {
        let d = self.shape.dims();
        let r = d.len();
        if r < 3 || self.offset != 0 || self.shape.elem_count() != len || len == 0 {
            return false;
        }
        let mut stored = d.to_vec();
        stored.swap(r - 2, r - 1);
        let want = Layout::contiguous(Shape(stored)).transpose(r - 2, r - 1);
        d.iter().zip(self.strides.iter().zip(want.strides())).all(|(&n, (s, w))| n == 1 || s == w)
    }
}

/// A walk over `dims` (row-major) read through each of `strides` at once, with fewer dimensions:
/// size-1 dimensions dropped, and neighbours merged where, for every stride list, the outer one
/// steps over exactly the inner one (`stride[i] == stride[i + 1] * dims[i + 1]`). The merged walk
/// visits the same offsets in the same order. Returns the dimensions (at least one) and each stride
/// list for them.
pub(crate) fn coalesce(dims: &[usize], strides: &[&[usize]]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let (mut out_d, mut out_s): (Vec<usize>, Vec<Vec<usize>>) = (vec![], vec![vec![]; strides.len()]);
    for (i, &d) in dims.iter().enumerate() {
        if d == 1 {
            continue;
        }
        let mergeable = !out_d.is_empty() && strides.iter().zip(&out_s).all(|(s, o)| o[o.len() - 1] == s[i] * d);
        if mergeable {
            *out_d.last_mut().expect("not empty") *= d;
            for (s, o) in strides.iter().zip(&mut out_s) {
                *o.last_mut().expect("not empty") = s[i];
            }
        } else {
            out_d.push(d);
            for (s, o) in strides.iter().zip(&mut out_s) {
                o.push(s[i]);
            }
        }
    }
    if out_d.is_empty() {
        return (vec![1], vec![vec![1]; strides.len()]);
    }
    (out_d, out_s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(dims: &[usize]) -> Layout {
        Layout::contiguous(Shape(dims.to_vec()))
    }

    #[test]
    fn contiguous_and_span() {
        let a = l(&[2, 3, 4]);
        assert_eq!(a.strides(), [12, 4, 1]);
        assert!(a.is_contiguous() && a.is_dense_in(24) && !a.is_dense_in(25));
        assert_eq!(a.span(), 24);
        assert_eq!(l(&[0, 3]).span(), 0);
        assert!(l(&[]).is_contiguous());
        assert_eq!(l(&[]).offsets(), [0]);
    }

    #[test]
    fn permute_and_transpose_offsets() {
        let a = l(&[2, 3]);
        let t = a.transpose(0, 1);
        assert_eq!(t.shape().dims(), [3, 2]);
        assert_eq!(t.strides(), [1, 3]);
        assert!(!t.is_contiguous());
        assert_eq!(t.offsets(), [0, 3, 1, 4, 2, 5]);
        assert!(t.is_transposed_matrix_in(6));
        assert!(!a.is_transposed_matrix_in(6));
        // the batched transpose of contiguous data, and what is not one
        let bt = l(&[2, 3, 4]).transpose(1, 2);
        assert!(bt.is_batched_transpose_in(24));
        assert!(!bt.is_batched_transpose_in(48), "a view of part of its storage");
        assert!(!l(&[2, 3, 4]).is_batched_transpose_in(24), "contiguous");
        assert!(!l(&[2, 3, 4]).transpose(0, 2).is_batched_transpose_in(24), "another transpose");
        assert!(l(&[2, 5, 3, 4]).transpose(2, 3).is_batched_transpose_in(120));
        assert!(l(&[1, 3, 4]).transpose(1, 2).is_batched_transpose_in(12));
        assert!(!t.is_batched_transpose_in(6), "rank 2: the 2-D test");
        assert!(!l(&[4, 3, 4]).narrow(0, 1, 2).unwrap().transpose(1, 2).is_batched_transpose_in(48), "offset");
        let p = l(&[2, 3, 4]).permute(&[2, 0, 1]).unwrap();
        assert_eq!(p.shape().dims(), [4, 2, 3]);
        assert_eq!(p.strides(), [1, 12, 4]);
        assert_eq!(&p.offsets()[..4], [0, 4, 8, 12]);
        assert_eq!(p.permute(&[1, 2, 0]).unwrap(), l(&[2, 3, 4]));
        assert!(l(&[2, 3]).permute(&[0, 0]).is_err());
        assert!(l(&[2, 3]).permute(&[0]).is_err());
        assert!(l(&[2, 3]).permute(&[0, 2]).is_err());
    }

    #[test]
    fn narrow_offsets_and_errors() {
        let a = l(&[3, 4]);
        let n = a.narrow(1, 1, 2).unwrap();
        assert_eq!(n.offset(), 1);
        assert_eq!(n.offsets(), [1, 2, 5, 6, 9, 10]);
        assert!(!n.is_contiguous());
        assert_eq!(n.span(), 11);
        let rows = a.narrow(0, 1, 2).unwrap();
        assert!(rows.is_contiguous() && !rows.is_dense_in(12));
        assert_eq!(rows.offsets(), (4..12).collect::<Vec<_>>());
        assert!(a.narrow(1, 3, 2).is_err());
        assert!(a.narrow(0, usize::MAX, 2).is_err());
        let empty = a.narrow(1, 4, 0).unwrap();
        assert_eq!(empty.offsets(), Vec::<usize>::new());
        assert!(empty.is_contiguous());
    }

    #[test]
    fn broadcast_strides_of_views() {
        let t = l(&[3, 1]).transpose(0, 1); // [1, 3], strides [1, 1]
        assert_eq!(t.broadcast_strides(&Shape(vec![2, 4, 3])), [0, 0, 1]);
        let n = l(&[4, 5]).narrow(1, 2, 1).unwrap(); // [4, 1] at offset 2
        assert_eq!(n.broadcast_strides(&Shape(vec![4, 6])), [5, 0]);
        assert_eq!(l(&[2, 3]).broadcast_strides(&Shape(vec![2, 3])), Shape(vec![2, 3]).strides());
        let b = Layout::broadcast(&Shape(vec![3, 1]), &Shape(vec![2, 3, 2]));
        assert_eq!(b.offsets(), [0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2]);
        assert_eq!(b.span(), 3);
    }

    #[test]
    fn coalescing_merges_and_drops() {
        assert_eq!(l(&[2, 3, 4]).coalesced(), (vec![24], vec![1]));
        assert_eq!(l(&[2, 1, 4]).transpose(0, 2).coalesced(), (vec![4, 2], vec![1, 4]));
        // the head split of attention: [B, T, H, D] -> [B, H, T, D]
        let p = l(&[2, 5, 3, 4]).permute(&[0, 2, 1, 3]).unwrap();
        assert_eq!(p.coalesced(), (vec![2, 3, 5, 4], vec![60, 4, 12, 1]));
        // 5 dimensions whose inner two merge fit the 4-dimension kernels
        let q = l(&[2, 3, 2, 4, 5]).permute(&[1, 0, 2, 3, 4]).unwrap();
        assert_eq!(q.coalesced(), (vec![3, 2, 40], vec![40, 120, 1]));
        assert_eq!(l(&[1, 1]).coalesced(), (vec![1], vec![1]));
        // a coalesced walk visits the same offsets
        let (d, s) = p.coalesced();
        let c = Layout { shape: Shape(d), strides: s, offset: 0 };
        assert_eq!(c.offsets(), p.offsets());
        // two walks at once merge only where both can: a narrow window written into a contiguous
        // destination (cat) keeps the split at the narrowed dimension
        let dst = l(&[2, 7, 4]).narrow(1, 2, 3).unwrap();
        let src = l(&[2, 3, 4]);
        let (d, s) = coalesce(src.shape().dims(), &[dst.strides(), src.strides()]);
        assert_eq!(d, [2, 12]);
        assert_eq!(s, [vec![28, 1], vec![12, 1]]);
    }
}
