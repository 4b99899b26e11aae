//! The restart strategy: exponential back-off with a limit.
//!
//! Attempt `n` (0-based: the first restart is attempt 0) waits
//! `min(initial_backoff * 2^n, max_backoff)`; once `max_restarts` restarts were made the
//! policy gives up and the job fails. The driver counts attempts; a job that ran long
//! enough may reset its count (not decided here).

use std::time::Duration;

/// How a failing job is restarted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Restarts allowed before the job fails.
    pub max_restarts: u32,
    /// Wait before the first restart.
    pub initial_backoff: Duration,
    /// The wait never grows beyond this.
    pub max_backoff: Duration,
}

impl Default for RestartPolicy {
    /// 10 restarts, 1 s doubling up to 60 s.
    fn default() -> Self {
        Self {
            max_restarts: 10,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
        }
    }
}

/// What to do about a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Restart after this wait.
    Restart(Duration),
    /// Too many restarts: fail the job.
    GiveUp,
}

impl RestartPolicy {
    /// The decision for restart attempt `attempt` (0-based).
    pub fn decide(&self, attempt: u32) -> Decision {
        if attempt >= self.max_restarts {
            return Decision::GiveUp;
        }
        let factor = 1u32.checked_shl(attempt).unwrap_or(u32::MAX);
        let wait = self
            .initial_backoff
            .checked_mul(factor)
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff);
        Decision::Restart(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn back_off_doubles_up_to_the_cap_then_gives_up() {
        let p = RestartPolicy {
            max_restarts: 6,
            initial_backoff: ms(100),
            max_backoff: ms(1000),
        };
        let got: Vec<Decision> = (0..8).map(|a| p.decide(a)).collect();
        assert_eq!(
            got,
            vec![
                Decision::Restart(ms(100)),
                Decision::Restart(ms(200)),
                Decision::Restart(ms(400)),
                Decision::Restart(ms(800)),
                Decision::Restart(ms(1000)),
                Decision::Restart(ms(1000)),
                Decision::GiveUp,
                Decision::GiveUp,
            ]
        );
    }

    #[test]
    fn huge_attempts_do_not_overflow_and_zero_restarts_gives_up_at_once() {
        let p = RestartPolicy {
            max_restarts: u32::MAX,
            initial_backoff: Duration::from_secs(u64::MAX / 4),
            max_backoff: ms(5),
        };
        assert_eq!(p.decide(40), Decision::Restart(ms(5)));
        assert_eq!(p.decide(1000), Decision::Restart(ms(5)));
        let none = RestartPolicy {
            max_restarts: 0,
            ..RestartPolicy::default()
        };
        assert_eq!(none.decide(0), Decision::GiveUp);
    }
}
