//! Datasets: generated two-dimensional spirals, and a reader for MNIST's IDX files.

use crate::error::{Error, Result};
use rand::Rng;
use std::path::Path;

/// A classification dataset: `n` rows of `features` f32 values, and a class per row.
#[derive(Clone, Debug)]
pub struct Dataset {
    /// Row-major features, n x features.
    pub x: Vec<f32>,
    /// Class of each row.
    pub y: Vec<usize>,
    /// Features per row.
    pub features: usize,
    /// Number of classes.
    pub classes: usize,
}

impl Dataset {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.y.len()
    }
    /// Whether it has no rows.
    pub fn is_empty(&self) -> bool {
        self.y.is_empty()
    }
    /// The rows at `idx`, gathered (features, labels).
    pub fn gather(&self, idx: &[usize]) -> (Vec<f32>, Vec<usize>) {
        let f = self.features;
        let mut x = Vec::with_capacity(idx.len() * f);
        for &i in idx {
            x.extend_from_slice(&self.x[i * f..(i + 1) * f]);
        }
        (x, idx.iter().map(|&i| self.y[i]).collect())
    }
    /// Splits off the last `fraction` of a seeded shuffle as a test set.
    pub fn split(&self, fraction: f64, rng: &mut impl Rng) -> (Dataset, Dataset) {
        let mut idx: Vec<usize> = (0..self.len()).collect();
        for i in (1..idx.len()).rev() {
            idx.swap(i, rng.random_range(0..=i));
        }
        let n_test = ((self.len() as f64) * fraction).round() as usize;
        let (train, test) = idx.split_at(self.len() - n_test);
        let part = |ix: &[usize]| {
            let (x, y) = self.gather(ix);
            Dataset { x, y, features: self.features, classes: self.classes }
        };
        (part(train), part(test))
    }
}

/// `classes` interleaved spiral arms of `per_class` points each in the plane, with Gaussian noise
/// of standard deviation `noise` on the angle (the classic "spirals" toy problem; a linear model
/// gets about 1 / classes of it right).
pub fn spirals(per_class: usize, classes: usize, noise: f64, rng: &mut impl Rng) -> Dataset {
    let mut x = Vec::with_capacity(per_class * classes * 2);
    let mut y = Vec::with_capacity(per_class * classes);
    for c in 0..classes {
        for i in 0..per_class {
            let r = i as f64 / per_class as f64;
            // Box-Muller normal for the angle noise.
            let (u1, u2): (f64, f64) = (rng.random_range(f64::MIN_POSITIVE..1.0), rng.random());
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            let t = c as f64 * 2.0 * std::f64::consts::PI / classes as f64 + r * 4.0 + z * noise;
            x.push((r * t.sin()) as f32);
            x.push((r * t.cos()) as f32);
            y.push(c);
        }
    }
    Dataset { x, y, features: 2, classes }
}

fn idx_err(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::File { path: path.to_path_buf(), msg: msg.to_string() }
}

/// Reads an IDX file of unsigned bytes (MNIST's format): returns the dimensions and the data.
pub fn read_idx_u8(path: &Path) -> Result<(Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).map_err(|e| idx_err(path, e))?;
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 {
        return Err(idx_err(path, "not an IDX file (bad magic number)"));
    }
    if bytes[2] != 0x08 {
        return Err(idx_err(path, format!("element type {:#04x}; kiln reads unsigned bytes (0x08)", bytes[2])));
    }
    let rank = bytes[3] as usize;
    let header = 4 + 4 * rank;
    if bytes.len() < header {
        return Err(idx_err(path, "truncated header"));
    }
    let dims: Vec<usize> = (0..rank)
        .map(|i| u32::from_be_bytes(bytes[4 + 4 * i..8 + 4 * i].try_into().expect("4 bytes")) as usize)
        .collect();
    // the sizes come from the file: multiplied with checks, never trusted to fit
    let data = bytes.len() - header;
    let n = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or_else(|| {
        idx_err(path, format!("dimensions {dims:?} describe more bytes than fit in 64 bits; the file has {data}"))
    })?;
    if data != n {
        return Err(idx_err(path, format!("dimensions {dims:?} need {n} bytes of data, the file has {data}")));
    }
    Ok((dims, bytes[header..].to_vec()))
}

/// Reads MNIST from `dir` (`train-images-idx3-ubyte` and `train-labels-idx1-ubyte`, or the `t10k`
/// pair when `test`), scaling pixels to [0, 1].
pub fn mnist(dir: &Path, test: bool) -> Result<Dataset> {
    let prefix = if test { "t10k" } else { "train" };
    let images = dir.join(format!("{prefix}-images-idx3-ubyte"));
    let labels = dir.join(format!("{prefix}-labels-idx1-ubyte"));
    let (idims, pixels) = read_idx_u8(&images)?;
    let (ldims, labs) = read_idx_u8(&labels)?;
    if idims.len() != 3 || ldims.len() != 1 || idims[0] != ldims[0] {
        return Err(idx_err(
            &images,
            format!("images {idims:?} and labels {ldims:?} do not match (expected [n, rows, cols] and [n])"),
        ));
    }
    if idims.contains(&0) {
        return Err(idx_err(&images, format!("images {idims:?}: no images, or images of no pixels")));
    }
    if let Some(bad) = labs.iter().find(|&&l| l > 9) {
        return Err(idx_err(&labels, format!("label {bad} is not a digit")));
    }
    Ok(Dataset {
        x: pixels.iter().map(|&p| p as f32 / 255.0).collect(),
        y: labs.iter().map(|&l| l as usize).collect(),
        // at most the file's byte count: read_idx_u8 checked the product of all three, none is 0
        features: idims[1] * idims[2],
        classes: 10,
    })
}
