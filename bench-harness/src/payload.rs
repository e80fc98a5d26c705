//! Message payloads and keys.
//!
//! A payload starts with the time the message was meant to be sent (nanoseconds since the Unix
//! epoch, little endian) and the producer's sequence number; consumers compute end-to-end latency
//! from the first. The rest is random bytes, made once per producer.

use rand::Rng;

use crate::workload::KeyDistribution;

pub const HEADER_LEN: usize = 16;

/// Nanoseconds since the Unix epoch (the wall clock, so that a consumer in another process on
/// the same host agrees).
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

pub fn filler(size: usize, rng: &mut impl Rng) -> Vec<u8> {
    let mut buf = vec![0u8; size];
    rng.fill(&mut buf[..]);
    buf
}

pub fn stamp(buf: &mut [u8], sent_ns: u64, sequence: u64) {
    buf[..8].copy_from_slice(&sent_ns.to_le_bytes());
    buf[8..16].copy_from_slice(&sequence.to_le_bytes());
}

/// The intended send time a payload carries, if it is long enough to carry one.
pub fn sent_ns(payload: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(payload.get(..8)?.try_into().ok()?))
}

/// Picks each message's key.
pub struct Keys {
    distribution: KeyDistribution,
    count: u64,
    next: u64,
    /// Zipf: cumulative probabilities of keys 0..count.
    cdf: Vec<f64>,
}

impl Keys {
    pub fn new(distribution: KeyDistribution, count: u64, exponent: f64, start: u64) -> Keys {
        let cdf = if distribution == KeyDistribution::Zipf {
            let mut acc = 0.0;
            let mut cdf: Vec<f64> = (1..=count)
                .map(|k| {
                    acc += 1.0 / (k as f64).powf(exponent);
                    acc
                })
                .collect();
            for p in &mut cdf {
                *p /= acc;
            }
            cdf
        } else {
            Vec::new()
        };
        Keys {
            distribution,
            count: count.max(1),
            next: start,
            cdf,
        }
    }

    /// The next key index, or None for unkeyed messages.
    pub fn next(&mut self, rng: &mut impl Rng) -> Option<u64> {
        match self.distribution {
            KeyDistribution::None => None,
            KeyDistribution::RoundRobin => {
                let k = self.next % self.count;
                self.next += 1;
                Some(k)
            }
            KeyDistribution::Random => Some(rng.gen_range(0..self.count)),
            KeyDistribution::Zipf => {
                let u: f64 = rng.gen();
                Some(self.cdf.partition_point(|&p| p < u).min(self.cdf.len() - 1) as u64)
            }
        }
    }
}

pub fn key_bytes(index: u64, buf: &mut String) {
    use std::fmt::Write;
    buf.clear();
    let _ = write!(buf, "key-{index:010}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn payload_carries_its_send_time() {
        let mut buf = vec![7u8; 64];
        stamp(&mut buf, 1_700_000_000_123_456_789, 42);
        assert_eq!(sent_ns(&buf), Some(1_700_000_000_123_456_789));
        assert_eq!(&buf[8..16], &42u64.to_le_bytes());
        assert_eq!(sent_ns(&buf[..7]), None);
    }

    #[test]
    fn round_robin_cycles_through_every_key() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let mut keys = Keys::new(KeyDistribution::RoundRobin, 3, 1.0, 1);
        let got: Vec<_> = (0..6).map(|_| keys.next(&mut rng).unwrap()).collect();
        assert_eq!(got, [1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn zipf_makes_the_first_keys_hot() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut keys = Keys::new(KeyDistribution::Zipf, 1000, 1.0, 0);
        let mut counts = vec![0u32; 1000];
        for _ in 0..100_000 {
            counts[keys.next(&mut rng).unwrap() as usize] += 1;
        }
        // With s = 1 over 1000 keys, key 0 has probability 1/H(1000) ≈ 0.134, key 1 half that.
        assert!((12_000..15_000).contains(&counts[0]), "{}", counts[0]);
        assert!((5_800..7_600).contains(&counts[1]), "{}", counts[1]);
        assert!(counts[999] < 60, "{}", counts[999]);
        assert_eq!(counts.iter().sum::<u32>(), 100_000);
    }

    #[test]
    fn unkeyed_and_random_keys() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut none = Keys::new(KeyDistribution::None, 10, 1.0, 0);
        assert_eq!(none.next(&mut rng), None);
        let mut random = Keys::new(KeyDistribution::Random, 10, 1.0, 0);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            seen[random.next(&mut rng).unwrap() as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }
}
