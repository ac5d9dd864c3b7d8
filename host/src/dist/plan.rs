//! The layout of gradient buckets on the host: which parameters share a bucket ([`super::bucket`]
//! groups them), where each sits in its bucket's flat buffer, and which part of each bucket a rank
//! owns under ZeRO-1. No GPU here; the CPU tests cover all of it.

use std::ops::Range;

/// One gradient bucket: parameters whose gradients are reduced together, in one collective.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// The parameters (indices in registration order), in the order they join the bucket: the
    /// reverse of registration, the order the backward pass finishes their gradients.
    pub params: Vec<usize>,
    /// Where each parameter's gradient starts in the bucket's flat buffer (elements).
    pub offsets: Vec<usize>,
    /// Elements of gradient the bucket holds.
    pub len: usize,
    /// `len` rounded up to a multiple of the number of ranks (ZeRO-1 reduce-scatters the padded
    /// buffer in equal parts; the plain all-reduce reads `len`).
    pub padded: usize,
}

impl Bucket {
    /// Elements of the bucket each rank owns under ZeRO-1 (`padded / ranks`).
    pub fn shard_len(&self, ranks: usize) -> usize {
        self.padded / ranks.max(1)
    }
}

/// The buckets of a model, and for ZeRO-1 where each rank's part of each bucket sits in the rank's
/// flat shard of the parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketPlan {
    /// The buckets, in the order their gradients become final (the first is launched first).
    pub buckets: Vec<Bucket>,
    /// The number of ranks the plan was made for.
    pub ranks: usize,
    /// For each parameter (registration order): its bucket.
    pub bucket_of: Vec<usize>,
}

impl BucketPlan {
    /// Buckets for parameters of `sizes` elements (registration order) of `elem_bytes` bytes each,
    /// at most `bucket_bytes` per bucket (a parameter larger than that gets a bucket of its own),
    /// filled in reverse registration order as PyTorch DDP does: the last layer's gradients are
    /// final first in the backward pass, so its bucket can be reduced while earlier layers are
    /// still differentiating.
    pub fn new(sizes: &[usize], elem_bytes: usize, bucket_bytes: usize, ranks: usize) -> BucketPlan {
        let ranks = ranks.max(1);
        let bytes: Vec<usize> = sizes.iter().map(|n| n * elem_bytes).collect();
        let mut bucket_of = vec![0; sizes.len()];
        let buckets = super::bucket::buckets(&bytes, bucket_bytes)
            .into_iter()
            .enumerate()
            .map(|(i, params)| {
                let mut offsets = Vec::with_capacity(params.len());
                let mut len = 0;
                for &p in &params {
                    bucket_of[p] = i;
                    offsets.push(len);
                    len += sizes[p];
                }
                Bucket { params, offsets, len, padded: len.div_ceil(ranks) * ranks }
            })
            .collect();
        BucketPlan { buckets, ranks, bucket_of }
    }

    /// Elements of the flat ZeRO-1 shard each rank holds: its part of every bucket, bucket after
    /// bucket.
    pub fn shard_len(&self) -> usize {
        self.buckets.iter().map(|b| b.shard_len(self.ranks)).sum()
    }

    /// Where bucket `b`'s part sits in a rank's flat shard.
    pub fn shard_offset(&self, b: usize) -> usize {
        self.buckets[..b].iter().map(|x| x.shard_len(self.ranks)).sum()
    }

    /// The elements of bucket `b` (padded buffer) that `rank` owns under ZeRO-1.
    pub fn owned(&self, b: usize, rank: usize) -> Range<usize> {
        let c = self.buckets[b].shard_len(self.ranks);
        rank * c..(rank + 1) * c
    }

    /// The rank owning element `e` of bucket `b`'s padded buffer.
    pub fn owner(&self, b: usize, e: usize) -> usize {
        e / self.buckets[b].shard_len(self.ranks).max(1)
    }

    /// Total elements of gradient (without padding).
    pub fn elements(&self) -> usize {
        self.buckets.iter().map(|b| b.len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_fill_in_reverse_registration_order_up_to_the_cap() {
        // an MLP's (weight, bias) pairs: 4 KiB and 64 bytes of f32, 8 KiB (2048 elements) a bucket
        let sizes = [1024, 16, 1024, 16, 1024, 16];
        let plan = BucketPlan::new(&sizes, 4, 8 << 10, 1);
        let params: Vec<Vec<usize>> = plan.buckets.iter().map(|b| b.params.clone()).collect();
        // 16 + 1024 + 16 fit; a second 1024 would make 2080: the next bucket starts there
        assert_eq!(params, [vec![5, 4, 3], vec![2, 1], vec![0]]);
        assert_eq!(plan.buckets[0].offsets, [0, 16, 1040]);
        assert_eq!(plan.buckets[0].len, 1056);
        assert_eq!(plan.bucket_of, [2, 1, 1, 0, 0, 0]);
        assert_eq!(plan.elements(), sizes.iter().sum::<usize>());
    }

    #[test]
    fn a_parameter_larger_than_the_cap_gets_its_own_bucket() {
        let plan = BucketPlan::new(&[10, 1000, 10], 4, 100, 1);
        let params: Vec<Vec<usize>> = plan.buckets.iter().map(|b| b.params.clone()).collect();
        assert_eq!(params, [vec![2], vec![1], vec![0]]);
        // one bucket when everything fits
        assert_eq!(BucketPlan::new(&[10, 1000, 10], 4, super::super::bucket::DEFAULT_BUCKET_BYTES, 1).buckets.len(), 1);
        // no parameters, no buckets
        assert!(BucketPlan::new(&[], 4, 100, 2).buckets.is_empty());
    }

    #[test]
    fn every_element_belongs_to_exactly_one_bucket_slot() {
        let sizes = [7, 300, 1, 64, 5, 999, 2];
        for cap in [4, 64, 1000, 4096, 1 << 20] {
            let plan = BucketPlan::new(&sizes, 4, cap, 3);
            let mut seen = vec![false; sizes.len()];
            for b in &plan.buckets {
                let mut end = 0;
                for (&p, &o) in b.params.iter().zip(&b.offsets) {
                    assert_eq!(o, end, "parameters packed back to back");
                    end += sizes[p];
                    assert!(!seen[p]);
                    seen[p] = true;
                }
                assert_eq!(end, b.len);
                assert!(b.len * 4 <= cap.max(4 * b.params.iter().map(|&p| sizes[p]).max().unwrap()));
            }
            assert!(seen.iter().all(|&s| s));
        }
    }

    #[test]
    fn zero1_shards_cover_each_padded_bucket_once() {
        let sizes = [7, 300, 1, 64, 5];
        for ranks in 1..=5 {
            let plan = BucketPlan::new(&sizes, 4, 256, ranks);
            let mut offset = 0;
            for (b, bucket) in plan.buckets.iter().enumerate() {
                assert_eq!(bucket.padded % ranks, 0);
                assert!(bucket.padded >= bucket.len && bucket.padded < bucket.len + ranks);
                assert_eq!(plan.shard_offset(b), offset);
                offset += bucket.shard_len(ranks);
                let mut covered = vec![0; bucket.padded];
                for r in 0..ranks {
                    for e in plan.owned(b, r) {
                        covered[e] += 1;
                        assert_eq!(plan.owner(b, e), r);
                    }
                }
                assert!(covered.iter().all(|&c| c == 1), "ranks {ranks} bucket {b}");
            }
            assert_eq!(plan.shard_len(), offset);
        }
    }
}
