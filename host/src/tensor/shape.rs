//! Shapes, contiguous strides and broadcasting.

use crate::error::{Error, Result};

/// A tensor's dimensions (row-major, contiguous).
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(pub(crate) Vec<usize>);

impl std::fmt::Debug for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        Shape(d.to_vec())
    }
}
impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Self {
        Shape(d.to_vec())
    }
}
impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Self {
        Shape(d)
    }
}
impl From<usize> for Shape {
    fn from(d: usize) -> Self {
        Shape(vec![d])
    }
}
impl From<()> for Shape {
    fn from(_: ()) -> Self {
        Shape(vec![])
    }
}

impl Shape {
    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }
    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    /// Number of elements (1 for a scalar).
    pub fn elem_count(&self) -> usize {
        self.0.iter().product()
    }
    /// Contiguous row-major strides, in elements.
    pub fn strides(&self) -> Vec<usize> {
        let mut s = vec![1; self.0.len()];
        for i in (0..self.0.len().saturating_sub(1)).rev() {
            s[i] = s[i + 1] * self.0[i + 1];
        }
        s
    }
    /// Resolves a dimension index (negative counts from the end) for `op`.
    pub fn dim(&self, op: &'static str, d: isize) -> Result<usize> {
        let r = self.rank() as isize;
        let i = if d < 0 { d + r } else { d };
        if i < 0 || i >= r {
            return Err(Error::shape(op, format!("dimension {d} is out of range for shape {self}")));
        }
        Ok(i as usize)
    }
    /// This shape with the dimensions `dims` kept as size 1 (a keepdim reduction's shape).
    pub(crate) fn keepdims(&self, dims: &[usize]) -> Shape {
        Shape(self.0.iter().enumerate().map(|(i, &d)| if dims.contains(&i) { 1 } else { d }).collect())
    }
    /// Size of the last dimension (1 for a scalar).
    pub fn last(&self) -> usize {
        self.0.last().copied().unwrap_or(1)
    }

    /// The broadcast of two shapes (numpy rules: align the trailing dimensions; each pair must be
    /// equal or one of them 1).
    pub fn broadcast(op: &'static str, a: &Shape, b: &Shape) -> Result<Shape> {
        let r = a.rank().max(b.rank());
        let mut out = vec![0; r];
        #[allow(clippy::needless_range_loop)]
        for i in 0..r {
            let da = if i + a.rank() >= r { a.0[i + a.rank() - r] } else { 1 };
            let db = if i + b.rank() >= r { b.0[i + b.rank() - r] } else { 1 };
            out[i] = match (da, db) {
                (x, y) if x == y => x,
                (1, y) => y,
                (x, 1) => x,
                _ => {
                    return Err(Error::shape(
                        op,
                        format!("shapes {a} and {b} do not broadcast (dimension {i}: {da} vs {db})"),
                    ));
                }
            };
        }
        Ok(Shape(out))
    }

    /// Strides (in elements of `self`) for reading `self` as if it had shape `target`: broadcast
    /// dimensions get stride 0. `target` must be a broadcast of `self`.
    pub fn broadcast_strides(&self, target: &Shape) -> Vec<usize> {
        let own = self.strides();
        let off = target.rank() - self.rank();
        (0..target.rank())
            .map(|i| if i < off || self.0[i - off] == 1 && target.0[i] != 1 { 0 } else { own[i - off] })
            .collect()
    }
}
