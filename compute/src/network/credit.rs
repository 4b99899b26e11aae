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
//! Invariant: `in_use + announced + withheld <= exclusive + floating` at all times, so
//! a producer can never make the consumer hold more buffers than configured; a buffer
//! sent without credit is a protocol error.
//!
//! Buffer debloating bounds a channel in bytes too ([`ChannelBound`]): every element
//! delivered to the gate is charged its size until the gate lets go of it, and while
//! the channel holds its limit a freed buffer is not announced again (its credit is
//! *withheld*, a floating one goes back to the pool) until the gate has let go of
//! enough. The same limit sets the buffer size the channel asks its producer for
//! ([`Frame::BufferSize`]).
//!
//! This file knows nothing of sockets or decoding; credit announcements go out through
//! the [`CreditSink`] the connection provides.

use std::sync::{Arc, Mutex};

use crate::network::frame::{ChannelId, Frame};
use crate::queue::{ChannelBound, Releasable};

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

#[derive(Debug, Clone, Copy)]
struct State {
    in_use: u32,
    announced: u32,
    floating: u32,
    backlog: u32,
    done: bool,
    /// Bytes of delivered elements the gate has not let go of.
    held: usize,
    /// The channel takes more buffers only while it holds less.
    limit: usize,
    /// Exclusive buffers freed while the channel held its limit, not announced yet.
    withheld: u32,
    /// The buffer size last asked of the producer (at first the configured one).
    buffer_bytes: u32,
}

/// Smallest buffer a debloated channel asks for: below it, frame headers and wake-ups
/// cost more than the memory saved.
pub const MIN_BUFFER_BYTES: usize = 1 << 10;

/// The buffer size a channel allowed to hold `limit` bytes asks its producer for: an
/// eighth of it (the producer queues up to its subpartition's buffers plus one, and
/// the channel's credit is in flight besides), within [`MIN_BUFFER_BYTES`] and `max`.
pub fn debloated_buffer_bytes(limit: usize, max: usize) -> usize {
    (limit / 8).clamp(MIN_BUFFER_BYTES.min(max), max)
}

/// The credit of one remote input channel.
#[derive(Debug)]
pub struct InputCredit {
    id: ChannelId,
    exclusive: u32,
    max_buffer_bytes: usize,
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
    /// Bytes of elements the gate has not let go of.
    pub held_bytes: usize,
    /// The buffer size the channel asks of its producer.
    pub buffer_bytes: u32,
}

impl InputCredit {
    /// Credit accounting for channel `id`, whose producer fills buffers of
    /// `max_buffer_bytes` unless asked for smaller ones.
    pub fn new(
        id: ChannelId,
        exclusive: u32,
        max_buffer_bytes: usize,
        pool: Arc<FloatingPool>,
        sink: CreditSink,
    ) -> Self {
        Self {
            id,
            exclusive: exclusive.max(1),
            max_buffer_bytes,
            pool,
            state: Mutex::new(State {
                in_use: 0,
                announced: 0,
                floating: 0,
                backlog: 0,
                done: false,
                held: 0,
                limit: usize::MAX,
                withheld: 0,
                buffer_bytes: max_buffer_bytes as u32,
            }),
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
            let got = if want > 0 && !s.done && s.held < s.limit {
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
            let full = s.held >= s.limit;
            if s.done || (s.floating > 0 && (full || s.backlog <= s.announced)) {
                if s.floating > 0 {
                    s.floating -= 1;
                    self.pool.give(1);
                }
                0
            } else if full {
                s.withheld += 1;
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
        s.withheld = 0;
        self.pool.give(idle);
    }

    /// An element of `bytes` goes to the gate; given back through [`ChannelBound`].
    pub fn charge(&self, bytes: usize) {
        self.lock().held += bytes;
    }

    /// Current figures.
    pub fn stats(&self) -> CreditStats {
        let s = self.lock();
        CreditStats {
            in_use: s.in_use,
            announced: s.announced,
            backlog: s.backlog,
            held_bytes: s.held,
            buffer_bytes: s.buffer_bytes,
        }
    }

    /// Announces withheld credit once the channel holds less than its limit.
    fn resume(&self, s: &mut State) -> u32 {
        if s.withheld == 0 || s.done || s.held >= s.limit {
            return 0;
        }
        let n = std::mem::take(&mut s.withheld);
        s.announced += n;
        n
    }
}

impl ChannelBound for InputCredit {
    fn held_bytes(&self) -> usize {
        self.lock().held
    }

    fn set_limit(&self, bytes: usize) {
        let (again, size) = {
            let mut s = self.lock();
            s.limit = bytes.max(1);
            let size = debloated_buffer_bytes(s.limit, self.max_buffer_bytes) as u32;
            let ask = (!s.done && size != s.buffer_bytes).then_some(size);
            if ask.is_some() {
                s.buffer_bytes = size;
            }
            (self.resume(&mut s), ask)
        };
        if let Some(bytes) = size {
            let _ = self.sink.send(Frame::BufferSize { id: self.id, bytes });
        }
        self.announce(again);
    }

    fn give_back(&self, bytes: usize) {
        let again = {
            let mut s = self.lock();
            s.held = s.held.saturating_sub(bytes);
            self.resume(&mut s)
        };
        self.announce(again);
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

    /// A channel with 2 exclusive buffers of 32 KiB and a pool of `floating`, opened.
    fn opened(
        floating: u32,
    ) -> (
        Arc<InputCredit>,
        Arc<FloatingPool>,
        tokio::sync::mpsc::UnboundedReceiver<Frame>,
    ) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let pool = FloatingPool::new(floating);
        let id = ChannelId {
            chain: 1,
            subtask: 0,
            channel: 0,
        };
        let c = Arc::new(InputCredit::new(id, 2, 32 << 10, pool.clone(), tx));
        c.open();
        assert_eq!(credits(&mut rx), 2);
        (c, pool, rx)
    }

    #[test]
    fn credit_follows_free_buffers_and_backlog_borrows_floating() {
        let (c, pool, mut rx) = opened(3);
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

    #[test]
    fn a_channel_at_its_byte_limit_withholds_credit_until_the_gate_lets_go() {
        let (c, pool, mut rx) = opened(4);
        // Debloating: at most 16 KiB held, and buffers of 2 KiB asked of the producer.
        c.set_limit(16 << 10);
        match rx.try_recv() {
            Ok(Frame::BufferSize { bytes, .. }) => assert_eq!(bytes, 2 << 10),
            other => panic!("expected a buffer size, got {other:?}"),
        }
        // A buffer completes a 20 KiB element: the channel holds more than its limit.
        c.on_buffer(0).unwrap();
        c.charge(20 << 10);
        c.release();
        assert_eq!(credits(&mut rx), 0, "the freed buffer's credit is withheld");
        // Nor does a backlog borrow floating buffers while over the limit.
        c.on_buffer(3).unwrap();
        assert_eq!(credits(&mut rx), 0);
        c.release();
        assert_eq!(c.stats().held_bytes, 20 << 10);
        assert_eq!(c.stats().announced, 0);
        // The gate lets go of the element: the withheld credit is announced.
        c.give_back(20 << 10);
        assert_eq!(credits(&mut rx), 2);
        let s = c.stats();
        assert_eq!((s.in_use, s.announced, s.held_bytes), (0, 2, 0));
        assert_eq!(pool.available(), 4);
    }
}
