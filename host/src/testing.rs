//! Shared test plumbing: one comparison helper, input generators, output poisoning, and the rules
//! for GPU tests on machines without a GPU.

use rand::{Rng, SeedableRng, rngs::StdRng};

/// Set to `1` to make a missing GPU fail the GPU tests instead of skipping them.
pub const REQUIRE_GPU_ENV: &str = "KILN_REQUIRE_GPU";

/// Whether `KILN_REQUIRE_GPU=1`.
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU_ENV).is_ok_and(|v| v == "1")
}

/// Environment variable naming the `kiln` binary that tests run as a user would (the GPU bundle
/// sets it to the copy it carries; `cargo test` builds one beside the tests).
pub const KILN_BIN_ENV: &str = "KILN_BIN";

/// The `kiln` binary a test should run: `$KILN_BIN` when set, else `built` (the test's
/// `env!("CARGO_BIN_EXE_kiln")`) when that file exists. None, with a message naming `test`, where
/// neither is present; with `KILN_BIN` set to a missing file, a panic (the bundle is broken).
pub fn kiln_binary(test: &str, built: &str) -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os(KILN_BIN_ENV) {
        let p = std::path::PathBuf::from(p);
        assert!(p.exists(), "{test}: {KILN_BIN_ENV} names {}, which does not exist", p.display());
        return Some(p);
    }
    let p = std::path::PathBuf::from(built);
    if p.exists() {
        return Some(p);
    }
    eprintln!("{test}: no kiln binary at {} and {KILN_BIN_ENV} is not set; skipped", p.display());
    None
}

/// The value written to outputs before a launch: a NaN with a recognizable payload, so that an
/// element the kernel never wrote fails every comparison.
pub const POISON_F32: f32 = f32::from_bits(0x7fc0_dead);

/// A generator seeded from the clock (printed, so a failure can be replayed with `KILN_SEED`).
pub fn rng() -> (StdRng, u64) {
    let seed = std::env::var("KILN_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
    });
    (StdRng::seed_from_u64(seed), seed)
}

/// `n` values uniform in [-1, 1).
pub fn uniform(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// A tolerance: `|got - want| <= abs + rel * |want|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tol {
    /// Absolute part.
    pub abs: f64,
    /// Relative part.
    pub rel: f64,
}

impl Tol {
    /// Bit-exact equality (compared as values; NaN never passes).
    pub const EXACT: Tol = Tol { abs: 0.0, rel: 0.0 };
}

/// Compares `got` with a higher-precision reference. On failure the message names the first bad
/// index, the value got, the value expected, the tolerance, and how many elements failed.
pub fn compare(what: &str, got: &[f32], want: &[f64], tol: Tol) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: got {} elements, expected {}", got.len(), want.len()));
    }
    let mut bad = 0usize;
    let mut first = None;
    let mut worst = 0.0f64;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let allowed = tol.abs + tol.rel * w.abs();
        let err = (g as f64 - w).abs();
        // Written so that a NaN on either side fails.
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        let ok = err <= allowed;
        if !ok {
            bad += 1;
            if first.is_none() {
                first = Some((i, g, w, allowed));
            }
        }
        if err.is_finite() {
            worst = worst.max(err);
        }
    }
    match first {
        None => Ok(()),
        Some((i, g, w, allowed)) => Err(format!(
            "{what}: {bad} of {} elements out of tolerance; first at index {i}: got {g:e} (bits {:#010x}), expected {w:e}, \
             tolerance {allowed:e} ({tol:?}); largest finite error {worst:e}",
            got.len(),
            g.to_bits()
        )),
    }
}

/// ‖got − want‖₂ / ‖want‖₂, the summary error the guide reports.
pub fn relative_l2(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(&g, &w)| (g as f64 - w).powi(2)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_reports_index_and_values() {
        assert!(compare("x", &[1.0, 2.0], &[1.0, 2.0], Tol::EXACT).is_ok());
        let e = compare("x", &[1.0, 2.5], &[1.0, 2.0], Tol { abs: 0.1, rel: 0.0 }).unwrap_err();
        assert!(e.contains("index 1"), "{e}");
        assert!(e.contains("got 2.5e0"), "{e}");
        assert!(e.contains("expected 2e0"), "{e}");
    }

    #[test]
    fn poison_never_passes() {
        assert!(POISON_F32.is_nan());
        assert!(compare("x", &[POISON_F32], &[0.0], Tol { abs: 1e30, rel: 1e30 }).is_err());
        assert!(compare("x", &[1.0], &[f64::NAN], Tol { abs: 1e30, rel: 0.0 }).is_err());
    }
}
