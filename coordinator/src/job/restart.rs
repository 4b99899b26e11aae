//! The restart strategy: exponential back-off with a limit.
//!
//! Attempt `n` (0-based: the first restart is attempt 0) waits
//! `min(initial_backoff * 2^n, max_backoff)`; once `max_restarts` restarts were made the
//! policy gives up and the job fails. The driver counts attempts; a job that ran long
//! enough may reset its count (not decided here). A dependency out of reach (a state
//! node, an object store) is not the job's failure: the driver retries it with the same
//! back-off, capped at [`DEPENDENCY_RETRY_CAP`], without counting restarts.

use std::time::Duration;

/// The longest wait between two tries to reach an unavailable dependency.
pub const DEPENDENCY_RETRY_CAP: Duration = Duration::from_secs(5);

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
        Decision::Restart(self.backoff(attempt))
    }

    /// The wait before try `attempt` (0-based) of anything retried with this back-off.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt).unwrap_or(u32::MAX);
        self.initial_backoff
            .checked_mul(factor)
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff)
    }

    /// The wait before try `attempt` to reach a dependency that is out of reach: the
    /// back-off, but never above [`DEPENDENCY_RETRY_CAP`], so that a job notices soon
    /// that its dependency is back.
    pub fn dependency_backoff(&self, attempt: u32) -> Duration {
        self.backoff(attempt).min(DEPENDENCY_RETRY_CAP)
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
