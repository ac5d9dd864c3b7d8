//! Gradient buckets for data-parallel all-reduce.
//!
//! Backward produces the last parameters' gradients first, so buckets are filled in reverse
//! parameter order: a bucket can be reduced as soon as its parameters' gradients are final, and
//! few large all-reduces beat many small ones (each NCCL call has a fixed latency).

/// PyTorch DDP's default bucket size, 25 MiB.
pub const DEFAULT_BUCKET_BYTES: usize = 25 * 1024 * 1024;

/// Groups parameters, given their sizes in bytes in parameter order, into buckets of at most
/// `cap` bytes, walking the parameters in reverse order; a parameter larger than `cap` gets a
/// bucket of its own. Each bucket lists parameter indices in the order they were added (descending).
/// Every index appears exactly once; empty parameters are kept (in the current bucket).
pub fn buckets(sizes: &[usize], cap: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut cur_bytes = 0usize;
    for i in (0..sizes.len()).rev() {
        let s = sizes[i];
        if !cur.is_empty() && cur_bytes + s > cap {
            out.push(std::mem::take(&mut cur));
            cur_bytes = 0;
        }
        cur.push(i);
        cur_bytes += s;
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reverse_order_and_cap() {
        assert_eq!(buckets(&[10, 10, 10, 10], 20), vec![vec![3, 2], vec![1, 0]]);
        assert_eq!(buckets(&[10, 30, 5], 20), vec![vec![2], vec![1], vec![0]]);
        assert_eq!(buckets(&[1, 2, 3], 100), vec![vec![2, 1, 0]]);
        assert!(buckets(&[], 100).is_empty());
        assert_eq!(buckets(&[0, 4, 0], 4), vec![vec![2, 1, 0]]);
    }

    #[test]
    fn every_parameter_once_and_no_bucket_over_cap_unless_alone() {
        let sizes: Vec<usize> = (0..50).map(|i| (i * 7919) % 1000 + 1).collect();
        for cap in [1, 500, 1000, 4000, 1 << 20] {
            let b = buckets(&sizes, cap);
            let mut all: Vec<usize> = b.iter().flatten().copied().collect();
            assert!(all.windows(2).all(|w| w[0] > w[1]), "reverse order");
            all.sort();
            assert_eq!(all, (0..50).collect::<Vec<_>>());
            for g in &b {
                let bytes: usize = g.iter().map(|&i| sizes[i]).sum();
                assert!(bytes <= cap || g.len() == 1, "cap {cap}: {g:?} holds {bytes}");
            }
        }
    }
}
