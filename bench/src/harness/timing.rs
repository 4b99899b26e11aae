//! Percentiles of samples, and waiting for a condition within a bound.

use std::time::{Duration, Instant};

use anyhow::bail;

/// The nearest-rank percentile `p` (0 < p <= 1) of `sorted`; the default when empty.
pub fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Polls `done` every 5 ms until it holds; how long that took, or an error naming
/// `what` after `limit`.
pub async fn wait_for(
    what: &str,
    limit: Duration,
    mut done: impl FnMut() -> bool,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > limit {
            bail!("{what} did not happen within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(start.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let d: Vec<Duration> = (1..=20).map(Duration::from_millis).collect();
        assert_eq!(percentile(&d, 0.5), Duration::from_millis(10));
        assert_eq!(percentile(&d, 0.99), Duration::from_millis(20));
        assert_eq!(percentile::<Duration>(&[], 0.99), Duration::ZERO);
        assert_eq!(percentile(&[3u64, 5, 9], 0.5), 5);
        assert_eq!(percentile(&[3u64], 0.01), 3);
    }
}
