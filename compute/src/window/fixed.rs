//! Tumbling, sliding and cumulate windows: decoded accumulators per pane, in a
//! memory-bounded write-back cache over the operator's keyed state.
//!
//! # Panes and groups
//! A *pane* is a `gcd(size, slide)`-long slice of time (a tumbling window is one pane, a
//! cumulate window's panes are its steps, and its windows `[start, start + k step)`
//! share their first panes); a record belongs to one pane however many windows hold it. Each live pane is a hash
//! aggregation: its *groups* (one per key) live in a hash table over the keys' canonical
//! bytes (hashed once, XXH3, which also gives the key group), with the accumulators of
//! all groups in one vector. A batch finds or creates its rows' groups, then folds each
//! aggregate over the rows in one pass ([`accumulator::update`]). A window fires by
//! reading its panes' groups (merging them per key for a sliding window) straight into
//! result columns; a pane is dropped once the last window holding it has fired and its
//! allowed lateness passed. There are no per-key timers: what fires is decided from
//! the live panes and the watermark.
//!
//! # The cache and the backend
//! The groups are the state: the backend (memory or the state service) sees them only
//! when a checkpoint asks (dirty groups, once per epoch, in [`FixedWindows::persist`])
//! or when the cache is over its budget (whole panes are spilled, oldest first), in
//! chunks of groups so that the backend's write buffer keeps to its own budget. Windows
//! fire one at a time, each pane dropped once its last window fired, so a watermark that
//! closes many windows at once holds one window's panes and rows in memory. Rows
//! are laid out pane first (`(key group, pane, key)`), so a pane of a key group is one
//! byte range: read back at once when it fires, deleted with one range delete when it
//! goes. A small `pane_index` table lists, per key group, the panes with rows in the
//! backend; a restore reads it (not the panes) to know what is open.
//!
//! # No read for what cannot exist
//! The backend holds rows the cache does not only for panes restored from a checkpoint
//! or spilled, and per key group (`unread`). A group created in any other pane is new:
//! its read is skipped. A group created where the backend may hold its row is marked
//! *pending*: it accumulates the batch's deltas at once, and its stored value is merged
//! in when the read returns (accumulators merge in any order), so a read never holds a
//! batch up; reads are batched per batch and pipelined when the backend asks for it.
//! Everything pending is resolved before a pane fires, spills or is persisted.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use hashbrown::HashTable;
use sluice_common::key_group::key_hash;
use sluice_common::state::{StateResult, StateTable, WriteOp};
use tokio_util::task::AbortOnDropHandle;

use crate::element::Timestamp;
use crate::error::{Error, Result};
use crate::expr::aggregate::{AggFunc, ArgKind};
use crate::keyed::CacheCounters;
use crate::keyed::timers::{time_from_key, time_key as pane_key};
use crate::keys::EncodedKeys;
use crate::window::accumulator::{self, ACC_BYTES, Acc, ArgValues};
use crate::window::assigner::WindowAssigner;

/// Rows read per scan call.
const SCAN_PAGE: usize = 4096;

/// Groups written per backend write when persisting or spilling a pane.
const WRITE_CHUNK: usize = 8192;

/// Rows per batch of window results.
pub const EMIT_ROWS: usize = 8192;

/// The group's accumulators changed since the backend last saw them.
const DIRTY: u8 = 1;
/// A read of the group's stored value is outstanding: its accumulators hold only what
/// arrived since it was created.
const PENDING: u8 = 2;

fn pane_of(key: &[u8]) -> Result<Timestamp> {
    time_from_key(key).ok_or_else(|| Error::Internal(format!("a pane key of {} bytes", key.len())))
}

/// The groups of one pane.
#[derive(Default)]
struct Pane {
    table: HashTable<u32>,
    hashes: Vec<u64>,
    key_data: Vec<u8>,
    key_ends: Vec<u32>,
    key_groups: Vec<u16>,
    accs: Vec<Acc>,
    flags: Vec<u8>,
    /// Key groups whose rows of this pane the backend may hold and the cache does not.
    unread: BTreeSet<u16>,
    /// Key groups with rows of this pane in the backend.
    stored: BTreeSet<u16>,
    /// Processing time: the windows (by their ends, which tell them apart) that fired
    /// with this pane's groups in them.
    fired: BTreeSet<Timestamp>,
}

impl Pane {
    fn len(&self) -> usize {
        self.hashes.len()
    }

    fn key(&self, g: usize) -> &[u8] {
        let start = if g == 0 {
            0
        } else {
            self.key_ends[g - 1] as usize
        };
        &self.key_data[start..self.key_ends[g] as usize]
    }

    fn find(&self, hash: u64, key: &[u8]) -> Option<u32> {
        self.table
            .find(hash, |&g| self.key_matches(g as usize, key))
            .copied()
    }

    fn key_matches(&self, g: usize, key: &[u8]) -> bool {
        let start = if g == 0 {
            0
        } else {
            self.key_ends[g - 1] as usize
        };
        &self.key_data[start..self.key_ends[g] as usize] == key
    }

    /// Adds a group for `key` (absent) with empty accumulators; returns its id.
    fn insert(&mut self, hash: u64, key: &[u8], key_group: u16, naggs: usize, flags: u8) -> u32 {
        let g = self.hashes.len() as u32;
        let hashes = &self.hashes;
        self.table.insert_unique(hash, g, |&x| hashes[x as usize]);
        self.hashes.push(hash);
        self.key_data.extend_from_slice(key);
        self.key_ends.push(self.key_data.len() as u32);
        self.key_groups.push(key_group);
        self.accs.resize(self.accs.len() + naggs, Acc::default());
        self.flags.push(flags);
        g
    }

    /// Bytes the pane's buffers hold, by capacity (what the allocator gave, not what is
    /// in use: growth by doubling can hold twice the groups' bytes).
    fn bytes(&self) -> usize {
        // A hash table slot is its u32 and one control byte.
        self.table.capacity() * (size_of::<u32>() + 1)
            + self.hashes.capacity() * size_of::<u64>()
            + self.key_data.capacity()
            + self.key_ends.capacity() * size_of::<u32>()
            + self.key_groups.capacity() * size_of::<u16>()
            + self.accs.capacity() * size_of::<Acc>()
            + self.flags.capacity()
    }

    /// Drops every group (keeps what the backend holds).
    fn clear_groups(&mut self) {
        *self = Pane {
            unread: std::mem::take(&mut self.unread),
            stored: std::mem::take(&mut self.stored),
            fired: std::mem::take(&mut self.fired),
            ..Pane::default()
        };
    }
}

/// A read of stored values for groups of one pane.
struct Read {
    pane: Timestamp,
    groups: Vec<u32>,
    task: ReadTask,
}

/// A read in flight (aborted when dropped), or answered at once (a backend whose reads
/// need no overlap).
enum ReadTask {
    Spawned(AbortOnDropHandle<StateResult<Vec<Option<Bytes>>>>),
    Done(Vec<Option<Bytes>>),
}

/// Window results: per row a key, a window and its accumulators.
#[derive(Default)]
pub struct Fired {
    /// Canonical key bytes of each row, concatenated.
    pub key_data: Vec<u8>,
    /// End offset of each row's key in `key_data`.
    pub key_ends: Vec<usize>,
    /// Window start of each row.
    pub starts: Vec<Timestamp>,
    /// Window end of each row.
    pub ends: Vec<Timestamp>,
    /// `naggs` accumulators per row.
    pub accs: Vec<Acc>,
}

impl Fired {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// True when nothing fired.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// Row `i`'s key bytes.
    pub fn key(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.key_ends[i - 1] };
        &self.key_data[start..self.key_ends[i]]
    }

    /// Appends a row.
    pub fn push(&mut self, key: &[u8], start: Timestamp, end: Timestamp, accs: &[Acc]) {
        self.key_data.extend_from_slice(key);
        self.key_ends.push(self.key_data.len());
        self.starts.push(start);
        self.ends.push(end);
        self.accs.extend_from_slice(accs);
    }
}

/// Window results on their way out: rows gathered into a [`Fired`] handed to `emit`
/// every [`EMIT_ROWS`] rows.
struct Parts<'a> {
    out: Fired,
    rows: usize,
    emit: &'a mut (dyn FnMut(Fired) -> Result<()> + Send),
}

impl<'a> Parts<'a> {
    fn new(emit: &'a mut (dyn FnMut(Fired) -> Result<()> + Send)) -> Self {
        Self {
            out: Fired::default(),
            rows: 0,
            emit,
        }
    }

    fn push(&mut self, key: &[u8], start: Timestamp, end: Timestamp, accs: &[Acc]) -> Result<()> {
        self.out.push(key, start, end, accs);
        self.rows += 1;
        if self.out.len() >= EMIT_ROWS {
            (self.emit)(std::mem::take(&mut self.out))?;
        }
        Ok(())
    }

    /// Emits what is left; the rows pushed in all.
    fn finish(self) -> Result<usize> {
        if !self.out.is_empty() {
            (self.emit)(self.out)?;
        }
        Ok(self.rows)
    }
}

/// Tumbling, sliding or cumulate windows of one operator subtask.
pub struct FixedWindows {
    assigner: WindowAssigner,
    pane: i64,
    size: i64,
    funcs: Vec<(AggFunc, ArgKind)>,
    lateness: i64,
    event_time: bool,
    max_parallelism: u32,
    key_groups: Range<u32>,
    /// `(key group, pane, key)` → accumulators.
    rows: StateTable,
    /// `(key group, pane)` → nothing: panes with rows in the backend.
    index: StateTable,
    panes: BTreeMap<Timestamp, Pane>,
    /// The watermark up to which windows fired (the time, for processing time).
    fired_to: Timestamp,
    /// Per owned key group, the watermark its windows had fired to at the checkpoint
    /// the state was restored from.
    fired_through: Vec<Timestamp>,
    reads: VecDeque<Read>,
    pipelined: usize,
    budget: usize,
    bytes: usize,
    tracking: bool,
    counters: Arc<CacheCounters>,
}

/// How a [`FixedWindows`] is set up.
pub struct FixedConfig {
    /// Tumbling or sliding.
    pub assigner: WindowAssigner,
    /// The aggregates' functions and argument kinds.
    pub funcs: Vec<(AggFunc, ArgKind)>,
    /// Allowed lateness (ms; event time only).
    pub lateness: i64,
    /// Event time (else processing time).
    pub event_time: bool,
    /// The job's key groups.
    pub max_parallelism: u32,
    /// Bytes of decoded groups to keep before spilling panes.
    pub budget: usize,
    /// The job takes checkpoints: persist dirty groups at barriers.
    pub tracking: bool,
}

impl FixedWindows {
    /// The windows of a subtask owning `key_groups`, over `rows` and `index`, restored
    /// as the state's checkpoint left them: the panes with rows in the backend, and per
    /// key group the watermark its windows had fired to (`watermarks`, `MIN` for none).
    pub async fn restore(
        config: FixedConfig,
        rows: StateTable,
        index: StateTable,
        key_groups: Range<u32>,
        watermarks: Vec<Timestamp>,
        counters: Arc<CacheCounters>,
    ) -> Result<Self> {
        let (pane, size, _) = config.assigner.panes();
        let pipelined = rows.pipelined_reads();
        let fired_to = if config.event_time {
            watermarks.iter().copied().min().unwrap_or(Timestamp::MIN)
        } else {
            Timestamp::MIN
        };
        let mut w = Self {
            assigner: config.assigner,
            pane,
            size,
            funcs: config.funcs,
            lateness: if config.event_time {
                config.lateness
            } else {
                0
            },
            event_time: config.event_time,
            max_parallelism: config.max_parallelism.max(1),
            key_groups: key_groups.clone(),
            rows,
            index,
            panes: BTreeMap::new(),
            fired_to,
            fired_through: watermarks,
            reads: VecDeque::new(),
            pipelined,
            budget: config.budget.max(1),
            bytes: 0,
            tracking: config.tracking,
            counters,
        };
        for g in key_groups {
            let kg = u16::try_from(g)
                .map_err(|_| Error::Internal(format!("key group {g} out of range")))?;
            for row in w.index.scan_group(kg, SCAN_PAGE).await? {
                let start = pane_of(&row.key)?;
                let p = w.panes.entry(start).or_default();
                p.unread.insert(kg);
                p.stored.insert(kg);
            }
        }
        Ok(w)
    }

    fn naggs(&self) -> usize {
        self.funcs.len()
    }

    /// The watermark windows fired to.
    pub fn fired_to(&self) -> Timestamp {
        self.fired_to
    }

    /// True when no pane is open.
    pub fn is_empty(&self) -> bool {
        self.panes.is_empty()
    }

    /// The end of the last window holding the pane starting at `start`.
    fn last_end(&self, start: Timestamp) -> Timestamp {
        self.assigner.last_window_end(start)
    }

    /// Whether windows ending at `end` can no longer change at `watermark`.
    fn closed(&self, end: Timestamp, watermark: Timestamp) -> bool {
        self.event_time && end - 1 + self.lateness <= watermark
    }

    /// Folds a batch into its panes' groups at `watermark`. Rows whose every window is
    /// closed go to `late`; windows that had fired and were updated (allowed lateness)
    /// are emitted again into `refired`.
    pub async fn add_batch(
        &mut self,
        keys: &EncodedKeys,
        times: &[Timestamp],
        args: &[ArgValues],
        watermark: Timestamp,
        late: &mut Vec<u32>,
        refired: &mut Fired,
    ) -> Result<()> {
        self.collect_reads(false).await?;
        // Rows by pane: a batch usually spans one or two.
        let mut by_pane: Vec<(Timestamp, Vec<u32>)> = Vec::new();
        for (row, &ts) in times.iter().enumerate() {
            let start = ts - ts.rem_euclid(self.pane);
            if self.closed(self.last_end(start), watermark) {
                late.push(row as u32);
                continue;
            }
            match by_pane.iter_mut().find(|(s, _)| *s == start) {
                Some((_, rows)) => rows.push(row as u32),
                None => by_pane.push((start, vec![row as u32])),
            }
        }
        let naggs = self.naggs();
        for (start, rows) in by_pane {
            let max_parallelism = u64::from(self.max_parallelism);
            let pane = self.panes.entry(start).or_default();
            let before = pane.bytes();
            let mut groups = Vec::with_capacity(rows.len());
            let mut pending = Vec::new();
            let (mut hits, mut misses) = (0u64, 0u64);
            for &row in &rows {
                let key = keys.row(row as usize);
                let hash = key_hash(key);
                let g = match pane.find(hash, key) {
                    Some(g) => {
                        hits += 1;
                        g
                    }
                    None => {
                        misses += 1;
                        let kg = (hash % max_parallelism) as u16;
                        let unread = pane.unread.contains(&kg);
                        let flags = if unread { PENDING } else { 0 };
                        let g = pane.insert(hash, key, kg, naggs, flags);
                        if unread {
                            pending.push(g);
                        }
                        g
                    }
                };
                groups.push(g);
            }
            for (a, ((func, _), arg)) in self.funcs.iter().zip(args).enumerate() {
                for (&row, &g) in rows.iter().zip(&groups) {
                    let acc = &mut pane.accs[g as usize * naggs + a];
                    accumulator::update(*func, acc, arg, row as usize);
                }
            }
            for &g in &groups {
                pane.flags[g as usize] |= DIRTY;
            }
            self.bytes = self.bytes + pane.bytes() - before;
            self.counters.hits.fetch_add(hits, Ordering::Relaxed);
            self.counters.misses.fetch_add(misses, Ordering::Relaxed);
            if !pending.is_empty() {
                self.start_read(start, pending).await?;
            }
            // Windows of this pane that fired already, within allowed lateness.
            if self.event_time && self.lateness > 0 {
                self.refire(start, &groups, watermark, refired).await?;
            }
        }
        self.publish_bytes();
        if self.bytes > self.budget {
            self.spill().await?;
        }
        Ok(())
    }

    /// Emits again, for the keys of `groups` of pane `start`, every window of that pane
    /// that fired already and is still within allowed lateness.
    async fn refire(
        &mut self,
        start: Timestamp,
        groups: &[u32],
        watermark: Timestamp,
        out: &mut Fired,
    ) -> Result<()> {
        let windows: Vec<(Timestamp, Timestamp)> = self
            .assigner
            .windows(start)
            .filter(|&(_, end)| end - 1 <= watermark && !self.closed(end, watermark))
            .collect();
        if windows.is_empty() {
            return Ok(());
        }
        self.collect_reads(true).await?;
        let mut keys: Vec<(u16, Vec<u8>)> = {
            let pane = &self.panes[&start];
            groups
                .iter()
                .map(|&g| (pane.key_groups[g as usize], pane.key(g as usize).to_vec()))
                .collect()
        };
        keys.sort_unstable();
        keys.dedup();
        for (w, end) in windows {
            self.load_window(w, end).await?;
            for (_, key) in &keys {
                if let Some(accs) = self.window_accs(w, end, key) {
                    out.push(key, w, end, &accs);
                }
            }
        }
        Ok(())
    }

    /// The accumulators of `key` in window `[w, end)`, merged from its panes.
    fn window_accs(&self, w: Timestamp, end: Timestamp, key: &[u8]) -> Option<Vec<Acc>> {
        let naggs = self.naggs();
        let hash = key_hash(key);
        let mut merged: Option<Vec<Acc>> = None;
        let mut p = w;
        while p < end {
            if let Some(pane) = self.panes.get(&p)
                && let Some(g) = pane.find(hash, key)
            {
                let accs = &pane.accs[g as usize * naggs..(g as usize + 1) * naggs];
                match merged.as_mut() {
                    None => merged = Some(accs.to_vec()),
                    Some(m) => {
                        for ((a, b), (func, kind)) in m.iter_mut().zip(accs).zip(&self.funcs) {
                            accumulator::merge(*func, *kind, a, b);
                        }
                    }
                }
            }
            p += self.pane;
        }
        merged
    }

    /// The watermark key group `kg`'s windows had fired to at the restored checkpoint.
    fn fired_through(&self, kg: u16) -> Timestamp {
        self.fired_through
            .get(u32::from(kg).wrapping_sub(self.key_groups.start) as usize)
            .copied()
            .unwrap_or(Timestamp::MIN)
    }

    /// Starts reading the stored values of `groups` of pane `start`.
    async fn start_read(&mut self, start: Timestamp, groups: Vec<u32>) -> Result<()> {
        let pk = pane_key(start);
        let keys: Vec<Bytes> = {
            let pane = &self.panes[&start];
            groups
                .iter()
                .map(|&g| {
                    self.rows
                        .key(pane.key_groups[g as usize], &pk, pane.key(g as usize))
                })
                .collect()
        };
        self.counters
            .reads
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        let task = if self.pipelined == 0 {
            ReadTask::Done(self.rows.get_many(&keys).await?)
        } else {
            let rows = self.rows.clone();
            ReadTask::Spawned(AbortOnDropHandle::new(tokio::spawn(async move {
                rows.get_many(&keys).await
            })))
        };
        self.reads.push_back(Read {
            pane: start,
            groups,
            task,
        });
        if self.pipelined == 0 {
            self.collect_reads(true).await?;
        } else {
            while self.reads.len() > self.pipelined {
                self.apply_oldest_read().await?;
            }
        }
        Ok(())
    }

    /// Merges the answers of reads into their groups: every one when `all`, else those
    /// already answered.
    async fn collect_reads(&mut self, all: bool) -> Result<()> {
        while let Some(read) = self.reads.front() {
            let ready = match &read.task {
                ReadTask::Done(_) => true,
                ReadTask::Spawned(h) => h.is_finished(),
            };
            if !all && !ready {
                return Ok(());
            }
            self.apply_oldest_read().await?;
        }
        Ok(())
    }

    async fn apply_oldest_read(&mut self) -> Result<()> {
        let Some(mut read) = self.reads.pop_front() else {
            return Ok(());
        };
        let values = match std::mem::replace(&mut read.task, ReadTask::Done(Vec::new())) {
            ReadTask::Done(v) => v,
            ReadTask::Spawned(h) => h
                .await
                .map_err(|e| Error::Internal(format!("a state read task failed: {e}")))??,
        };
        if values.len() != read.groups.len() {
            return Err(Error::Internal(format!(
                "state returned {} values for {} keys",
                values.len(),
                read.groups.len()
            )));
        }
        let naggs = self.naggs();
        let funcs = &self.funcs;
        let Some(pane) = self.panes.get_mut(&read.pane) else {
            return Ok(());
        };
        let mut stored = Vec::with_capacity(naggs);
        for (&g, value) in read.groups.iter().zip(values) {
            let g = g as usize;
            pane.flags[g] &= !PENDING;
            let Some(bytes) = value else { continue };
            stored.clear();
            accumulator::decode(&bytes, naggs, &mut stored)?;
            for ((acc, s), (func, kind)) in pane.accs[g * naggs..(g + 1) * naggs]
                .iter_mut()
                .zip(&stored)
                .zip(funcs)
            {
                accumulator::merge(*func, *kind, acc, s);
            }
        }
        Ok(())
    }

    /// Brings every row the backend holds of pane `start` into the cache.
    async fn load_pane(&mut self, start: Timestamp) -> Result<()> {
        let unread: Vec<u16> = match self.panes.get(&start) {
            Some(p) if !p.unread.is_empty() => p.unread.iter().copied().collect(),
            _ => return Ok(()),
        };
        self.collect_reads(true).await?;
        let naggs = self.naggs();
        let pk = pane_key(start);
        for kg in unread {
            let rows = self.rows.scan_key(kg, &pk, SCAN_PAGE).await?;
            self.counters
                .reads
                .fetch_add(rows.len() as u64, Ordering::Relaxed);
            let pane = self.panes.entry(start).or_default();
            let before = pane.bytes();
            let mut stored = Vec::with_capacity(naggs);
            for row in rows {
                let key = &row.namespace;
                let hash = key_hash(key);
                if pane.find(hash, key).is_some() {
                    // The cache merged this value when the group was created.
                    continue;
                }
                let g = pane.insert(hash, key, kg, naggs, 0) as usize;
                stored.clear();
                accumulator::decode(&row.value, naggs, &mut stored)?;
                pane.accs[g * naggs..(g + 1) * naggs].copy_from_slice(&stored);
            }
            pane.unread.remove(&kg);
            self.bytes = self.bytes + pane.bytes() - before;
        }
        self.publish_bytes();
        Ok(())
    }

    /// Brings every pane of window `[w, end)` into the cache.
    async fn load_window(&mut self, w: Timestamp, end: Timestamp) -> Result<()> {
        let mut p = w;
        while p < end {
            self.load_pane(p).await?;
            p += self.pane;
        }
        Ok(())
    }

    /// Fires the windows whose end the watermark (or processing time) `to` reached, one
    /// window at a time in order of their ends, handing their rows to `emit` in parts of
    /// at most [`EMIT_ROWS`]; drops the panes no window needs any more as soon as the
    /// last window holding them fired, so firing many windows at once (the end of a
    /// bounded input, a watermark held back by a slow input) holds one window's panes in
    /// memory, not all. Stops after the window that brought the rows emitted to
    /// `max_rows` or more: returns false when due windows are left (call again with the
    /// same `to`), true when every one fired.
    pub async fn fire(
        &mut self,
        to: Timestamp,
        max_rows: usize,
        emit: &mut (dyn FnMut(Fired) -> Result<()> + Send),
    ) -> Result<bool> {
        if to <= self.fired_to && self.event_time {
            return Ok(true);
        }
        let from = self.fired_to;
        // Event time: the windows of the live panes that end in (from, to] (records for
        // a window that fired are late, or re-emitted at once within allowed lateness).
        // Processing time: every due window that has not fired, since a record may
        // arrive for a window a tick has just fired.
        let mut windows = BTreeSet::new();
        for (&start, pane) in &self.panes {
            for (w, end) in self.assigner.windows(start) {
                let due = end - 1 <= to;
                let fresh = if self.event_time {
                    end - 1 > from
                } else {
                    !pane.fired.contains(&end)
                };
                if due && fresh {
                    windows.insert((end, w));
                }
            }
        }
        let mut rows = 0;
        for (end, w) in windows {
            if rows >= max_rows {
                if self.event_time {
                    // Every window ending before this one fired.
                    self.fired_to = self.fired_to.max(end - 2);
                }
                return Ok(false);
            }
            let mut parts = Parts::new(emit);
            if self.size == self.pane {
                // One pane: its spilled rows stream out key group by key group instead
                // of coming back into the cache (the pane goes right after).
                self.emit_pane_streaming(w, end, &mut parts).await?;
            } else {
                self.load_window(w, end).await?;
                self.emit_window(w, end, &mut parts)?;
            }
            rows += parts.finish()?;
            if !self.event_time {
                let mut p = w;
                while p < end {
                    if let Some(pane) = self.panes.get_mut(&p) {
                        pane.fired.insert(end);
                    }
                    p += self.pane;
                }
            }
            // Windows fire in order of their ends: a pane whose last window ends by
            // this one's end has had all its windows fired.
            self.drop_done(|last| last <= end, to).await?;
        }
        self.fired_to = self.fired_to.max(to);
        self.drop_done(|last| last - 1 <= to, to).await?;
        Ok(true)
    }

    /// Drops the panes whose last window's end passes `fired` and whose allowed
    /// lateness passed at `to`: one range delete per key group of their rows.
    async fn drop_done(&mut self, fired: impl Fn(Timestamp) -> bool, to: Timestamp) -> Result<()> {
        let done: Vec<Timestamp> = self
            .panes
            .keys()
            .copied()
            .filter(|&s| {
                let last = self.last_end(s);
                fired(last) && (!self.event_time || last - 1 + self.lateness <= to)
            })
            .collect();
        if done.is_empty() {
            return Ok(());
        }
        self.collect_reads(true).await?;
        let mut ops = Vec::new();
        for start in done {
            let Some(pane) = self.panes.remove(&start) else {
                continue;
            };
            self.bytes -= pane.bytes().min(self.bytes);
            let pk = pane_key(start);
            // A pane of a key group is one byte range: one range delete per key
            // group, however many keys it held. The state service nets it against
            // the rows its newest committed epoch wrote, so a pane written in one
            // epoch and dropped in the next never reaches its RocksDB.
            for &kg in pane.stored.union(&pane.unread) {
                ops.push(self.rows.delete_key(kg, &pk));
                ops.push(WriteOp::Delete {
                    key: self.index.key(kg, &pk, &[]),
                });
            }
        }
        self.rows.write(ops).await?;
        self.publish_bytes();
        Ok(())
    }

    /// Hands window `[w, end)`, which is pane `w` alone, to `parts`: its cached groups,
    /// then per key group the backend may hold rows of, the stored rows with no cached
    /// group (a cached group merged its stored value when it was created), read one key
    /// group at a time and never put in the cache.
    async fn emit_pane_streaming(
        &mut self,
        w: Timestamp,
        end: Timestamp,
        parts: &mut Parts<'_>,
    ) -> Result<()> {
        self.collect_reads(true).await?;
        self.emit_window(w, end, parts)?;
        let unread: Vec<u16> = match self.panes.get(&w) {
            Some(p) => p.unread.iter().copied().collect(),
            None => return Ok(()),
        };
        let naggs = self.naggs();
        let pk = pane_key(w);
        let mut accs = Vec::with_capacity(naggs);
        for kg in unread {
            if end - 1 <= self.fired_through(kg) {
                continue;
            }
            let stored = self.rows.scan_key(kg, &pk, SCAN_PAGE).await?;
            self.counters
                .reads
                .fetch_add(stored.len() as u64, Ordering::Relaxed);
            let Some(pane) = self.panes.get(&w) else {
                break;
            };
            for row in stored {
                let key = &row.namespace;
                if pane.find(key_hash(key), key).is_some() {
                    continue;
                }
                accs.clear();
                accumulator::decode(&row.value, naggs, &mut accs)?;
                parts.push(key, w, end, &accs)?;
            }
        }
        Ok(())
    }

    /// The groups of several panes (a sliding window's), merged per key.
    fn merge_panes(&self, panes: &[&Pane]) -> Pane {
        let naggs = self.naggs();
        let mut merged = Pane::default();
        for pane in panes {
            for g in 0..pane.len() {
                let (key, hash) = (pane.key(g), pane.hashes[g]);
                let accs = &pane.accs[g * naggs..(g + 1) * naggs];
                match merged.find(hash, key) {
                    Some(m) => {
                        let m = m as usize;
                        for ((a, b), (func, kind)) in merged.accs[m * naggs..(m + 1) * naggs]
                            .iter_mut()
                            .zip(accs)
                            .zip(&self.funcs)
                        {
                            accumulator::merge(*func, *kind, a, b);
                        }
                    }
                    None => {
                        let m = merged.insert(hash, key, pane.key_groups[g], naggs, 0) as usize;
                        merged.accs[m * naggs..(m + 1) * naggs].copy_from_slice(accs);
                    }
                }
            }
        }
        merged
    }

    /// Hands window `[w, end)` of every group of its panes to `parts`.
    fn emit_window(&self, w: Timestamp, end: Timestamp, parts: &mut Parts<'_>) -> Result<()> {
        let naggs = self.naggs();
        let panes: Vec<&Pane> = (0..(end - w) / self.pane)
            .filter_map(|i| self.panes.get(&(w + i * self.pane)))
            .collect();
        let merged;
        let pane: &Pane = match panes.as_slice() {
            [pane] => pane,
            _ => {
                merged = self.merge_panes(&panes);
                &merged
            }
        };
        for g in 0..pane.len() {
            if end - 1 <= self.fired_through(pane.key_groups[g]) {
                continue;
            }
            parts.push(pane.key(g), w, end, &pane.accs[g * naggs..(g + 1) * naggs])?;
        }
        Ok(())
    }

    /// The write operations of pane `start`'s groups in `groups` that changed since the
    /// backend saw them (their rows, and the pane's index entries of key groups new to
    /// the backend), marking them clean.
    fn dirty_ops(&mut self, start: Timestamp, groups: Range<usize>) -> Vec<WriteOp> {
        let naggs = self.naggs();
        let mut ops = Vec::new();
        let Some(pane) = self.panes.get_mut(&start) else {
            return ops;
        };
        let mut buf = Vec::with_capacity(naggs * ACC_BYTES);
        let pk = pane_key(start);
        for g in groups {
            if pane.flags[g] & DIRTY == 0 {
                continue;
            }
            pane.flags[g] &= !DIRTY;
            let kg = pane.key_groups[g];
            buf.clear();
            accumulator::encode(&pane.accs[g * naggs..(g + 1) * naggs], &mut buf);
            ops.push(WriteOp::Put {
                key: self.rows.key(kg, &pk, pane.key(g)),
                value: Bytes::copy_from_slice(&buf),
            });
            if pane.stored.insert(kg) {
                ops.push(WriteOp::Put {
                    key: self.index.key(kg, &pk, &[]),
                    value: Bytes::new(),
                });
            }
        }
        ops
    }

    /// Writes the changed groups of pane `start` to the backend, [`WRITE_CHUNK`] groups
    /// per write: the backend's write buffer (and what it ships) stays within its own
    /// budget however many keys the pane holds.
    /// Returns the number of writes.
    async fn write_dirty(&mut self, start: Timestamp) -> Result<usize> {
        let len = self.panes.get(&start).map_or(0, Pane::len);
        let mut from = 0;
        let mut written = 0;
        while from < len {
            let to = (from + WRITE_CHUNK).min(len);
            let ops = self.dirty_ops(start, from..to);
            written += ops.len();
            if !ops.is_empty() {
                self.rows.write(ops).await?;
            }
            from = to;
        }
        Ok(written)
    }

    /// A barrier reached the operator: the groups that changed since the last one go to
    /// the backend (once per epoch), when the job takes checkpoints.
    pub async fn persist(&mut self) -> Result<()> {
        if !self.tracking {
            return Ok(());
        }
        self.collect_reads(true).await?;
        let starts: Vec<Timestamp> = self.panes.keys().copied().collect();
        let mut written = 0;
        for &start in &starts {
            written += self.write_dirty(start).await?;
        }
        tracing::debug!(
            panes = starts.len(),
            groups = self.panes.values().map(Pane::len).sum::<usize>(),
            written,
            first = starts.first().copied(),
            fired_to = self.fired_to,
            "persisted window state"
        );
        Ok(())
    }

    /// Spills whole panes, oldest first, until the cache is within its budget: their
    /// changed groups go to the backend, and reading them back is left to whoever
    /// needs them (a later record, or the window firing).
    async fn spill(&mut self) -> Result<()> {
        self.collect_reads(true).await?;
        let starts: Vec<Timestamp> = self.panes.keys().copied().collect();
        for start in starts {
            if self.bytes <= self.budget / 2 {
                break;
            }
            self.write_dirty(start).await?;
            let Some(pane) = self.panes.get_mut(&start) else {
                continue;
            };
            let before = pane.bytes();
            let groups = pane.len() as u64;
            let kgs: BTreeSet<u16> = pane.key_groups.iter().copied().collect();
            pane.unread.extend(kgs);
            pane.clear_groups();
            self.bytes -= before.min(self.bytes);
            self.counters.spills.fetch_add(groups, Ordering::Relaxed);
        }
        self.publish_bytes();
        Ok(())
    }

    fn publish_bytes(&self) {
        // One subtask's share: the job-wide gauge sums what every subtask last said.
        self.counters
            .bytes
            .store(self.bytes as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pane_keys_sort_like_times() {
        let times = [i64::MIN, -10_000, -1, 0, 1, 10_000, i64::MAX];
        for w in times.windows(2) {
            assert!(pane_key(w[0]) < pane_key(w[1]));
        }
        for t in times {
            assert_eq!(pane_of(&pane_key(t)).unwrap(), t);
        }
    }
}
