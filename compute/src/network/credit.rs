//! Consumer-side credit accounting of one remote input channel (Flink's model).
//!
//! A channel owns `exclusive` buffers and may borrow more from its gate's
//! [`FloatingPool`]. It announces credit = buffers free for the producer to fill. Each
//! buffer that arrives uses one credit; it is freed when the gate lets go of the last
//! element decoded from it ([`BufferGuard`] dropped), and then it is either announced
//! again or, when it was a floating buffer that the channel no longer needs, given back
//! to the pool. The producer's backlog, sent with every buffer, is what makes a channel
//! ask for floating buffers.
//!
//! Invariant: `in_use + announced <= exclusive + floating` at all times, so a producer
//! can never make the consumer hold more buffers than configured; a buffer sent without
//! credit is a protocol error.
//!
//! This file knows nothing of sockets or decoding; credit announcements go out through
//! the [`CreditSink`] the connection provides.

use std::sync::{Arc, Mutex};

use crate::network::frame::{ChannelId, Frame};
use crate::queue::Releasable;

/// Where credit announcements go (the connection writer).
pub type CreditSink = tokio::sync::mpsc::UnboundedSender<Frame>;

/// The floating buffers one input gate shares among its remote channels.
#[derive(Debug)]
pub struct FloatingPool {
    available: Mutex<u32>,
}

impl FloatingPool {
    /// A pool of `buffers`.
    pub fn new(buffers: u32) -> Arc<Self> {
        Arc::new(Self {
            available: Mutex::new(buffers),
        })
    }

    fn take(&self, want: u32) -> u32 {
        let mut a = self.available.lock().unwrap_or_else(|e| e.into_inner());
        let got = want.min(*a);
        *a -= got;
        got
    }

    fn give(&self, n: u32) {
        *self.available.lock().unwrap_or_else(|e| e.into_inner()) += n;
    }

    /// Buffers not lent to any channel.
    pub fn available(&self) -> u32 {
        *self.available.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct State {
    in_use: u32,
    announced: u32,
    floating: u32,
    backlog: u32,
    done: bool,
}

/// The credit of one remote input channel.
#[derive(Debug)]
pub struct InputCredit {
    id: ChannelId,
    exclusive: u32,
    pool: Arc<FloatingPool>,
    state: Mutex<State>,
    sink: CreditSink,
}

/// A snapshot for metrics.
#[derive(Debug, Default, Clone, Copy)]
pub struct CreditStats {
    /// Buffers holding data not yet let go by the gate.
    pub in_use: u32,
    /// Credit the producer may still use.
    pub announced: u32,
    /// The producer's last announced backlog.
    pub backlog: u32,
}

impl InputCredit {
    /// Credit accounting for channel `id`.
    pub fn new(id: ChannelId, exclusive: u32, pool: Arc<FloatingPool>, sink: CreditSink) -> Self {
        Self {
            id,
            exclusive: exclusive.max(1),
            pool,
            state: Mutex::new(State::default()),
            sink,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn announce(&self, credits: u32) {
        if credits > 0 {
            let _ = self.sink.send(Frame::Credit {
                id: self.id,
                credits,
            });
        }
    }

    /// Announces the exclusive buffers; called once when the connection starts.
    pub fn open(&self) {
        self.lock().announced = self.exclusive;
        self.announce(self.exclusive);
    }

    /// A buffer arrived with the producer's `backlog`; errors when it had no credit.
    pub fn on_buffer(&self, backlog: u32) -> Result<(), String> {
        let extra = {
            let mut s = self.lock();
            if s.announced == 0 {
                return Err(format!("channel {} sent a buffer without credit", self.id));
            }
            s.announced -= 1;
            s.in_use += 1;
            s.backlog = backlog;
            let want = backlog.saturating_sub(s.announced);
            let got = if want > 0 && !s.done {
                self.pool.take(want)
            } else {
                0
            };
            s.floating += got;
            s.announced += got;
            got
        };
        self.announce(extra);
        Ok(())
    }

    /// A buffer was let go of.
    pub fn release(&self) {
        let again = {
            let mut s = self.lock();
            s.in_use = s.in_use.saturating_sub(1);
            if s.done || (s.floating > 0 && s.backlog <= s.announced) {
                if s.floating > 0 {
                    s.floating -= 1;
                    self.pool.give(1);
                }
                0
            } else {
                s.announced += 1;
                1
            }
        };
        self.announce(again);
    }

    /// The channel ended: no more credit; floating buffers go back once free.
    pub fn finish(&self) {
        let mut s = self.lock();
        s.done = true;
        let idle = s.floating.min(s.announced);
        s.floating -= idle;
        s.announced = 0;
        self.pool.give(idle);
    }

    /// Current figures.
    pub fn stats(&self) -> CreditStats {
        let s = self.lock();
        CreditStats {
            in_use: s.in_use,
            announced: s.announced,
            backlog: s.backlog,
        }
    }
}

/// One received network buffer; frees its credit when the last holder lets go.
#[derive(Debug)]
pub struct BufferGuard(pub Arc<InputCredit>);

impl Drop for BufferGuard {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl Releasable for BufferGuard {}

#[cfg(test)]
mod tests {
    use super::*;

    fn credits(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Frame>) -> u32 {
        let mut n = 0;
        while let Ok(Frame::Credit { credits, .. }) = rx.try_recv() {
            n += credits;
        }
        n
    }

    #[test]
    fn credit_follows_free_buffers_and_backlog_borrows_floating() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let pool = FloatingPool::new(3);
        let id = ChannelId {
            chain: 1,
            subtask: 0,
            channel: 0,
        };
        let c = Arc::new(InputCredit::new(id, 2, pool.clone(), tx));
        c.open();
        assert_eq!(credits(&mut rx), 2);
        c.on_buffer(0).unwrap();
        c.on_buffer(0).unwrap();
        assert!(c.on_buffer(0).is_err(), "no credit left");
        assert_eq!(c.stats().announced, 0);
        // Freed: announced again.
        c.release();
        assert_eq!(credits(&mut rx), 1);
        // A backlog of 5 borrows floating buffers (3 in the pool, 1 credit already out).
        c.on_buffer(5).unwrap();
        assert_eq!(credits(&mut rx), 3);
        assert_eq!(pool.available(), 0);
        let s = c.stats();
        assert!(s.in_use + s.announced <= 2 + 3);
        // No more backlog: freed floating buffers go back to the pool.
        for _ in 0..3 {
            c.on_buffer(0).unwrap();
        }
        for _ in 0..5 {
            c.release();
        }
        assert_eq!(pool.available(), 3);
        assert_eq!(c.stats().in_use, 0);
    }
}
