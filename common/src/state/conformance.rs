//! The conformance suite every [`KeyedStateBackend`] must pass.
//!
//! It is ordinary (non-test) code so that other crates' tests can run it against their
//! backends: `conformance::run_all(&|| Arc::new(MyBackend::new(..))).await`. Each case is
//! also a `pub async fn` taking a fresh backend, and [`run_one`] runs a case by name, so a
//! backend can run the cases as separate tests.
//!
//! Cases check the byte-level contract first (ordering, batches, merges, ranges, binary
//! keys, large values), then the layout guarantees of [`StateTable`]s (key-group,
//! operator, state, namespace and key isolation). A failure panics with the case's name
//! and what differed.
//!
//! [`run_epochs`] checks a [`StateStore`]'s epoch lifecycle: sealed epochs survive,
//! a restore drops every later write (puts, deletes, new keys) and the state reads the
//! same through subtasks of another parallelism.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;

use super::backend::{KeyedStateBackend, WriteOp};
use super::key::{encode_key, key_group_range_bounds};
use super::store::StateStore;
use super::table::{Row, StateTable};

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
    table_scan_reads_one_key_group,
    table_partitions_are_found_and_dropped_per_key_group,
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

// ---- layout isolation, through tables ----

fn table(backend: &Arc<dyn KeyedStateBackend>, operator_id: u32, name: &'static str) -> StateTable {
    StateTable::new(backend.clone(), operator_id, name)
}

async fn put_row(t: &StateTable, key_group: u16, key: &[u8], ns: &[u8], value: &[u8]) {
    t.write(vec![WriteOp::Put {
        key: t.key(key_group, key, ns),
        value: b(value),
    }])
    .await
    .unwrap();
}

async fn get_row(t: &StateTable, key_group: u16, key: &[u8], ns: &[u8]) -> Option<Vec<u8>> {
    let mut v = t.get_many(&[t.key(key_group, key, ns)]).await.unwrap();
    v.pop().flatten().map(|v| v.to_vec())
}

async fn delete_row(t: &StateTable, key_group: u16, key: &[u8], ns: &[u8]) {
    t.write(vec![WriteOp::Delete {
        key: t.key(key_group, key, ns),
    }])
    .await
    .unwrap();
}

/// `(key, namespace, value)` of every row of `t` in `key_group`.
async fn rows_of(t: &StateTable, key_group: u16) -> Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> {
    t.scan_group(key_group, 2)
        .await
        .unwrap()
        .into_iter()
        .map(|r: Row| {
            assert_eq!(r.key_group, key_group, "a row of another key group");
            (r.key.to_vec(), r.namespace.to_vec(), r.value.to_vec())
        })
        .collect()
}

/// The same key in two key groups is two keys, and key-group ranges are byte ranges.
pub async fn key_group_isolation(backend: Arc<dyn KeyedStateBackend>) {
    let v = table(&backend, 1, "v");
    for (kg, value) in [(0u16, b"10"), (1, b"11"), (2, b"12"), (0xFFFF, b"13")] {
        put_row(&v, kg, b"key", b"", value).await;
    }
    assert_eq!(get_row(&v, 1, b"key", b"").await, Some(b"11".to_vec()));
    assert_eq!(get_row(&v, 2, b"key", b"").await, Some(b"12".to_vec()));
    assert_eq!(get_row(&v, 3, b"key", b"").await, None);

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
    assert_eq!(get_row(&v, 1, b"key", b"").await, None);
    assert_eq!(
        get_row(&v, 0, b"key", b"").await,
        Some(b"10".to_vec()),
        "deleting group 1 touched group 0"
    );
    assert_eq!(
        get_row(&v, 2, b"key", b"").await,
        Some(b"12".to_vec()),
        "deleting group 1 touched group 2"
    );
}

/// Tables of different operators or names never share rows.
pub async fn operator_and_state_name_isolation(backend: Arc<dyn KeyedStateBackend>) {
    let op1_a = table(&backend, 1, "a");
    let op2_a = table(&backend, 2, "a");
    let op1_ab = table(&backend, 1, "ab");
    let op1_b = table(&backend, 1, "b");
    put_row(&op1_a, 5, b"k", b"", b"1a").await;
    put_row(&op2_a, 5, b"k", b"", b"2a").await;
    put_row(&op1_ab, 5, b"k", b"", b"1ab").await;
    assert_eq!(get_row(&op1_a, 5, b"k", b"").await, Some(b"1a".to_vec()));
    assert_eq!(get_row(&op2_a, 5, b"k", b"").await, Some(b"2a".to_vec()));
    assert_eq!(get_row(&op1_ab, 5, b"k", b"").await, Some(b"1ab".to_vec()));
    assert_eq!(get_row(&op1_b, 5, b"k", b"").await, None);
    delete_row(&op1_a, 5, b"k", b"").await;
    assert_eq!(get_row(&op2_a, 5, b"k", b"").await, Some(b"2a".to_vec()));
    assert_eq!(get_row(&op1_ab, 5, b"k", b"").await, Some(b"1ab".to_vec()));
    assert_eq!(rows_of(&op1_a, 5).await, vec![], "table a of operator 1");
    assert_eq!(rows_of(&op1_ab, 5).await.len(), 1, "table ab of operator 1");
}

/// Namespaces of one key are independent, including namespaces that prefix each other.
pub async fn namespace_isolation(backend: Arc<dyn KeyedStateBackend>) {
    let v = table(&backend, 1, "v");
    put_row(&v, 3, b"k", b"w1", b"1").await;
    put_row(&v, 3, b"k", b"w2", b"2").await;
    put_row(&v, 3, b"k", b"", b"0").await;
    assert_eq!(get_row(&v, 3, b"k", b"w1").await, Some(b"1".to_vec()));
    assert_eq!(get_row(&v, 3, b"k", b"w2").await, Some(b"2".to_vec()));
    assert_eq!(get_row(&v, 3, b"k", b"").await, Some(b"0".to_vec()));
    assert_eq!(get_row(&v, 3, b"k", b"w").await, None);
    delete_row(&v, 3, b"k", b"w1").await;
    assert_eq!(get_row(&v, 3, b"k", b"w2").await, Some(b"2".to_vec()));
    assert_eq!(
        rows_of(&v, 3).await,
        vec![
            (b"k".to_vec(), b"".to_vec(), b"0".to_vec()),
            (b"k".to_vec(), b"w2".to_vec(), b"2".to_vec()),
        ]
    );
}

/// A key that is a prefix of another key shares nothing with it.
pub async fn prefix_keys_do_not_leak(backend: Arc<dyn KeyedStateBackend>) {
    let v = table(&backend, 1, "v");
    put_row(&v, 0, b"ab", b"c", b"1").await;
    put_row(&v, 0, b"abc", b"", b"2").await;
    put_row(&v, 0, b"", b"abc", b"3").await;
    assert_eq!(
        get_row(&v, 0, b"abc", b"").await,
        Some(b"2".to_vec()),
        "key ab + namespace c is not key abc"
    );
    assert_eq!(get_row(&v, 0, b"ab", b"c").await, Some(b"1".to_vec()));
    assert_eq!(get_row(&v, 0, b"", b"abc").await, Some(b"3".to_vec()));
    delete_row(&v, 0, b"ab", b"c").await;
    assert_eq!(get_row(&v, 0, b"ab", b"c").await, None, "deleted");
    assert_eq!(get_row(&v, 0, b"abc", b"").await, Some(b"2".to_vec()));
    assert_eq!(get_row(&v, 0, b"", b"abc").await, Some(b"3".to_vec()));
}

/// A table's scan of a key group returns that group's rows of that table only, in key
/// order, across pages.
pub async fn table_scan_reads_one_key_group(backend: Arc<dyn KeyedStateBackend>) {
    let t = table(&backend, 7, "t");
    let other = table(&backend, 7, "u");
    for i in 0u8..5 {
        put_row(&t, 9, &[i], b"", &[i]).await;
        put_row(&t, 8, &[i], b"", b"x").await;
        put_row(&t, 10, &[i], b"", b"x").await;
        put_row(&other, 9, &[i], b"", b"x").await;
    }
    let rows = rows_of(&t, 9).await;
    let want: Vec<_> = (0u8..5).map(|i| (vec![i], vec![], vec![i])).collect();
    assert_eq!(rows, want);
    assert_eq!(rows_of(&t, 11).await, vec![], "an empty key group");
}

/// A table's partitions with rows in a key group are found in order, without those of
/// another length, table or key group; dropping a partition's key group removes its rows
/// there and nothing else.
pub async fn table_partitions_are_found_and_dropped_per_key_group(
    backend: Arc<dyn KeyedStateBackend>,
) {
    let t = table(&backend, 7, "t");
    let (p1, p2, p3) = (
        t.partition(&[0, 1]),
        t.partition(&[0, 2]),
        t.partition(&[9, 0]),
    );
    for i in 0u8..3 {
        put_row(&p2, 9, &[i], b"", b"x").await;
        put_row(&p1, 9, &[i, i], &[i], b"x").await;
        put_row(&p3, 8, &[i], b"", b"x").await;
    }
    put_row(&t, 9, b"k", b"", b"the table itself").await;
    put_row(&t.partition(&[0]), 9, b"k", b"", b"a shorter name").await;
    put_row(&table(&backend, 7, "tu"), 9, b"k", b"", b"another table").await;
    put_row(&p3, 10, b"k", b"", b"x").await;
    let parts = |group| {
        let t = t.clone();
        async move {
            let found = t.partitions(group, 2).await.unwrap();
            found.iter().map(|p| p.to_vec()).collect::<Vec<_>>()
        }
    };
    assert_eq!(parts(9).await, vec![vec![0, 1], vec![0, 2]]);
    assert_eq!(parts(8).await, vec![vec![9, 0]]);
    assert_eq!(parts(11).await, Vec::<Vec<u8>>::new(), "an empty key group");
    p1.write(vec![p1.delete_group(9)]).await.unwrap();
    assert_eq!(parts(9).await, vec![vec![0, 2]], "partition [0, 1] dropped");
    assert_eq!(rows_of(&p2, 9).await.len(), 3, "the next partition is kept");
    assert_eq!(rows_of(&t, 9).await.len(), 1, "the table itself is kept");
    p3.write(vec![p3.delete_group(8)]).await.unwrap();
    assert_eq!(parts(8).await, Vec::<Vec<u8>>::new());
    assert_eq!(rows_of(&p3, 10).await.len(), 1, "another key group is kept");
}

// ---- epochs, through a store ----

macro_rules! epoch_suite {
    ($($case:ident),* $(,)?) => {
        /// The names of every epoch case, in the order [`run_epochs`] runs them.
        pub const EPOCH_CASES: &[&str] = &[$(stringify!($case)),*];

        /// Runs every epoch case, each on a fresh, empty store from `make`; panics naming
        /// the first case that fails.
        pub async fn run_epochs(make: &dyn Fn() -> Arc<dyn StateStore>) {
            $( run_case(stringify!($case), $case(make())).await; )*
        }

        /// Runs the epoch case called `name` (one of [`EPOCH_CASES`]) on a fresh, empty
        /// `store` (whose key groups are at least 16).
        ///
        /// # Panics
        /// When the case fails, or no case has that name.
        pub async fn run_epoch_one(name: &str, store: Arc<dyn StateStore>) {
            match name {
                $( stringify!($case) => run_case(name, $case(store)).await, )*
                other => panic!("no state epoch case is called `{other}`"),
            }
        }
    };
}

epoch_suite!(
    sealed_epochs_survive_a_new_attempt,
    restore_drops_later_epochs,
    restore_at_another_parallelism,
    committed_checkpoints_stay_restorable,
);

/// Key groups of the epoch cases.
const GROUPS: u32 = 16;

/// Subtask `i` of `p` over [`GROUPS`] key groups.
fn range_of(i: u32, p: u32) -> std::ops::Range<u32> {
    (i * GROUPS).div_ceil(p)..((i + 1) * GROUPS).div_ceil(p)
}

/// Writes `value` under key `k{kg}` of table `s` in every key group of `groups`.
async fn fill(backend: &Arc<dyn KeyedStateBackend>, groups: std::ops::Range<u32>, value: &[u8]) {
    let t = table(backend, 1, "s");
    let ops = groups
        .map(|g| WriteOp::Put {
            key: t.key(g as u16, format!("k{g}").as_bytes(), b""),
            value: b(value),
        })
        .collect();
    t.write(ops).await.unwrap();
}

/// Every row of table `s` as `(key group, key, value)`, read through `p` subtasks.
async fn read_all(store: &Arc<dyn StateStore>, p: u32, epoch: u64) -> Vec<(u16, String, String)> {
    let mut out = Vec::new();
    for i in 0..p {
        let backend = store.subtask(range_of(i, p), epoch);
        let t = table(&backend, 1, "s");
        for g in range_of(i, p) {
            for r in t.scan_group(g as u16, 3).await.unwrap() {
                out.push((
                    r.key_group,
                    String::from_utf8_lossy(&r.key).into_owned(),
                    String::from_utf8_lossy(&r.value).into_owned(),
                ));
            }
        }
    }
    out
}

fn expect_all(value: &str, except: &[u16]) -> Vec<(u16, String, String)> {
    (0..GROUPS as u16)
        .filter(|g| !except.contains(g))
        .map(|g| (g, format!("k{g}"), value.to_owned()))
        .collect()
}

/// What a sealed and committed epoch holds is what the next attempt's subtasks read.
pub async fn sealed_epochs_survive_a_new_attempt(store: Arc<dyn StateStore>) {
    assert_eq!(
        store.open().await.unwrap(),
        0,
        "a fresh store holds no checkpoint"
    );
    let subtasks: Vec<_> = (0..2).map(|i| store.subtask(range_of(i, 2), 1)).collect();
    for (i, s) in subtasks.iter().enumerate() {
        assert_eq!(s.open_epoch(), 1);
        fill(s, range_of(i as u32, 2), b"one").await;
        s.seal_epoch(1).await.unwrap();
        assert_eq!(s.open_epoch(), 2, "sealing 1 opens 2");
    }
    store.commit(1, &[1]).await.unwrap();
    for s in &subtasks {
        s.notify_committed(1).await.unwrap();
    }
    drop(subtasks);
    store.restore(1, 2).await.unwrap();
    assert_eq!(read_all(&store, 2, 2).await, expect_all("one", &[]));
}

/// A restore to checkpoint C undoes every write after C: overwrites, deletes and keys
/// created since, sealed or not.
pub async fn restore_drops_later_epochs(store: Arc<dyn StateStore>) {
    let s = store.subtask(0..GROUPS, 1);
    fill(&s, 0..GROUPS, b"one").await;
    s.seal_epoch(1).await.unwrap();
    store.commit(1, &[1]).await.unwrap();
    s.notify_committed(1).await.unwrap();
    // Epoch 2 (sealed, never committed): overwrite half, delete one, add new keys.
    fill(&s, 0..GROUPS / 2, b"two").await;
    let t = table(&s, 1, "s");
    t.write(vec![
        WriteOp::Delete {
            key: t.key(12, b"k12", b""),
        },
        WriteOp::Put {
            key: t.key(3, b"new", b""),
            value: b(b"two"),
        },
    ])
    .await
    .unwrap();
    s.seal_epoch(2).await.unwrap();
    assert_eq!(
        get_row(&t, 12, b"k12", b"").await,
        None,
        "deleted in epoch 2"
    );
    // Epoch 3, open: more changes that a restore must drop too.
    fill(&s, GROUPS / 2..GROUPS, b"three").await;
    t.write(vec![WriteOp::Put {
        key: t.key(5, b"newer", b""),
        value: b(b"three"),
    }])
    .await
    .unwrap();
    drop((s, t));
    store.restore(1, 2).await.unwrap();
    assert_eq!(read_all(&store, 1, 2).await, expect_all("one", &[]));
}

/// State written at one parallelism reads the same through subtasks of another, after
/// a restore (a rescale, or a restart with other workers).
pub async fn restore_at_another_parallelism(store: Arc<dyn StateStore>) {
    for i in 0..3 {
        let s = store.subtask(range_of(i, 3), 1);
        fill(&s, range_of(i, 3), b"one").await;
        s.seal_epoch(1).await.unwrap();
    }
    store.commit(1, &[1]).await.unwrap();
    store.restore(1, 2).await.unwrap();
    assert_eq!(read_all(&store, 5, 2).await, expect_all("one", &[]));
    assert_eq!(read_all(&store, 1, 2).await, expect_all("one", &[]));
    // The five-way attempt writes epoch 2, which a restore to 1 drops again.
    for i in 0..5 {
        let s = store.subtask(range_of(i, 5), 2);
        fill(&s, range_of(i, 5), b"two").await;
        s.seal_epoch(2).await.unwrap();
    }
    assert_eq!(read_all(&store, 2, 3).await, expect_all("two", &[]));
    store.restore(1, 3).await.unwrap();
    assert_eq!(read_all(&store, 2, 2).await, expect_all("one", &[]));
}

/// Checkpoints committed one after another each become the point a restore returns to.
pub async fn committed_checkpoints_stay_restorable(store: Arc<dyn StateStore>) {
    let s = store.subtask(0..GROUPS, 1);
    for (epoch, value) in [(1u64, "one"), (2, "two"), (3, "three")] {
        fill(&s, 0..GROUPS, value.as_bytes()).await;
        s.seal_epoch(epoch).await.unwrap();
        store.commit(epoch, &[epoch]).await.unwrap();
        s.notify_committed(epoch).await.unwrap();
    }
    fill(&s, 0..GROUPS, b"four").await;
    s.seal_epoch(4).await.unwrap();
    drop(s);
    store.restore(3, 2).await.unwrap();
    assert_eq!(read_all(&store, 4, 4).await, expect_all("three", &[]));
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

        async fn seal_epoch(&self, epoch: u64) -> StateResult<()> {
            self.inner.seal_epoch(epoch).await
        }

        fn open_epoch(&self) -> u64 {
            self.inner.open_epoch()
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
        assert!(CASES.len() >= 15, "{} cases", CASES.len());
    }

    #[tokio::test]
    async fn the_suite_catches_broken_backends() {
        let expectations = [
            (Fault::MergeOverwrites, "merge_on_absent_and_present"),
            (Fault::ScanEndInclusive, "scan_order_limit_bounds"),
            (Fault::ScanIgnoresLimit, "scan_order_limit_bounds"),
            (Fault::ScanIgnoresLimit, "scan_pagination"),
            (Fault::DeleteRangeIgnoresEnd, "delete_range_bounds"),
            (Fault::DeleteIgnored, "prefix_keys_do_not_leak"),
            (Fault::DeleteRangeIgnoresEnd, "key_group_isolation"),
            (Fault::GetManySortsKeys, "get_many_order_with_missing"),
            (Fault::BatchReversed, "write_batch_applies_in_order"),
            (Fault::EmptyValueIsAbsent, "empty_value_is_not_absent"),
            (Fault::DeleteIgnored, "put_get_delete_overwrite"),
            (Fault::DeleteIgnored, "operator_and_state_name_isolation"),
            (Fault::DeleteIgnored, "namespace_isolation"),
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
