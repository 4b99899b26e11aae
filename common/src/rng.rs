//! Seeded random numbers: a splitmix64 stream, the one generator of the workspace.
//!
//! It defines the Nexmark generator's data (`connectors/src/nexmark/`): every event
//! draws from its own stream, [`Rng::for_event`], seeded by the job seed and the event
//! number, so an event's content never depends on which other events were generated
//! before it. Changing anything here changes every generated event, so the arithmetic
//! must stay bit for bit as it is. Benchmarks and tests draw from [`Rng::new`] (tests
//! through `sluice-test-support`, which also reads a seed from the environment so a
//! failing run can be replayed).
//!
//! Not for anything secret: it is fast and reproducible, not unpredictable.

/// Golden-ratio increment of splitmix64.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// A splitmix64 stream.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// The stream of `seed` (the stream of its event 0).
    #[inline]
    pub fn new(seed: u64) -> Self {
        Self::for_event(seed, 0)
    }

    /// The stream of event `event` under `seed`.
    #[inline]
    pub fn for_event(seed: u64, event: u64) -> Self {
        Rng(mix(seed
            ^ event.wrapping_mul(GAMMA)
            ^ 0x5EED_0F5E_ED5E_ED00))
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        mix(self.0)
    }

    /// A number in `0..n` (`0` when `n == 0`), by multiply-shift (no division).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// A number in `[0, 1)`.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_pure_functions_of_seed_and_event() {
        let a: Vec<u64> = (0..4)
            .map(|_| 0)
            .scan(Rng::for_event(7, 42), |r, _: u64| Some(r.next_u64()))
            .collect();
        let b: Vec<u64> = (0..4)
            .map(|_| 0)
            .scan(Rng::for_event(7, 42), |r, _: u64| Some(r.next_u64()))
            .collect();
        assert_eq!(a, b);
        assert_ne!(
            Rng::for_event(7, 42).next_u64(),
            Rng::for_event(7, 43).next_u64()
        );
        assert_ne!(
            Rng::for_event(7, 42).next_u64(),
            Rng::for_event(8, 42).next_u64()
        );
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut r = Rng::for_event(1, 1);
        let mut seen = [false; 7];
        for _ in 0..1000 {
            let v = r.below(7);
            assert!(v < 7);
            seen[v as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
        let f = r.next_f64();
        assert!((0.0..1.0).contains(&f));
    }
}
