//! The conformance suite every [`KeyedStateBackend`] must pass.
//!
//! It is ordinary (non-test) code so that other crates' tests can run it against their
//! backends: `conformance::run_all(&|| Arc::new(MyBackend::new(..))).await`. Each case is
//! also a `pub async fn` taking a fresh backend, and [`run_one`] runs a case by name, so a
//! backend can run the cases as separate tests.
//!
//! Cases check the byte-level contract first (ordering, batches, merges, ranges, binary
//! keys, large values), then the layout guarantees (key-group, operator, state, namespace
//! and key isolation), then the typed handles, TTL, and that batched calls equal single
//! ones. A failure panics with the case's name and what differed.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;

use super::aggregating::{AggregateFunction, AggregatingState};
use super::backend::{KeyedStateBackend, WriteOp};
use super::clock::{ManualClock, StateClock};
use super::codec::StateCodec;
use super::descriptor::StateDescriptor;
use super::error::StateError;
use super::key::{encode_key, key_group_range_bounds, key_prefix, prefix_end};
use super::list::ListState;
use super::map::MapState;
use super::reducing::ReducingState;
use super::scope::KeyScope;
use super::ttl::TtlConfig;
use super::value::ValueState;

macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        /// The names of every case, in the order [`run_all`] runs them.
        pub const CASES: &[&str] = &[$(stringify!($case)),*];

        /// Runs every case, each on a fresh backend from `make`; panics naming the first
        /// case that fails.
        pub async fn run_all(make: &dyn Fn() -> Arc<dyn KeyedStateBackend>) {
            $( run_case(stringify!($case), $case(make())).await; )*
        }

        /// Runs the case called `name` (one of [`CASES`]) on `backend`.
        ///
        /// # Panics
        /// When the case fails, or no case has that name.
        pub async fn run_one(name: &str, backend: Arc<dyn KeyedStateBackend>) {
            match name {
                $( stringify!($case) => run_case(name, $case(backend)).await, )*
                other => panic!("no state conformance case is called `{other}`"),
            }
        }
    };
}

suite!(
    put_get_delete_overwrite,
    get_many_order_with_missing,
    write_batch_applies_in_order,
    merge_on_absent_and_present,
    delete_range_bounds,
    scan_order_limit_bounds,
    scan_pagination,
    empty_value_is_not_absent,
    large_values,
    binary_keys_order_unsigned,
    key_group_isolation,
    operator_and_state_name_isolation,
    namespace_isolation,
    prefix_keys_do_not_leak,
    value_state_semantics,
    map_state_semantics,
    list_state_semantics,
    reducing_state_semantics,
    aggregating_state_semantics,
    typed_values_round_trip,
    decode_errors_surface,
    ttl_value_on_create_and_write,
    ttl_value_on_read_and_write,
    ttl_map,
    ttl_list,
    ttl_reducing_and_aggregating,
    ttl_header_honoured_without_ttl,
    batched_value_equals_single,
    batched_handles_equal_single,
);

async fn run_case(name: &str, case: impl Future<Output = ()>) {
    if let Err(panic) = AssertUnwindSafe(case).catch_unwind().await {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(non-string panic)".to_owned());
        panic!("state conformance case `{name}` failed: {message}");
    }
}

// ---- helpers ----

fn b(bytes: &[u8]) -> Bytes {
    Bytes::copy_from_slice(bytes)
}

fn put(key: &[u8], value: &[u8]) -> WriteOp {
    WriteOp::Put {
        key: b(key),
        value: b(value),
    }
}

fn delete(key: &[u8]) -> WriteOp {
    WriteOp::Delete { key: b(key) }
}

fn merge(key: &[u8], operand: &[u8]) -> WriteOp {
    WriteOp::Merge {
        key: b(key),
        operand: b(operand),
    }
}

fn delete_range(start: &[u8], end: &[u8]) -> WriteOp {
    WriteOp::DeleteRange {
        start: b(start),
        end: b(end),
    }
}

async fn write(backend: &dyn KeyedStateBackend, ops: Vec<WriteOp>) {
    backend.write(ops).await.expect("write failed");
}

async fn get(backend: &dyn KeyedStateBackend, key: &[u8]) -> Option<Vec<u8>> {
    backend
        .get(b(key))
        .await
        .expect("get failed")
        .map(|v| v.to_vec())
}

async fn scan(
    backend: &dyn KeyedStateBackend,
    start: &[u8],
    end: &[u8],
    limit: Option<usize>,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    backend
        .scan(start, end, limit)
        .await
        .expect("scan failed")
        .into_iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect()
}

async fn scan_keys(backend: &dyn KeyedStateBackend, start: &[u8], end: &[u8]) -> Vec<Vec<u8>> {
    scan(backend, start, end, None)
        .await
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

fn pairs(items: &[(&[u8], &[u8])]) -> Vec<(Vec<u8>, Vec<u8>)> {
    items
        .iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect()
}

fn clock_at(ms: i64) -> Arc<ManualClock> {
    Arc::new(ManualClock::new(ms))
}

fn desc(operator_id: u32, name: &str) -> StateDescriptor {
    StateDescriptor::new(operator_id, name)
}

fn value_state<T: StateCodec>(
    backend: &Arc<dyn KeyedStateBackend>,
    descriptor: StateDescriptor,
    clock: &Arc<ManualClock>,
) -> ValueState<T> {
    ValueState::new(Arc::clone(backend), descriptor, clock_dyn(clock))
}

fn map_state<K: StateCodec, V: StateCodec>(
    backend: &Arc<dyn KeyedStateBackend>,
    descriptor: StateDescriptor,
    clock: &Arc<ManualClock>,
) -> MapState<K, V> {
    MapState::new(Arc::clone(backend), descriptor, clock_dyn(clock))
}

fn list_state<T: StateCodec>(
    backend: &Arc<dyn KeyedStateBackend>,
    descriptor: StateDescriptor,
    clock: &Arc<ManualClock>,
) -> ListState<T> {
    ListState::new(Arc::clone(backend), descriptor, clock_dyn(clock))
}

fn sum_state(
    backend: &Arc<dyn KeyedStateBackend>,
    descriptor: StateDescriptor,
    clock: &Arc<ManualClock>,
) -> ReducingState<i64, fn(i64, i64) -> i64> {
    ReducingState::new(Arc::clone(backend), descriptor, clock_dyn(clock), |a, b| {
        a + b
    })
}

fn avg_state(
    backend: &Arc<dyn KeyedStateBackend>,
    descriptor: StateDescriptor,
    clock: &Arc<ManualClock>,
) -> AggregatingState<Average> {
    AggregatingState::new(Arc::clone(backend), descriptor, clock_dyn(clock), Average)
}

fn clock_dyn(clock: &Arc<ManualClock>) -> Arc<dyn StateClock> {
    Arc::clone(clock) as Arc<dyn StateClock>
}

/// Mean of `i64`s, accumulated as `(sum, count)`.
struct Average;

impl AggregateFunction for Average {
    type In = i64;
    type Acc = (i64, i64);
    type Out = f64;
    fn create(&self) -> (i64, i64) {
        (0, 0)
    }
    fn add(&self, acc: &mut (i64, i64), value: i64) {
        acc.0 += value;
        acc.1 += 1;
    }
    fn result(&self, acc: &(i64, i64)) -> f64 {
        acc.0 as f64 / acc.1 as f64
    }
    fn merge(&self, acc: &mut (i64, i64), other: (i64, i64)) {
        acc.0 += other.0;
        acc.1 += other.1;
    }
}

/// Every stored key of `(key_group, operator, state, key)`, any namespace.
async fn raw_keys_of(
    backend: &dyn KeyedStateBackend,
    key_group: u16,
    operator_id: u32,
    state: &str,
    key: &[u8],
) -> Vec<Vec<u8>> {
    let prefix = key_prefix(key_group, operator_id, state.as_bytes(), key);
    scan_keys(backend, &prefix, &prefix_end(&prefix)).await
}

// ---- byte-level contract ----

/// Get, put, overwrite and delete of single keys.
pub async fn put_get_delete_overwrite(backend: Arc<dyn KeyedStateBackend>) {
    let be = &*backend;
    assert_eq!(get(be, b"k").await, None, "fresh backend has no `k`");
    write(be, vec![put(b"k", b"v1")]).await;
    assert_eq!(get(be, b"k").await.as_deref(), Some(&b"v1"[..]));
    write(be, vec![put(b"k", b"value two")]).await;
    assert_eq!(
        get(be, b"k").await.as_deref(),
        Some(&b"value two"[..]),
        "overwrite"
    );
    write(be, vec![put(b"other", b"o")]).await;
    write(be, vec![delete(b"k")]).await;
    assert_eq!(get(be, b"k").await, None, "after delete");
    assert_eq!(
        get(be, b"other").await.as_deref(),
        Some(&b"o"[..]),
        "delete touched another key"
    );
    write(be, vec![delete(b"never-written")]).await;
    write(be, vec![]).await;
    assert_eq!(get(be, b"never-written").await, None);
}

/// `get_many` answers in request order, `None` for missing, repeats allowed.
pub async fn get_many_order_with_missing(backend: Arc<dyn KeyedStateBackend>) {
    let be = &*backend;
    write(be, vec![put(b"a", b"1"), put(b"c", b"3"), put(b"e", b"5")]).await;
    let keys: Vec<Bytes> = [&b"e"[..], b"b", b"a", b"a", b"c", b"z"]
        .iter()
        .map(|k| b(k))
        .collect();
    let got: Vec<Option<Vec<u8>>> = be
        .get_many(&keys)
        .await
        .expect("get_many failed")
        .into_iter()
        .map(|v| v.map(|v| v.to_vec()))
        .collect();
    let expected: Vec<Option<Vec<u8>>> = vec![
        Some(b"5".to_vec()),
        None,
        Some(b"1".to_vec()),
        Some(b"1".to_vec()),
        Some(b"3".to_vec()),
        None,
    ];
    assert_eq!(got, expected);
    let none = be.get_many(&[]).await.expect("empty get_many failed");
    assert!(none.is_empty(), "get_many of no keys returned {none:?}");
}

/// A batch applies its operations in order.
pub async fn write_batch_applies_in_order(backend: Arc<dyn KeyedStateBackend>) {
    let be = &*backend;
    write(
        be,
        vec![
            put(b"k1", b"v1"),
            delete(b"k1"),
            put(b"k2", b"a"),
            put(b"k2", b"b"),
            delete(b"k3"),
            put(b"k3", b"c"),
            put(b"k4", b"x"),
            delete_range(b"k4", b"k5"),
            merge(b"k5", b"a"),
            put(b"k5", b"b"),
            merge(b"k5", b"c"),
            put(b"k6", b"gone"),
            delete_range(b"k6", b"k7"),
            put(b"k6", b"back"),
        ],
    )
    .await;
    assert_eq!(get(be, b"k1").await, None, "put then delete");
    assert_eq!(get(be, b"k2").await.as_deref(), Some(&b"b"[..]), "put, put");
    assert_eq!(
        get(be, b"k3").await.as_deref(),
        Some(&b"c"[..]),
        "delete, put"
    );
    assert_eq!(get(be, b"k4").await, None, "put, delete_range");
    assert_eq!(
        get(be, b"k5").await.as_deref(),
        Some(&b"bc"[..]),
        "merge, put, merge"
    );
    assert_eq!(
        get(be, b"k6").await.as_deref(),
        Some(&b"back"[..]),
        "put, delete_range, put"
    );
}

/// Merge sets an absent key to the operand and appends to a present one.
pub async fn merge_on_absent_and_present(backend: Arc<dyn KeyedStateBackend>) {
    let be = &*backend;
    write(be, vec![merge(b"m", b"ab")]).await;
    assert_eq!(
        get(be, b"m").await.as_deref(),
        Some(&b"ab"[..]),
        "merge on absent"
    );
    write(be, vec![merge(b"m", b"cd")]).await;
    write(be, vec![merge(b"m", b"")]).await;
    assert_eq!(
        get(be, b"m").await.as_deref(),
        Some(&b"abcd"[..]),
        "merge on present"
    );
    write(be, vec![put(b"p", b"\x00\xff"), merge(b"p", b"\x00")]).await;
    assert_eq!(get(be, b"p").await.as_deref(), Some(&b"\x00\xff\x00"[..]));
    write(be, vec![delete(b"m")]).await;
    write(be, vec![merge(b"m", b"z")]).await;
    assert_eq!(
        get(be, b"m").await.as_deref(),
        Some(&b"z"[..]),
        "merge after delete starts afresh"
    );
    write(be, vec![merge(b"e", b"")]).await;
    assert_eq!(
        get(be, b"e").await.as_deref(),
        Some(&b""[..]),
        "empty merge on absent creates an empty value"
    );
}

/// DeleteRange removes `[start, end)`; an empty end is unbounded; inverted ranges are empty.
pub async fn delete_range_bounds(backend: Arc<dyn KeyedStateBackend>) {
    let be = &*backend;
    let all: [&[u8]; 7] = [b"a", b"b", b"b\x00", b"bz", b"c", b"d", b"\xff\xff\xff"];
    write(be, all.iter().map(|k| put(k, k)).collect()).await;
    write(be, vec![delete_range(b"b", b"c")]).await;
    assert_eq!(
        scan_keys(be, b"", b"").await,
        vec![
            b"a".to_vec(),
            b"c".to_vec(),
            b"d".to_vec(),
            b"\xff\xff\xff".to_vec()
        ],
        "delete_range [b, c) must remove b, b\\0, bz and keep c"
    );
    write(be, vec![delete_range(b"d", b"a"), delete_range(b"c", b"c")]).await;
    assert_eq!(
        scan_keys(be, b"", b"").await.len(),
        4,
        "inverted or empty ranges delete nothing"
    );
    write(be, vec![delete_range(b"c", b"")]).await;
    assert_eq!(
        scan_keys(be, b"", b"").await,
        vec![b"a".to_vec()],
        "an empty end is unbounded"
    );
}

/// Scans return `[start, end)` in key order, honouring `limit`.
pub async fn scan_order_limit_bounds(backend: Arc<dyn KeyedStateBackend>) {
    let be = &*backend;
    let keys: [&[u8]; 6] = [b"d", b"b", b"a", b"e", b"c", b"\xff"];
    write(be, keys.iter().map(|k| put(k, &[k[0], b'!'])).collect()).await;
    assert_eq!(
        scan(be, b"", b"", None).await,
        pairs(&[
            (b"a", b"a!"),
            (b"b", b"b!"),
            (b"c", b"c!"),
            (b"d", b"d!"),
            (b"e", b"e!"),
            (b"\xff", b"\xff!"),
        ]),
        "full scan in key order with values"
    );
    assert_eq!(
        scan_keys(be, b"b", b"d").await,
        vec![b"b".to_vec(), b"c".to_vec()],
        "start inclusive, end exclusive"
    );
    assert_eq!(
        scan_keys(be, b"bb", b"dd").await,
        vec![b"c".to_vec(), b"d".to_vec()],
        "bounds between keys"
    );
    assert_eq!(
        scan(be, b"b", b"", Some(2)).await,
        pairs(&[(b"b", b"b!"), (b"c", b"c!")]),
        "limit takes the first entries"
    );
    assert!(scan(be, b"", b"", Some(0)).await.is_empty(), "limit 0");
    assert_eq!(scan(be, b"", b"", Some(100)).await.len(), 6, "large limit");
    assert!(
        scan(be, b"d", b"b", None).await.is_empty(),
        "inverted range"
    );
    assert!(scan(be, b"c", b"c", None).await.is_empty(), "empty range");
    assert_eq!(
        scan_keys(be, b"e", b"").await,
        vec![b"e".to_vec(), b"\xff".to_vec()],
        "empty end is unbounded"
    );
}

/// Paging by "last key + 0x00" visits every key exactly once.
pub async fn scan_pagination(backend: Arc<dyn KeyedStateBackend>) {
    let be = &*backend;
    let keys: Vec<Vec<u8>> = (0u16..100).map(|i| i.to_be_bytes().to_vec()).collect();
    write(be, keys.iter().map(|k| put(k, b"v")).collect()).await;
    let mut seen = Vec::new();
    let mut start = Vec::new();
    loop {
        let page = scan_keys_limited(be, &start, 7).await;
        assert!(page.len() <= 7, "a page of limit 7 held {}", page.len());
        let done = page.len() < 7;
        if let Some(last) = page.last() {
            start = last.clone();
            start.push(0);
        }
        seen.extend(page);
        if done {
            break;
        }
        assert!(seen.len() <= 100, "pagination does not terminate");
    }
    assert_eq!(seen, keys);
}

async fn scan_keys_limited(be: &dyn KeyedStateBackend, start: &[u8], limit: usize) -> Vec<Vec<u8>> {
    scan(be, start, b"", Some(limit))
        .await
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

/// An empty value is present, not absent.
pub async fn empty_value_is_not_absent(backend: Arc<dyn KeyedStateBackend>) {
    let be = &*backend;
    write(be, vec![put(b"empty", b"")]).await;
    assert_eq!(get(be, b"empty").await, Some(Vec::new()));
    let many = be
        .get_many(&[b(b"empty"), b(b"absent")])
        .await
        .expect("get_many failed");
    assert_eq!(many.len(), 2);
    assert!(many[0].as_ref().is_some_and(|v| v.is_empty()), "{many:?}");
    assert!(many[1].is_none(), "{many:?}");
    assert_eq!(
        scan(be, b"", b"", None).await,
        pairs(&[(b"empty", b"")]),
        "empty values are scanned"
    );
    write(be, vec![delete(b"empty")]).await;
    assert_eq!(get(be, b"empty").await, None);
}

/// Values of a MiB and more survive put, get, scan and merge intact.
pub async fn large_values(backend: Arc<dyn KeyedStateBackend>) {
    let be = &*backend;
    let big: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    let big_key: Vec<u8> = (0..4096u32).map(|i| (i % 256) as u8).collect();
    write(be, vec![put(b"big", &big), put(&big_key, b"k")]).await;
    assert!(get(be, b"big").await == Some(big.clone()), "1 MiB get");
    assert_eq!(
        get(be, &big_key).await.as_deref(),
        Some(&b"k"[..]),
        "4 KiB key"
    );
    let scanned = scan(be, b"big", b"bih", None).await;
    assert!(
        scanned.len() == 1 && scanned[0].1 == big,
        "1 MiB value scanned intact"
    );
    write(be, vec![merge(b"big", &big)]).await;
    let merged = get(be, b"big").await.expect("merged value missing");
    assert!(
        merged.len() == 2 << 20 && merged[..1 << 20] == big[..] && merged[1 << 20..] == big[..],
        "1 MiB merged onto 1 MiB"
    );
}

/// Keys are arbitrary bytes ordered as unsigned bytes.
pub async fn binary_keys_order_unsigned(backend: Arc<dyn KeyedStateBackend>) {
    let be = &*backend;
    let keys: Vec<Vec<u8>> = vec![
        vec![0xFF, 0x00],
        vec![0x80],
        vec![0x00, 0x00],
        vec![0x7F, 0xFF],
        vec![0x00],
        vec![0xFF],
        vec![0x01, 0xFF, 0x00],
        vec![0x00, 0xFF],
    ];
    write(
        be,
        keys.iter()
            .enumerate()
            .map(|(i, k)| put(k, &[i as u8]))
            .collect(),
    )
    .await;
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(get(be, k).await, Some(vec![i as u8]), "key {k:?}");
    }
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(
        scan_keys(be, b"", b"").await,
        sorted,
        "unsigned lexicographic order"
    );
    assert_eq!(
        scan_keys(be, &[0x00], &[0x00, 0xFF]).await,
        vec![vec![0x00], vec![0x00, 0x00]],
        "bounds with 0x00 and 0xFF bytes"
    );
}

// ---- layout isolation ----

/// The same key in two key groups is two keys, and key-group ranges are byte ranges.
pub async fn key_group_isolation(backend: Arc<dyn KeyedStateBackend>) {
    let clock = clock_at(0);
    let v = value_state::<i64>(&backend, desc(1, "v"), &clock);
    for (kg, value) in [(0u16, 10i64), (1, 11), (2, 12), (0xFFFF, 13)] {
        v.set(&KeyScope::keyed(kg, b"key"), &value).await.unwrap();
    }
    assert_eq!(v.get(&KeyScope::keyed(1, b"key")).await.unwrap(), Some(11));
    assert_eq!(v.get(&KeyScope::keyed(2, b"key")).await.unwrap(), Some(12));
    assert_eq!(v.get(&KeyScope::keyed(3, b"key")).await.unwrap(), None);

    let (start, end) = key_group_range_bounds(1..3);
    let keys = scan_keys(&*backend, &start, &end).await;
    assert_eq!(
        keys,
        vec![
            encode_key(1, 1, b"v", b"key", b"").to_vec(),
            encode_key(2, 1, b"v", b"key", b"").to_vec()
        ],
        "scan of key groups [1, 3)"
    );
    let (start, end) = key_group_range_bounds(0xFFFF..0x10000);
    assert_eq!(
        scan_keys(&*backend, &start, &end).await.len(),
        1,
        "the last key group"
    );

    let (start, end) = key_group_range_bounds(1..2);
    backend
        .write(vec![WriteOp::DeleteRange {
            start: b(&start),
            end: b(&end),
        }])
        .await
        .unwrap();
    assert_eq!(v.get(&KeyScope::keyed(1, b"key")).await.unwrap(), None);
    assert_eq!(
        v.get(&KeyScope::keyed(0, b"key")).await.unwrap(),
        Some(10),
        "deleting group 1 touched group 0"
    );
    assert_eq!(
        v.get(&KeyScope::keyed(2, b"key")).await.unwrap(),
        Some(12),
        "deleting group 1 touched group 2"
    );
}

/// States of different operators or names never share keys.
pub async fn operator_and_state_name_isolation(backend: Arc<dyn KeyedStateBackend>) {
    let clock = clock_at(0);
    let s = KeyScope::keyed(5, b"k");
    let op1_a = value_state::<String>(&backend, desc(1, "a"), &clock);
    let op2_a = value_state::<String>(&backend, desc(2, "a"), &clock);
    let op1_ab = value_state::<String>(&backend, desc(1, "ab"), &clock);
    let op1_b = value_state::<String>(&backend, desc(1, "b"), &clock);
    op1_a.set(&s, &"1a".into()).await.unwrap();
    op2_a.set(&s, &"2a".into()).await.unwrap();
    op1_ab.set(&s, &"1ab".into()).await.unwrap();
    assert_eq!(op1_a.get(&s).await.unwrap().as_deref(), Some("1a"));
    assert_eq!(op2_a.get(&s).await.unwrap().as_deref(), Some("2a"));
    assert_eq!(op1_ab.get(&s).await.unwrap().as_deref(), Some("1ab"));
    assert_eq!(op1_b.get(&s).await.unwrap(), None);
    op1_a.clear(&s).await.unwrap();
    assert_eq!(op2_a.get(&s).await.unwrap().as_deref(), Some("2a"));
    assert_eq!(op1_ab.get(&s).await.unwrap().as_deref(), Some("1ab"));

    let m1 = map_state::<String, i64>(&backend, desc(1, "m"), &clock);
    let m2 = map_state::<String, i64>(&backend, desc(2, "m"), &clock);
    let m1_mm = map_state::<String, i64>(&backend, desc(1, "mm"), &clock);
    m1.put(&s, &"x".into(), &1).await.unwrap();
    m2.put(&s, &"x".into(), &2).await.unwrap();
    m1_mm.put(&s, &"x".into(), &3).await.unwrap();
    m1.clear(&s).await.unwrap();
    assert!(m1.is_empty(&s).await.unwrap());
    assert_eq!(m2.entries(&s).await.unwrap(), vec![("x".to_owned(), 2)]);
    assert_eq!(m1_mm.entries(&s).await.unwrap(), vec![("x".to_owned(), 3)]);
}

/// Namespaces of one key are independent, including namespaces that prefix each other.
pub async fn namespace_isolation(backend: Arc<dyn KeyedStateBackend>) {
    let clock = clock_at(0);
    let k = KeyScope::keyed(3, b"k");
    let v = value_state::<i64>(&backend, desc(1, "v"), &clock);
    v.set(&k.with_namespace(b"w1"), &1).await.unwrap();
    v.set(&k.with_namespace(b"w2"), &2).await.unwrap();
    v.set(&k, &0).await.unwrap();
    assert_eq!(v.get(&k.with_namespace(b"w1")).await.unwrap(), Some(1));
    assert_eq!(v.get(&k.with_namespace(b"w2")).await.unwrap(), Some(2));
    assert_eq!(v.get(&k).await.unwrap(), Some(0));
    assert_eq!(v.get(&k.with_namespace(b"w")).await.unwrap(), None);
    v.clear(&k.with_namespace(b"w1")).await.unwrap();
    assert_eq!(v.get(&k.with_namespace(b"w2")).await.unwrap(), Some(2));

    // Namespace `a` with user key "b" must not collide with namespace `ab`.
    let m = map_state::<String, i64>(&backend, desc(1, "m"), &clock);
    let (a, ab) = (k.with_namespace(b"a"), k.with_namespace(b"ab"));
    m.put(&a, &"b".into(), &1).await.unwrap();
    m.put(&ab, &String::new(), &2).await.unwrap();
    m.put(&ab, &"c".into(), &3).await.unwrap();
    assert_eq!(m.entries(&a).await.unwrap(), vec![("b".to_owned(), 1)]);
    assert_eq!(m.get(&ab, &"b".into()).await.unwrap(), None);
    assert_eq!(m.keys(&ab).await.unwrap(), vec![String::new(), "c".into()]);
    m.clear(&a).await.unwrap();
    assert!(m.is_empty(&a).await.unwrap());
    assert_eq!(
        m.keys(&ab).await.unwrap().len(),
        2,
        "clear of `a` reached `ab`"
    );

    let l = list_state::<i64>(&backend, desc(1, "l"), &clock);
    l.add(&k.with_namespace(b"x"), &1).await.unwrap();
    l.add(&k.with_namespace(b"xy"), &2).await.unwrap();
    assert_eq!(l.get(&k.with_namespace(b"x")).await.unwrap(), vec![1]);
    assert_eq!(l.get(&k.with_namespace(b"xy")).await.unwrap(), vec![2]);
}

/// A key that is a prefix of another key shares nothing with it.
pub async fn prefix_keys_do_not_leak(backend: Arc<dyn KeyedStateBackend>) {
    let clock = clock_at(0);
    let (ab, abc, empty) = (
        KeyScope::keyed(0, b"ab"),
        KeyScope::keyed(0, b"abc"),
        KeyScope::keyed(0, b""),
    );
    let m = map_state::<i64, i64>(&backend, desc(1, "m"), &clock);
    m.put(&ab, &1, &10).await.unwrap();
    m.put(&abc, &2, &20).await.unwrap();
    m.put(&empty, &3, &30).await.unwrap();
    assert_eq!(m.entries(&ab).await.unwrap(), vec![(1, 10)]);
    assert_eq!(m.entries(&abc).await.unwrap(), vec![(2, 20)]);
    assert_eq!(m.entries(&empty).await.unwrap(), vec![(3, 30)]);
    m.clear(&ab).await.unwrap();
    assert!(m.is_empty(&ab).await.unwrap());
    assert_eq!(
        m.entries(&abc).await.unwrap(),
        vec![(2, 20)],
        "clear leaked"
    );
    m.clear(&empty).await.unwrap();
    assert_eq!(
        m.entries(&abc).await.unwrap(),
        vec![(2, 20)],
        "clear leaked"
    );

    let v = value_state::<i64>(&backend, desc(1, "v"), &clock);
    v.set(&ab.with_namespace(b"c"), &1).await.unwrap();
    assert_eq!(
        v.get(&abc).await.unwrap(),
        None,
        "key ab + namespace c is not key abc"
    );
    assert_eq!(
        raw_keys_of(&*backend, 0, 1, "v", b"abc").await.len(),
        0,
        "key abc's prefix holds key ab's state"
    );
}

// ---- typed handles ----

/// ValueState get, set, overwrite, clear.
pub async fn value_state_semantics(backend: Arc<dyn KeyedStateBackend>) {
    let clock = clock_at(0);
    let s = KeyScope::new(9, b"user-1", b"ns");
    let v = value_state::<String>(&backend, desc(4, "name"), &clock);
    assert_eq!(v.get(&s).await.unwrap(), None);
    v.set(&s, &"alice".into()).await.unwrap();
    assert_eq!(v.get(&s).await.unwrap().as_deref(), Some("alice"));
    v.set(&s, &"bob".into()).await.unwrap();
    assert_eq!(v.get(&s).await.unwrap().as_deref(), Some("bob"));
    v.set(&s, &String::new()).await.unwrap();
    assert_eq!(
        v.get(&s).await.unwrap().as_deref(),
        Some(""),
        "empty string is a value"
    );
    v.clear(&s).await.unwrap();
    assert_eq!(v.get(&s).await.unwrap(), None);
    v.clear(&s).await.unwrap();

    let o = value_state::<Option<i64>>(&backend, desc(4, "opt"), &clock);
    o.set(&s, &None).await.unwrap();
    assert_eq!(
        o.get(&s).await.unwrap(),
        Some(None),
        "a stored None is not absent"
    );
    assert_eq!(v.descriptor().name, "name");
}

/// MapState put, get, contains, remove, entries order, keys, is_empty, clear.
pub async fn map_state_semantics(backend: Arc<dyn KeyedStateBackend>) {
    let clock = clock_at(0);
    let s = KeyScope::new(2, b"k", b"w");
    let m = map_state::<i64, String>(&backend, desc(1, "m"), &clock);
    assert!(m.is_empty(&s).await.unwrap());
    assert!(m.entries(&s).await.unwrap().is_empty());
    assert_eq!(m.get(&s, &1).await.unwrap(), None);
    for k in [10i64, -5, 3, 0, i64::MIN, i64::MAX] {
        m.put(&s, &k, &format!("v{k}")).await.unwrap();
    }
    assert!(!m.is_empty(&s).await.unwrap());
    assert_eq!(
        m.keys(&s).await.unwrap(),
        vec![i64::MIN, -5, 0, 3, 10, i64::MAX],
        "entries in numeric order of integer keys"
    );
    assert_eq!(m.get(&s, &3).await.unwrap().as_deref(), Some("v3"));
    assert!(m.contains(&s, &-5).await.unwrap());
    assert!(!m.contains(&s, &4).await.unwrap());
    m.put(&s, &3, &"three".into()).await.unwrap();
    m.remove(&s, &-5).await.unwrap();
    m.remove(&s, &42).await.unwrap();
    let entries = m.entries(&s).await.unwrap();
    assert_eq!(
        entries,
        vec![
            (i64::MIN, format!("v{}", i64::MIN)),
            (0, "v0".into()),
            (3, "three".into()),
            (10, "v10".into()),
            (i64::MAX, format!("v{}", i64::MAX)),
        ]
    );
    m.clear(&s).await.unwrap();
    assert!(m.is_empty(&s).await.unwrap());
    assert!(m.keys(&s).await.unwrap().is_empty());

    let pairs_map = map_state::<(String, String), ()>(&backend, desc(1, "set"), &clock);
    pairs_map
        .put(&s, &("a".into(), "bc".into()), &())
        .await
        .unwrap();
    pairs_map
        .put(&s, &("ab".into(), "c".into()), &())
        .await
        .unwrap();
    assert_eq!(pairs_map.keys(&s).await.unwrap().len(), 2);
    assert!(
        pairs_map
            .contains(&s, &("a".into(), "bc".into()))
            .await
            .unwrap()
    );
    assert!(
        !pairs_map
            .contains(&s, &("a".into(), "b".into()))
            .await
            .unwrap()
    );
}

/// ListState add, add_all, get, update, clear.
pub async fn list_state_semantics(backend: Arc<dyn KeyedStateBackend>) {
    let clock = clock_at(0);
    let s = KeyScope::new(7, b"k", b"");
    let l = list_state::<String>(&backend, desc(1, "l"), &clock);
    assert!(l.get(&s).await.unwrap().is_empty());
    l.add(&s, &"a".into()).await.unwrap();
    l.add(&s, &String::new()).await.unwrap();
    l.add_all(&s, &["b".into(), "a".into()]).await.unwrap();
    l.add_all(&s, &[]).await.unwrap();
    assert_eq!(l.get(&s).await.unwrap(), vec!["a", "", "b", "a"]);
    l.update(&s, &["x".into(), "y".into()]).await.unwrap();
    assert_eq!(l.get(&s).await.unwrap(), vec!["x", "y"]);
    l.add(&s, &"z".into()).await.unwrap();
    assert_eq!(l.get(&s).await.unwrap(), vec!["x", "y", "z"]);
    l.update(&s, &[]).await.unwrap();
    assert!(l.get(&s).await.unwrap().is_empty(), "update with nothing");
    assert!(
        raw_keys_of(&*backend, 7, 1, "l", b"k").await.is_empty(),
        "an emptied list leaves no key"
    );
    l.add(&s, &"q".into()).await.unwrap();
    l.clear(&s).await.unwrap();
    assert!(l.get(&s).await.unwrap().is_empty());
}

/// ReducingState folds in order, starts over after clear.
pub async fn reducing_state_semantics(backend: Arc<dyn KeyedStateBackend>) {
    let clock = clock_at(0);
    let s = KeyScope::keyed(1, b"k");
    let sum = sum_state(&backend, desc(1, "sum"), &clock);
    assert_eq!(sum.get(&s).await.unwrap(), None);
    for v in [1, 2, 3] {
        sum.add(&s, v).await.unwrap();
    }
    assert_eq!(sum.get(&s).await.unwrap(), Some(6));
    sum.clear(&s).await.unwrap();
    assert_eq!(sum.get(&s).await.unwrap(), None);
    sum.add(&s, -5).await.unwrap();
    assert_eq!(sum.get(&s).await.unwrap(), Some(-5));

    let concat = ReducingState::new(
        Arc::clone(&backend),
        desc(1, "concat"),
        clock_dyn(&clock),
        |a: String, b: String| a + &b,
    );
    concat.add(&s, "x".into()).await.unwrap();
    let other = KeyScope::keyed(1, b"other");
    concat
        .add_many(vec![
            (s, "a".into()),
            (other, "1".into()),
            (s, "b".into()),
            (s, "c".into()),
            (other, "2".into()),
        ])
        .await
        .unwrap();
    assert_eq!(
        concat.get(&s).await.unwrap().as_deref(),
        Some("xabc"),
        "a batch folds repeated keys in order"
    );
    assert_eq!(concat.get(&other).await.unwrap().as_deref(), Some("12"));
}

/// AggregatingState add, get, get_acc, merge_acc, clear.
pub async fn aggregating_state_semantics(backend: Arc<dyn KeyedStateBackend>) {
    let clock = clock_at(0);
    let s = KeyScope::keyed(1, b"k");
    let avg = avg_state(&backend, desc(1, "avg"), &clock);
    assert_eq!(avg.get(&s).await.unwrap(), None);
    assert_eq!(avg.get_acc(&s).await.unwrap(), None);
    avg.add(&s, 2).await.unwrap();
    avg.add(&s, 4).await.unwrap();
    assert_eq!(avg.get(&s).await.unwrap(), Some(3.0));
    assert_eq!(avg.get_acc(&s).await.unwrap(), Some((6, 2)));
    avg.merge_acc(&s, (9, 1)).await.unwrap();
    assert_eq!(avg.get_acc(&s).await.unwrap(), Some((15, 3)));
    let fresh = KeyScope::keyed(1, b"fresh");
    avg.merge_acc(&fresh, (7, 7)).await.unwrap();
    assert_eq!(
        avg.get_acc(&fresh).await.unwrap(),
        Some((7, 7)),
        "merge into absent stores the accumulator"
    );
    avg.clear(&s).await.unwrap();
    assert_eq!(avg.get(&s).await.unwrap(), None);
    avg.add_many(vec![(s, 1), (fresh, 0), (s, 3)])
        .await
        .unwrap();
    assert_eq!(avg.get_acc(&s).await.unwrap(), Some((4, 2)));
    assert_eq!(
        avg.get_many(&[s, fresh, KeyScope::keyed(1, b"none")])
            .await
            .unwrap(),
        vec![Some(2.0), Some(0.875), None]
    );
}

/// Values of every codec survive the trip through the backend.
pub async fn typed_values_round_trip(backend: Arc<dyn KeyedStateBackend>) {
    let clock = clock_at(0);
    let s = KeyScope::keyed(1, b"\x00\xff");
    let f = value_state::<f64>(&backend, desc(1, "f"), &clock);
    for x in [-0.0, 1.5e300, f64::NEG_INFINITY] {
        f.set(&s, &x).await.unwrap();
        assert_eq!(
            f.get(&s).await.unwrap().map(f64::to_bits),
            Some(x.to_bits())
        );
    }
    f.set(&s, &f64::NAN).await.unwrap();
    assert!(f.get(&s).await.unwrap().is_some_and(f64::is_nan));

    let t = value_state::<(String, i64, Vec<u8>)>(&backend, desc(1, "t"), &clock);
    let big = "ü".repeat(50_000);
    let tuple = (big.clone(), i64::MIN, vec![0, 255, 0]);
    t.set(&s, &tuple).await.unwrap();
    assert!(t.get(&s).await.unwrap() == Some(tuple), "tuple round trip");

    let bytes = value_state::<Bytes>(&backend, desc(1, "b"), &clock);
    bytes.set(&s, &Bytes::from_static(b"\x00")).await.unwrap();
    assert_eq!(&bytes.get(&s).await.unwrap().unwrap()[..], b"\x00");

    let flags = value_state::<(bool, Option<u64>)>(&backend, desc(1, "flags"), &clock);
    flags.set(&s, &(true, Some(u64::MAX))).await.unwrap();
    assert_eq!(flags.get(&s).await.unwrap(), Some((true, Some(u64::MAX))));
}

/// Bytes that do not decode come back as `StateError::Decode` naming the state.
pub async fn decode_errors_surface(backend: Arc<dyn KeyedStateBackend>) {
    let clock = clock_at(0);
    let s = KeyScope::keyed(1, b"k");
    let v = value_state::<i64>(&backend, desc(1, "bad"), &clock);
    let key = encode_key(1, 1, b"bad", b"k", b"");
    write(&*backend, vec![put(&key, b"short")]).await;
    match v.get(&s).await {
        Err(StateError::Decode { state, .. }) => assert_eq!(state, "bad"),
        other => panic!("a 5-byte value decoded as {other:?}"),
    }
    let mut wrong_len = i64::MAX.to_be_bytes().to_vec();
    wrong_len.extend_from_slice(b"abc");
    write(&*backend, vec![put(&key, &wrong_len)]).await;
    assert!(
        matches!(v.get(&s).await, Err(StateError::Decode { .. })),
        "a 3-byte i64 must not decode"
    );
    let l = list_state::<i64>(&backend, desc(1, "bad"), &clock);
    assert!(
        matches!(l.get(&s).await, Err(StateError::Decode { .. })),
        "a truncated list must not decode"
    );
}

// ---- TTL ----

/// Under `OnCreateAndWrite`, reads do not extend the life; expired values vanish.
pub async fn ttl_value_on_create_and_write(backend: Arc<dyn KeyedStateBackend>) {
    let clock = clock_at(1_000);
    let s = KeyScope::keyed(4, b"k");
    let v = value_state::<i64>(
        &backend,
        desc(1, "v").with_ttl(TtlConfig::on_create_and_write(100)),
        &clock,
    );
    v.set(&s, &1).await.unwrap();
    clock.set(1_050);
    assert_eq!(v.get(&s).await.unwrap(), Some(1));
    clock.set(1_099);
    assert_eq!(v.get(&s).await.unwrap(), Some(1), "read must not extend");
    clock.set(1_100);
    assert_eq!(v.get(&s).await.unwrap(), None, "expired at write + ttl");
    assert!(
        raw_keys_of(&*backend, 4, 1, "v", b"k").await.is_empty(),
        "an expired value read is deleted"
    );
    v.set(&s, &2).await.unwrap();
    clock.set(1_150);
    v.set(&s, &3).await.unwrap();
    clock.set(1_249);
    assert_eq!(
        v.get(&s).await.unwrap(),
        Some(3),
        "a write restarts the ttl"
    );
    clock.set(1_250);
    assert_eq!(v.get_many(&[s]).await.unwrap(), vec![None]);
}

/// Under `OnReadAndWrite`, each read restarts the time to live.
pub async fn ttl_value_on_read_and_write(backend: Arc<dyn KeyedStateBackend>) {
    let clock = clock_at(0);
    let s = KeyScope::keyed(4, b"k");
    let v = value_state::<i64>(
        &backend,
        desc(1, "v").with_ttl(TtlConfig::on_read_and_write(100)),
        &clock,
    );
    v.set(&s, &7).await.unwrap();
    clock.set(90);
    assert_eq!(v.get(&s).await.unwrap(), Some(7));
    clock.set(180);
    assert_eq!(
        v.get(&s).await.unwrap(),
        Some(7),
        "read at 90 extended to 190"
    );
    clock.set(279);
    assert_eq!(
        v.get_many(&[s]).await.unwrap(),
        vec![Some(7)],
        "read at 180 extended to 280"
    );
    clock.set(379);
    assert_eq!(
        v.get(&s).await.unwrap(),
        None,
        "no read since 279: expired at 379"
    );
}

/// Expired map entries disappear from get, contains, entries, keys and is_empty.
pub async fn ttl_map(backend: Arc<dyn KeyedStateBackend>) {
    let clock = clock_at(0);
    let s = KeyScope::new(4, b"k", b"ns");
    let m = map_state::<String, i64>(
        &backend,
        desc(1, "m").with_ttl(TtlConfig::on_create_and_write(100)),
        &clock,
    );
    m.put(&s, &"a".into(), &1).await.unwrap();
    clock.set(50);
    m.put(&s, &"b".into(), &2).await.unwrap();
    clock.set(100);
    assert_eq!(m.get(&s, &"a".into()).await.unwrap(), None);
    assert!(!m.contains(&s, &"a".into()).await.unwrap());
    assert_eq!(m.entries(&s).await.unwrap(), vec![("b".to_owned(), 2)]);
    assert_eq!(m.keys(&s).await.unwrap(), vec!["b".to_owned()]);
    assert!(!m.is_empty(&s).await.unwrap());
    assert_eq!(
        raw_keys_of(&*backend, 4, 1, "m", b"k").await.len(),
        1,
        "expired entry deleted when read"
    );
    clock.set(150);
    assert!(m.is_empty(&s).await.unwrap(), "all expired");
    assert!(m.entries(&s).await.unwrap().is_empty());

    let r = map_state::<String, i64>(
        &backend,
        desc(1, "r").with_ttl(TtlConfig::on_read_and_write(100)),
        &clock,
    );
    clock.set(1_000);
    r.put(&s, &"x".into(), &1).await.unwrap();
    r.put(&s, &"y".into(), &2).await.unwrap();
    clock.set(1_090);
    assert_eq!(r.get(&s, &"x".into()).await.unwrap(), Some(1));
    clock.set(1_150);
    assert_eq!(
        r.entries(&s).await.unwrap(),
        vec![("x".to_owned(), 1)],
        "x was read at 1090 and lives to 1190; y expired at 1100"
    );
    clock.set(1_249);
    assert_eq!(
        r.keys(&s).await.unwrap(),
        vec!["x".to_owned()],
        "entries() read x at 1150"
    );
}

/// List elements expire one by one; `get` skips and drops them.
pub async fn ttl_list(backend: Arc<dyn KeyedStateBackend>) {
    let clock = clock_at(0);
    let s = KeyScope::keyed(4, b"k");
    let l = list_state::<i64>(
        &backend,
        desc(1, "l").with_ttl(TtlConfig::on_create_and_write(100)),
        &clock,
    );
    l.add(&s, &1).await.unwrap();
    clock.set(50);
    l.add(&s, &2).await.unwrap();
    clock.set(80);
    l.add_all(&s, &[3, 4]).await.unwrap();
    clock.set(100);
    assert_eq!(l.get(&s).await.unwrap(), vec![2, 3, 4]);
    let key = encode_key(4, 1, b"l", b"k", b"");
    let stored = get(&*backend, &key).await.expect("list missing");
    assert_eq!(stored.len(), 3 * (12 + 8), "expired element rewritten away");
    clock.set(150);
    assert_eq!(l.get_many(&[s]).await.unwrap(), vec![vec![3, 4]]);
    clock.set(180);
    assert!(l.get(&s).await.unwrap().is_empty());
    assert_eq!(
        get(&*backend, &key).await,
        None,
        "fully expired list deleted"
    );

    let r = list_state::<i64>(
        &backend,
        desc(1, "r").with_ttl(TtlConfig::on_read_and_write(100)),
        &clock,
    );
    clock.set(1_000);
    r.add(&s, &1).await.unwrap();
    clock.set(1_050);
    r.add(&s, &2).await.unwrap();
    clock.set(1_090);
    assert_eq!(r.get(&s).await.unwrap(), vec![1, 2]);
    clock.set(1_189);
    assert_eq!(
        r.get(&s).await.unwrap(),
        vec![1, 2],
        "the read at 1090 extended every element"
    );
}

/// Reducing and aggregating states start afresh once their value expired.
pub async fn ttl_reducing_and_aggregating(backend: Arc<dyn KeyedStateBackend>) {
    let clock = clock_at(0);
    let s = KeyScope::keyed(4, b"k");
    let ttl = TtlConfig::on_create_and_write(100);
    let sum = sum_state(&backend, desc(1, "sum").with_ttl(ttl), &clock);
    let avg = avg_state(&backend, desc(1, "avg").with_ttl(ttl), &clock);
    sum.add(&s, 5).await.unwrap();
    avg.add(&s, 5).await.unwrap();
    clock.set(60);
    sum.add(&s, 1).await.unwrap();
    avg.add(&s, 1).await.unwrap();
    clock.set(150);
    assert_eq!(
        sum.get(&s).await.unwrap(),
        Some(6),
        "add at 60 restarted the ttl"
    );
    assert_eq!(avg.get_acc(&s).await.unwrap(), Some((6, 2)));
    clock.set(160);
    assert_eq!(sum.get(&s).await.unwrap(), None);
    sum.add(&s, 3).await.unwrap();
    avg.add(&s, 3).await.unwrap();
    assert_eq!(
        sum.get(&s).await.unwrap(),
        Some(3),
        "expired value not folded in"
    );
    assert_eq!(avg.get_acc(&s).await.unwrap(), Some((3, 1)));
}

/// A handle without TTL still honours expiry written by one with TTL (TTL turned off
/// between runs), and never expires its own writes.
pub async fn ttl_header_honoured_without_ttl(backend: Arc<dyn KeyedStateBackend>) {
    let clock = clock_at(0);
    let s = KeyScope::keyed(4, b"k");
    let with = value_state::<i64>(
        &backend,
        desc(1, "v").with_ttl(TtlConfig::on_create_and_write(100)),
        &clock,
    );
    let without = value_state::<i64>(&backend, desc(1, "v"), &clock);
    with.set(&s, &1).await.unwrap();
    assert_eq!(without.get(&s).await.unwrap(), Some(1));
    clock.set(100);
    assert_eq!(without.get(&s).await.unwrap(), None);
    without.set(&s, &2).await.unwrap();
    clock.set(i64::MAX - 1);
    assert_eq!(without.get(&s).await.unwrap(), Some(2), "no ttl, no expiry");
}

// ---- batches ----

/// `get_many`/`set_many`/`clear_many` agree with single calls.
pub async fn batched_value_equals_single(backend: Arc<dyn KeyedStateBackend>) {
    let clock = clock_at(0);
    let batched = value_state::<String>(&backend, desc(1, "batched"), &clock);
    let single = value_state::<String>(&backend, desc(1, "single"), &clock);
    let keys: Vec<Vec<u8>> = (0..50u32).map(|i| format!("key{i}").into_bytes()).collect();
    let scopes: Vec<KeyScope<'_>> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| KeyScope::new((i % 5) as u16, k, if i % 2 == 0 { b"w" } else { b"" }))
        .collect();
    let items: Vec<(KeyScope<'_>, String)> = scopes
        .iter()
        .step_by(2)
        .map(|s| (*s, format!("{s:?}")))
        .collect();
    batched.set_many(&items).await.unwrap();
    for (s, v) in &items {
        single.set(s, v).await.unwrap();
    }
    let mut lookups = scopes.clone();
    lookups.push(scopes[0]);
    lookups.push(KeyScope::keyed(1, b"missing"));
    let from_batch = batched.get_many(&lookups).await.unwrap();
    let mut from_single = Vec::new();
    for s in &lookups {
        from_single.push(single.get(s).await.unwrap());
    }
    assert_eq!(from_batch, from_single);
    assert_eq!(from_batch.len(), lookups.len());
    assert!(from_batch[0].is_some() && from_batch[1].is_none());
    assert!(batched.get_many(&[]).await.unwrap().is_empty());

    batched
        .set_many(&[(scopes[1], "first".into()), (scopes[1], "last".into())])
        .await
        .unwrap();
    assert_eq!(
        batched.get(&scopes[1]).await.unwrap().as_deref(),
        Some("last"),
        "the last of repeated scopes wins"
    );
    batched.clear_many(&scopes[..10]).await.unwrap();
    let after = batched.get_many(&scopes).await.unwrap();
    assert!(after[..10].iter().all(Option::is_none), "clear_many");
    assert_eq!(&after[10..], &from_single[10..scopes.len()]);
}

/// Batched list, map, reducing and aggregating calls agree with single calls.
pub async fn batched_handles_equal_single(backend: Arc<dyn KeyedStateBackend>) {
    let clock = clock_at(0);
    let keys: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i, 0xFF]).collect();
    let scopes: Vec<KeyScope<'_>> = keys.iter().map(|k| KeyScope::keyed(3, k)).collect();
    // Repeated scopes, in a scrambled order.
    let inputs: Vec<(KeyScope<'_>, i64)> = (0..40i64)
        .map(|i| (scopes[(i * 5 % 8) as usize], i))
        .collect();

    let lb = list_state::<i64>(&backend, desc(2, "lb"), &clock);
    let ls = list_state::<i64>(&backend, desc(2, "ls"), &clock);
    lb.add_many(&inputs).await.unwrap();
    for (s, v) in &inputs {
        ls.add(s, v).await.unwrap();
    }
    let mut single = Vec::new();
    for s in &scopes {
        single.push(ls.get(s).await.unwrap());
    }
    assert_eq!(lb.get_many(&scopes).await.unwrap(), single, "lists");

    let rb = sum_state(&backend, desc(2, "rb"), &clock);
    let rs = sum_state(&backend, desc(2, "rs"), &clock);
    rb.add(&scopes[0], 1000).await.unwrap();
    rs.add(&scopes[0], 1000).await.unwrap();
    rb.add_many(inputs.clone()).await.unwrap();
    for (s, v) in &inputs {
        rs.add(s, *v).await.unwrap();
    }
    let mut single = Vec::new();
    for s in &scopes {
        single.push(rs.get(s).await.unwrap());
    }
    assert_eq!(rb.get_many(&scopes).await.unwrap(), single, "reducing");

    let ab = avg_state(&backend, desc(2, "ab"), &clock);
    let single_avg = avg_state(&backend, desc(2, "as"), &clock);
    ab.add_many(inputs.clone()).await.unwrap();
    for (s, v) in &inputs {
        single_avg.add(s, *v).await.unwrap();
    }
    let mut single = Vec::new();
    for s in &scopes {
        single.push(single_avg.get(s).await.unwrap());
    }
    assert_eq!(ab.get_many(&scopes).await.unwrap(), single, "aggregating");

    let mb = map_state::<i64, i64>(&backend, desc(2, "mb"), &clock);
    let ms = map_state::<i64, i64>(&backend, desc(2, "ms"), &clock);
    let entries: Vec<(KeyScope<'_>, i64, i64)> =
        inputs.iter().map(|(s, v)| (*s, v % 3, *v)).collect();
    mb.put_many(&entries).await.unwrap();
    for (s, k, v) in &entries {
        ms.put(s, k, v).await.unwrap();
    }
    let lookups: Vec<(KeyScope<'_>, i64)> = scopes
        .iter()
        .flat_map(|s| (0..4).map(move |k| (*s, k)))
        .collect();
    let mut single = Vec::new();
    for (s, k) in &lookups {
        single.push(ms.get(s, k).await.unwrap());
    }
    assert_eq!(mb.get_many(&lookups).await.unwrap(), single, "map");
    for s in &scopes {
        assert_eq!(mb.entries(s).await.unwrap(), ms.entries(s).await.unwrap());
    }
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;

    use super::*;
    use crate::state::{MemoryStateBackend, StateResult};

    /// A backend with one deliberate bug, to prove the suite notices it.
    #[derive(Clone, Copy, Debug)]
    enum Fault {
        MergeOverwrites,
        ScanEndInclusive,
        ScanIgnoresLimit,
        DeleteRangeIgnoresEnd,
        GetManySortsKeys,
        BatchReversed,
        EmptyValueIsAbsent,
        DeleteIgnored,
    }

    struct Faulty {
        inner: MemoryStateBackend,
        fault: Fault,
    }

    #[async_trait]
    impl KeyedStateBackend for Faulty {
        async fn get_many(&self, keys: &[Bytes]) -> StateResult<Vec<Option<Bytes>>> {
            let mut keys = keys.to_vec();
            if let Fault::GetManySortsKeys = self.fault {
                keys.sort();
            }
            let mut values = self.inner.get_many(&keys).await?;
            if let Fault::EmptyValueIsAbsent = self.fault {
                values.iter_mut().for_each(|v| {
                    if v.as_ref().is_some_and(|v| v.is_empty()) {
                        *v = None;
                    }
                });
            }
            Ok(values)
        }

        async fn write(&self, mut ops: Vec<WriteOp>) -> StateResult<()> {
            match self.fault {
                Fault::BatchReversed => ops.reverse(),
                Fault::MergeOverwrites => {
                    for op in &mut ops {
                        if let WriteOp::Merge { key, operand } = op {
                            *op = WriteOp::Put {
                                key: key.clone(),
                                value: operand.clone(),
                            };
                        }
                    }
                }
                Fault::DeleteRangeIgnoresEnd => {
                    for op in &mut ops {
                        if let WriteOp::DeleteRange { end, .. } = op {
                            *end = Bytes::new();
                        }
                    }
                }
                Fault::DeleteIgnored => {
                    ops.retain(|op| !matches!(op, WriteOp::Delete { .. }));
                }
                _ => {}
            }
            self.inner.write(ops).await
        }

        async fn scan(
            &self,
            start: &[u8],
            end: &[u8],
            limit: Option<usize>,
        ) -> StateResult<Vec<(Bytes, Bytes)>> {
            match self.fault {
                Fault::ScanIgnoresLimit => self.inner.scan(start, end, None).await,
                Fault::ScanEndInclusive if !end.is_empty() => {
                    let mut end = end.to_vec();
                    end.push(0);
                    self.inner.scan(start, &end, limit).await
                }
                _ => self.inner.scan(start, end, limit).await,
            }
        }
    }

    fn faulty(fault: Fault) -> Arc<dyn KeyedStateBackend> {
        Arc::new(Faulty {
            inner: MemoryStateBackend::new(),
            fault,
        })
    }

    #[tokio::test]
    async fn every_case_name_runs() {
        for name in CASES {
            run_one(name, Arc::new(MemoryStateBackend::new())).await;
        }
        assert!(CASES.len() >= 20, "{} cases", CASES.len());
    }

    #[tokio::test]
    async fn the_suite_catches_broken_backends() {
        let expectations = [
            (Fault::MergeOverwrites, "merge_on_absent_and_present"),
            (Fault::MergeOverwrites, "list_state_semantics"),
            (Fault::ScanEndInclusive, "scan_order_limit_bounds"),
            (Fault::ScanIgnoresLimit, "scan_order_limit_bounds"),
            (Fault::ScanIgnoresLimit, "scan_pagination"),
            (Fault::DeleteRangeIgnoresEnd, "delete_range_bounds"),
            (Fault::DeleteRangeIgnoresEnd, "prefix_keys_do_not_leak"),
            (Fault::DeleteRangeIgnoresEnd, "key_group_isolation"),
            (Fault::GetManySortsKeys, "get_many_order_with_missing"),
            (Fault::GetManySortsKeys, "batched_value_equals_single"),
            (Fault::BatchReversed, "write_batch_applies_in_order"),
            (Fault::EmptyValueIsAbsent, "empty_value_is_not_absent"),
            (Fault::DeleteIgnored, "put_get_delete_overwrite"),
            (Fault::DeleteIgnored, "ttl_value_on_create_and_write"),
        ];
        for (fault, case) in expectations {
            let outcome = AssertUnwindSafe(run_one(case, faulty(fault)))
                .catch_unwind()
                .await;
            assert!(
                outcome.is_err(),
                "case `{case}` passed a backend with {fault:?}"
            );
        }
    }
}
