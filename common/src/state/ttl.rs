//! Time-to-live of state values, and the expiry header stored in front of a value.
//!
//! A state with a TTL stores `[expires_at_ms: i64 BE]` ([`NEVER_EXPIRES`] when it never
//! expires) in front of each value; list values carry the same timestamp per element.
//! The state service's compaction filter drops values whose header has passed, for the
//! states a job declares with a TTL. No operator writes such values yet: the table API
//! takes a TTL when the first operator needs one (SQL joins).

/// Length of the expiry header.
pub const HEADER_LEN: usize = 8;

/// The expiry timestamp of a value that never expires.
pub const NEVER_EXPIRES: i64 = i64::MAX;

/// Which accesses restart a value's time to live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TtlUpdate {
    /// Only writes (as Flink's `OnCreateAndWrite`).
    #[default]
    OnCreateAndWrite,
    /// Reads and writes (as Flink's `OnReadAndWrite`).
    OnReadAndWrite,
}

/// How long a state's values live after their last qualifying access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TtlConfig {
    /// Time to live in milliseconds.
    pub ttl_ms: u64,
    /// Which accesses restart the time to live.
    pub update: TtlUpdate,
}

impl TtlConfig {
    /// Values live `ttl_ms` after they were last written.
    pub fn on_create_and_write(ttl_ms: u64) -> Self {
        Self {
            ttl_ms,
            update: TtlUpdate::OnCreateAndWrite,
        }
    }

    /// Values live `ttl_ms` after they were last read or written.
    pub fn on_read_and_write(ttl_ms: u64) -> Self {
        Self {
            ttl_ms,
            update: TtlUpdate::OnReadAndWrite,
        }
    }
}

/// The expiry timestamp of a value accessed at `now_ms` under `ttl`.
pub fn expires_at(ttl: Option<&TtlConfig>, now_ms: i64) -> i64 {
    match ttl {
        None => NEVER_EXPIRES,
        Some(t) => now_ms.saturating_add(i64::try_from(t.ttl_ms).unwrap_or(i64::MAX)),
    }
}

/// Whether a read under `ttl` restarts the time to live.
pub fn refreshes_on_read(ttl: Option<&TtlConfig>) -> bool {
    matches!(
        ttl,
        Some(TtlConfig {
            update: TtlUpdate::OnReadAndWrite,
            ..
        })
    )
}

/// Whether a value expiring at `expires_at` is dead at `now_ms`.
pub fn is_expired(expires_at: i64, now_ms: i64) -> bool {
    expires_at != NEVER_EXPIRES && expires_at <= now_ms
}

/// Appends the expiry header.
pub fn write_header(out: &mut Vec<u8>, expires_at: i64) {
    out.extend_from_slice(&expires_at.to_be_bytes());
}

/// `payload` with an expiry header in front.
pub fn wrap(expires_at: i64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    write_header(&mut out, expires_at);
    out.extend_from_slice(payload);
    out
}

/// Splits a stored value into its expiry timestamp and payload.
pub fn unwrap(stored: &[u8]) -> Result<(i64, &[u8]), String> {
    match stored.split_first_chunk::<HEADER_LEN>() {
        Some((header, payload)) => Ok((i64::from_be_bytes(*header), payload)),
        None => Err(format!(
            "value of {} bytes is shorter than its {HEADER_LEN}-byte expiry header",
            stored.len()
        )),
    }
}

/// The payload of a stored value, or `None` when it has expired at `now_ms`.
pub fn live_payload(stored: &[u8], now_ms: i64) -> Result<Option<&[u8]>, String> {
    let (expires, payload) = unwrap(stored)?;
    Ok((!is_expired(expires, now_ms)).then_some(payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_unwrap_round_trips() {
        let w = wrap(1234, b"abc");
        assert_eq!(w.len(), HEADER_LEN + 3);
        assert_eq!(unwrap(&w).unwrap(), (1234, &b"abc"[..]));
        assert!(unwrap(b"short").is_err());
    }

    #[test]
    fn expiry_is_inclusive_and_never_is_never() {
        let ttl = TtlConfig::on_create_and_write(10);
        let e = expires_at(Some(&ttl), 100);
        assert_eq!(e, 110);
        assert!(!is_expired(e, 109));
        assert!(is_expired(e, 110));
        assert_eq!(expires_at(None, 100), NEVER_EXPIRES);
        assert!(!is_expired(NEVER_EXPIRES, i64::MAX));
        assert_eq!(
            expires_at(Some(&TtlConfig::on_create_and_write(u64::MAX)), 5),
            NEVER_EXPIRES
        );
        assert_eq!(live_payload(&wrap(110, b"x"), 110).unwrap(), None);
        assert_eq!(
            live_payload(&wrap(110, b"x"), 109).unwrap(),
            Some(&b"x"[..])
        );
    }

    #[test]
    fn only_read_and_write_refreshes_on_read() {
        assert!(refreshes_on_read(Some(&TtlConfig::on_read_and_write(1))));
        assert!(!refreshes_on_read(Some(&TtlConfig::on_create_and_write(1))));
        assert!(!refreshes_on_read(None));
    }
}
