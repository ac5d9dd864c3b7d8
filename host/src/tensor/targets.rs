//! Class targets for cross-entropy: one index per row, checked once, and copied to a GPU at most
//! once however many times the loss and its gradient read them.
//!
//! ```
//! use kiln::tensor::Targets;
//! let y = Targets::new(vec![2, 0, 1]);
//! assert_eq!(y.len(), 3);
//! assert_eq!(y.max(), Some(2));
//! ```
//!
//! [`Tensor::cross_entropy`](super::Tensor::cross_entropy) accepts a `&[usize]` too; building a
//! [`Targets`] once and passing `&targets` saves the host-to-device copy on every call after the
//! first (the forward and the backward of one step share one copy either way).

use super::cuda_backend::DeviceIndices;
use std::sync::Arc;

/// Class indices (one per row) for [`Tensor::cross_entropy`](super::Tensor::cross_entropy). Cheap to
/// clone: clones share the indices and their device copy.
#[derive(Clone)]
pub struct Targets(Arc<Inner>);

struct Inner {
    idx: Vec<usize>,
    max: Option<usize>,
    /// The indices as u32 on the last device they were used on.
    on_device: DeviceIndices,
}

impl Targets {
    /// Targets from class indices.
    pub fn new(idx: Vec<usize>) -> Self {
        let max = idx.iter().copied().max();
        Targets(Arc::new(Inner { idx, max, on_device: DeviceIndices::default() }))
    }

    /// The class indices.
    pub fn as_slice(&self) -> &[usize] {
        &self.0.idx
    }

    /// How many rows the targets cover.
    pub fn len(&self) -> usize {
        self.0.idx.len()
    }

    /// Whether there are no targets.
    pub fn is_empty(&self) -> bool {
        self.0.idx.is_empty()
    }

    /// The largest class index (`None` when empty).
    pub fn max(&self) -> Option<usize> {
        self.0.max
    }

    /// Replaces the indices with `idx`, writing them into the device copy already made when it has
    /// `idx.len()` entries (the same buffer, so a captured graph that read the old targets reads
    /// the new ones on its next replay). Returns whether the device copy was written in place
    /// (false: none existed or its length differed; the next use uploads). Refused while a clone
    /// of these targets is alive (a clone would see the change): drop the clones first.
    pub fn overwrite(&mut self, idx: &[usize]) -> crate::error::Result<bool> {
        let Some(inner) = Arc::get_mut(&mut self.0) else {
            return Err(crate::error::Error::Unsupported {
                op: "Targets::overwrite",
                what: "targets that another handle shares (a clone, or a loss still holding them): drop it first"
                    .into(),
            });
        };
        inner.idx.clear();
        inner.idx.extend_from_slice(idx);
        inner.max = idx.iter().copied().max();
        inner.on_device.overwrite("Targets::overwrite", idx)
    }

    /// Their device copy, which the CUDA backend fills on first use and reuses.
    pub(crate) fn device_copy(&self) -> &DeviceIndices {
        &self.0.on_device
    }
}

impl std::fmt::Debug for Targets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Targets").field(&self.0.idx).finish()
    }
}

impl From<Vec<usize>> for Targets {
    fn from(v: Vec<usize>) -> Self {
        Targets::new(v)
    }
}

impl From<&[usize]> for Targets {
    fn from(v: &[usize]) -> Self {
        Targets::new(v.to_vec())
    }
}

impl From<&Vec<usize>> for Targets {
    fn from(v: &Vec<usize>) -> Self {
        Targets::new(v.clone())
    }
}

impl<const N: usize> From<&[usize; N]> for Targets {
    fn from(v: &[usize; N]) -> Self {
        Targets::new(v.to_vec())
    }
}

impl From<&Targets> for Targets {
    fn from(t: &Targets) -> Self {
        t.clone()
    }
}
