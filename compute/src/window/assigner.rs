//! Assigning timestamps to windows.

use sluice_common::pb;

use crate::element::Timestamp;
use crate::error::{Error, Result};

/// The shape of a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowAssigner {
    /// Fixed, non-overlapping windows of `size` ms aligned to the epoch.
    Tumbling {
        /// Window length.
        size: i64,
    },
    /// Windows of `size` ms starting every `slide` ms.
    Sliding {
        /// Window length.
        size: i64,
        /// Distance between window starts.
        slide: i64,
    },
    /// Flink's CUMULATE: windows that all start at a multiple of `size` and end every
    /// `step` ms after it, up to `size` (`[0, step)`, `[0, 2 step)`, .. `[0, size)`).
    Cumulate {
        /// The longest window; a multiple of `step`.
        size: i64,
        /// Distance between window ends.
        step: i64,
    },
    /// Per-key activity periods separated by gaps of at least `gap` ms.
    Session {
        /// Inactivity that closes a session.
        gap: i64,
    },
}

impl WindowAssigner {
    /// The assigner a job graph's window spec describes.
    pub fn from_spec(spec: &pb::WindowSpec) -> Result<Self> {
        let ms = |v: u64, what: &str| -> Result<i64> {
            if v == 0 || v > i64::MAX as u64 / 4 {
                Err(Error::Plan(format!(
                    "window {what} must be positive and finite, got {v} ms"
                )))
            } else {
                Ok(v as i64)
            }
        };
        match spec.kind.as_ref() {
            Some(pb::window_spec::Kind::Tumbling(t)) => Ok(Self::Tumbling {
                size: ms(t.size_ms, "size")?,
            }),
            Some(pb::window_spec::Kind::Sliding(s)) => {
                let (size, slide) = (ms(s.size_ms, "size")?, ms(s.slide_ms, "slide")?);
                if slide > size {
                    return Err(Error::Plan(format!(
                        "sliding window slide ({slide} ms) is longer than its size ({size} ms)"
                    )));
                }
                Ok(Self::Sliding { size, slide })
            }
            Some(pb::window_spec::Kind::Cumulate(c)) => {
                let (size, step) = (ms(c.size_ms, "size")?, ms(c.step_ms, "step")?);
                if size % step != 0 {
                    return Err(Error::Plan(format!(
                        "a cumulate window's size ({size} ms) must be a whole number of steps \
                         ({step} ms)"
                    )));
                }
                Ok(Self::Cumulate { size, step })
            }
            Some(pb::window_spec::Kind::Session(s)) => Ok(Self::Session {
                gap: ms(s.gap_ms, "gap")?,
            }),
            // Each end `e` is the window [e - 1, e): the operator takes `e - 1` as the
            // row's time, so a 1 ms tumbling window holds exactly the rows of that end.
            Some(pb::window_spec::Kind::Cascade(_)) => Ok(Self::Tumbling { size: 1 }),
            None => Err(Error::Plan(
                "the window has no kind (tumbling, sliding, cumulate, session or cascade)".into(),
            )),
        }
    }

    /// Pane, longest window and slide lengths of a fixed-size assigner. Panes are
    /// `gcd(size, slide)` long, so every window is a whole number of panes and starts on
    /// a pane boundary (a tumbling window is a single pane; a cumulate window's panes
    /// are its steps).
    pub fn panes(&self) -> (i64, i64, i64) {
        let (size, slide) = match *self {
            Self::Tumbling { size } => (size, size),
            Self::Sliding { size, slide } => (size, slide),
            Self::Cumulate { size, step } => (size, step),
            Self::Session { gap } => (gap, gap),
        };
        let (mut a, mut b) = (size, slide);
        while b != 0 {
            (a, b) = (b, a % b);
        }
        (a, size, slide)
    }

    /// End of the last window holding `ts`: once it has fired (and its lateness passed),
    /// a record at `ts` is late.
    pub fn last_window_end(&self, ts: Timestamp) -> Timestamp {
        self.windows(ts).next().map_or(ts, |(_, end)| end)
    }

    /// The `[start, end)` windows of a fixed-size assigner that contain `ts`, latest
    /// first (by start; a cumulate assigner's share their start and come longest first).
    /// Session assigners yield the record's own proto-session `[ts, ts + gap)`.
    pub fn windows(&self, ts: Timestamp) -> Windows {
        match *self {
            Self::Tumbling { size } => {
                let start = ts - ts.rem_euclid(size);
                Windows {
                    next: start,
                    lowest: start,
                    size,
                    slide: size,
                    start: None,
                }
            }
            Self::Sliding { size, slide } => {
                let last = ts - ts.rem_euclid(slide);
                Windows {
                    next: last,
                    lowest: ts - size + 1,
                    size,
                    slide,
                    start: None,
                }
            }
            Self::Cumulate { size, step } => {
                let start = ts - ts.rem_euclid(size);
                // Here `next` walks the ends down to the first one past `ts`.
                Windows {
                    next: start + size,
                    lowest: ts + 1,
                    size,
                    slide: step,
                    start: Some(start),
                }
            }
            Self::Session { gap } => Windows {
                next: ts,
                lowest: ts,
                size: gap,
                slide: gap,
                start: None,
            },
        }
    }
}

/// Iterator over the windows containing one timestamp.
#[derive(Debug, Clone)]
pub struct Windows {
    /// The next window's start, or its end when `start` is fixed.
    next: i64,
    lowest: i64,
    size: i64,
    slide: i64,
    /// The start every window shares (cumulate windows).
    start: Option<i64>,
}

impl Iterator for Windows {
    type Item = (Timestamp, Timestamp);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.next < self.lowest {
            return None;
        }
        let current = self.next;
        self.next -= self.slide;
        Some(match self.start {
            Some(start) => (start, current),
            None => (current, current + self.size),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tumbling_handles_negative_times() {
        let t = WindowAssigner::Tumbling { size: 10 };
        assert_eq!(t.windows(25).collect::<Vec<_>>(), vec![(20, 30)]);
        assert_eq!(t.windows(-1).collect::<Vec<_>>(), vec![(-10, 0)]);
        assert_eq!(t.windows(0).collect::<Vec<_>>(), vec![(0, 10)]);
    }

    #[test]
    fn sliding_covers_every_window_containing_the_time() {
        let s = WindowAssigner::Sliding { size: 10, slide: 2 };
        let w: Vec<_> = s.windows(13).collect();
        assert_eq!(w, vec![(12, 22), (10, 20), (8, 18), (6, 16), (4, 14)]);
        for (start, end) in w {
            assert!(start <= 13 && 13 < end);
        }
    }

    #[test]
    fn cumulate_windows_share_their_start_and_end_every_step() {
        let c = WindowAssigner::Cumulate { size: 10, step: 2 };
        assert_eq!(
            c.windows(13).collect::<Vec<_>>(),
            vec![(10, 20), (10, 18), (10, 16), (10, 14)]
        );
        // The last step of a window holds the time in one window only.
        assert_eq!(c.windows(19).collect::<Vec<_>>(), vec![(10, 20)]);
        assert_eq!(c.windows(-1).collect::<Vec<_>>(), vec![(-10, 0)]);
        assert_eq!(c.windows(0).collect::<Vec<_>>().len(), 5);
        assert_eq!(c.last_window_end(13), 20);
        assert_eq!(c.panes(), (2, 10, 2));
        let spec = |size_ms, step_ms| pb::WindowSpec {
            kind: Some(pb::window_spec::Kind::Cumulate(pb::CumulateWindow {
                size_ms,
                step_ms,
            })),
            ..Default::default()
        };
        assert!(WindowAssigner::from_spec(&spec(10, 3)).is_err());
        assert_eq!(
            WindowAssigner::from_spec(&spec(10, 5)).unwrap(),
            WindowAssigner::Cumulate { size: 10, step: 5 }
        );
    }
}
