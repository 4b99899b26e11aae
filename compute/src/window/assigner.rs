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
            Some(pb::window_spec::Kind::Session(s)) => Ok(Self::Session {
                gap: ms(s.gap_ms, "gap")?,
            }),
            None => Err(Error::Plan(
                "the window has no kind (tumbling, sliding or session)".into(),
            )),
        }
    }

    /// Pane, window and slide lengths of a fixed-size assigner. Panes are
    /// `gcd(size, slide)` long, so every window is a whole number of panes and starts on
    /// a pane boundary (a tumbling window is a single pane).
    pub fn panes(&self) -> (i64, i64, i64) {
        let (size, slide) = match *self {
            Self::Tumbling { size } => (size, size),
            Self::Sliding { size, slide } => (size, slide),
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

    /// The `[start, end)` windows of a fixed-size assigner that contain `ts`, latest first.
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
                }
            }
            Self::Sliding { size, slide } => {
                let last = ts - ts.rem_euclid(slide);
                Windows {
                    next: last,
                    lowest: ts - size + 1,
                    size,
                    slide,
                }
            }
            Self::Session { gap } => Windows {
                next: ts,
                lowest: ts,
                size: gap,
                slide: gap,
            },
        }
    }
}

/// Iterator over the windows containing one timestamp.
#[derive(Debug, Clone)]
pub struct Windows {
    next: i64,
    lowest: i64,
    size: i64,
    slide: i64,
}

impl Iterator for Windows {
    type Item = (Timestamp, Timestamp);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.next < self.lowest {
            return None;
        }
        let start = self.next;
        self.next -= self.slide;
        Some((start, start + self.size))
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
}
