//! Turning stream indices into Arrow rows: the content of persons, auctions and bids.
//!
//! Each row is a pure function of (seed, event number): it draws only from
//! [`Rng::for_event`], in a fixed order. Columns are filled directly (plain vectors for
//! numbers, string builders with reserved capacity), so the hot loop does not allocate
//! per row.

use std::sync::{Arc, LazyLock};

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringBuilder, TimestampMillisecondArray};
use arrow::datatypes::SchemaRef;
use sluice_common::pb;

use super::config::NexmarkConfig;
use super::layout::*;
use super::schema::schema;
use sluice_common::rng::Rng;

const FIRST_NAMES: &[&str] = &[
    "Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter",
];
const LAST_NAMES: &[&str] = &[
    "Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris",
];
const CITIES: &[&str] = &[
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
];
const STATES: &[&str] = &["AZ", "CA", "ID", "OR", "WA", "WY"];
const HOT_CHANNELS: &[&str] = &["Google", "Facebook", "Baidu", "Apple"];
/// Channels other than the hot ones (`channel-0` ...).
const OTHER_CHANNELS: u64 = 100;
/// One bid in this many comes from another than a hot channel.
const HOT_CHANNEL_RATIO: u64 = 2;

/// `(channel, url)`: the hot channels, then `channel-0` ... `channel-99`.
static CHANNELS: LazyLock<Vec<(String, String)>> = LazyLock::new(|| {
    let hot = HOT_CHANNELS.iter().map(|c| {
        let url = format!(
            "https://www.nexmark.com/{}/item.htm?query=1",
            c.to_lowercase()
        );
        (c.to_string(), url)
    });
    let other = (0..OTHER_CHANNELS).map(|k| {
        let url = format!("https://www.nexmark.com/channel/item.htm?query=1&channel_id={k}");
        (format!("channel-{k}"), url)
    });
    hot.chain(other).collect()
});

/// Generates the rows of one Nexmark stream.
#[derive(Debug, Clone)]
pub struct Generator {
    cfg: NexmarkConfig,
    schema: SchemaRef,
}

impl Generator {
    /// A generator of `cfg.stream`.
    pub fn new(cfg: NexmarkConfig) -> Self {
        Generator {
            schema: schema(cfg.stream),
            cfg,
        }
    }

    /// The schema of the generated batches.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The rows of stream indices `first`, `first + stride`, ... (`count` of them).
    pub fn batch(&self, first: u64, stride: u64, count: usize) -> RecordBatch {
        let indices = (0..count as u64).map(|i| first + i * stride);
        let columns = match self.cfg.stream {
            pb::NexmarkStream::Bid => self.bids(indices, count),
            pb::NexmarkStream::Auction => self.auctions(indices, count),
            pb::NexmarkStream::Person => self.persons(indices, count),
            pb::NexmarkStream::SideInput => side_input(indices, count),
        };
        RecordBatch::try_new(self.schema.clone(), columns)
            .expect("generated columns match the Nexmark schema")
    }

    #[inline]
    fn event_time(&self, n: u64, rng: &mut Rng) -> i64 {
        let jitter = match self.cfg.max_out_of_orderness_ms {
            0 => 0,
            bound => rng.below(bound + 1),
        };
        self.cfg.base_time(n) - jitter as i64
    }

    fn bids(&self, indices: impl Iterator<Item = u64>, count: usize) -> Vec<ArrayRef> {
        let mut auction = Vec::with_capacity(count);
        let mut bidder = Vec::with_capacity(count);
        let mut price = Vec::with_capacity(count);
        let mut date_time = Vec::with_capacity(count);
        let mut channel = StringBuilder::with_capacity(count, count * 8);
        let mut url = StringBuilder::with_capacity(count, count * 64);
        let mut extra = StringBuilder::with_capacity(count, count * 6);
        let mut scratch = String::with_capacity(16);
        let channels = &*CHANNELS;
        for k in indices {
            let n = bid_event(k);
            let mut rng = Rng::for_event(self.cfg.seed, n);
            let last_a = last_auction(n);
            let a = if rng.below(HOT_AUCTION_RATIO) > 0 {
                (last_a / HOT_AUCTION_STEP) * HOT_AUCTION_STEP
            } else {
                next_auction(last_a, &mut rng)
            };
            let last_p = last_person(n);
            let p = if rng.below(HOT_BIDDER_RATIO) > 0 {
                (last_p / HOT_PERSON_STEP) * HOT_PERSON_STEP + 1
            } else {
                next_person(last_p, &mut rng)
            };
            auction.push(FIRST_AUCTION_ID + a as i64);
            bidder.push(FIRST_PERSON_ID + p as i64);
            price.push(price_from(&mut rng));
            let c = if rng.below(HOT_CHANNEL_RATIO) > 0 {
                rng.below(HOT_CHANNELS.len() as u64)
            } else {
                HOT_CHANNELS.len() as u64 + rng.below(OTHER_CHANNELS)
            };
            let (name, link) = &channels[c as usize];
            channel.append_value(name);
            url.append_value(link);
            date_time.push(self.event_time(n, &mut rng));
            extra.append_value(extra_string(&mut scratch, &mut rng));
        }
        vec![
            Arc::new(Int64Array::from(auction)),
            Arc::new(Int64Array::from(bidder)),
            Arc::new(Int64Array::from(price)),
            Arc::new(channel.finish()),
            Arc::new(url.finish()),
            Arc::new(TimestampMillisecondArray::from(date_time)),
            Arc::new(extra.finish()),
        ]
    }

    fn auctions(&self, indices: impl Iterator<Item = u64>, count: usize) -> Vec<ArrayRef> {
        let mut id = Vec::with_capacity(count);
        let mut item_name = StringBuilder::with_capacity(count, count * 12);
        let mut description = StringBuilder::with_capacity(count, count * 24);
        let mut initial_bid = Vec::with_capacity(count);
        let mut reserve = Vec::with_capacity(count);
        let mut date_time = Vec::with_capacity(count);
        let mut expires = Vec::with_capacity(count);
        let mut seller = Vec::with_capacity(count);
        let mut category = Vec::with_capacity(count);
        let mut extra = StringBuilder::with_capacity(count, count * 6);
        let mut scratch = String::with_capacity(32);
        // Auctions last about as long as it takes to open NUM_IN_FLIGHT_AUCTIONS more.
        let in_flight_events = NUM_IN_FLIGHT_AUCTIONS * BLOCK / AUCTION_PROPORTION;
        for k in indices {
            let n = auction_event(k);
            let mut rng = Rng::for_event(self.cfg.seed, n);
            id.push(FIRST_AUCTION_ID + k as i64);
            scratch.clear();
            let len = 4 + rng.below(9) as usize;
            push_letters(&mut scratch, &mut rng, len);
            item_name.append_value(&scratch);
            scratch.clear();
            let len = 10 + rng.below(21) as usize;
            push_letters(&mut scratch, &mut rng, len);
            description.append_value(&scratch);
            let initial = price_from(&mut rng);
            initial_bid.push(initial);
            reserve.push(initial + price_from(&mut rng));
            let t = self.event_time(n, &mut rng);
            date_time.push(t);
            let horizon = self.cfg.base_time(n + in_flight_events) - self.cfg.base_time(n);
            expires.push(t + 1 + rng.below((2 * horizon as u64).max(1)) as i64);
            let last_p = last_person(n);
            let s = if rng.below(HOT_SELLER_RATIO) > 0 {
                (last_p / HOT_PERSON_STEP) * HOT_PERSON_STEP
            } else {
                next_person(last_p, &mut rng)
            };
            seller.push(FIRST_PERSON_ID + s as i64);
            category.push(FIRST_CATEGORY_ID + rng.below(NUM_CATEGORIES) as i64);
            extra.append_value(extra_string(&mut scratch, &mut rng));
        }
        vec![
            Arc::new(Int64Array::from(id)),
            Arc::new(item_name.finish()),
            Arc::new(description.finish()),
            Arc::new(Int64Array::from(initial_bid)),
            Arc::new(Int64Array::from(reserve)),
            Arc::new(TimestampMillisecondArray::from(date_time)),
            Arc::new(TimestampMillisecondArray::from(expires)),
            Arc::new(Int64Array::from(seller)),
            Arc::new(Int64Array::from(category)),
            Arc::new(extra.finish()),
        ]
    }

    fn persons(&self, indices: impl Iterator<Item = u64>, count: usize) -> Vec<ArrayRef> {
        let mut id = Vec::with_capacity(count);
        let mut name = StringBuilder::with_capacity(count, count * 12);
        let mut email = StringBuilder::with_capacity(count, count * 18);
        let mut credit_card = StringBuilder::with_capacity(count, count * 19);
        let mut city = StringBuilder::with_capacity(count, count * 8);
        let mut state = StringBuilder::with_capacity(count, count * 2);
        let mut date_time = Vec::with_capacity(count);
        let mut extra = StringBuilder::with_capacity(count, count * 6);
        let mut scratch = String::with_capacity(32);
        for k in indices {
            let n = person_event(k);
            let mut rng = Rng::for_event(self.cfg.seed, n);
            id.push(FIRST_PERSON_ID + k as i64);
            scratch.clear();
            scratch.push_str(pick(FIRST_NAMES, &mut rng));
            scratch.push(' ');
            scratch.push_str(pick(LAST_NAMES, &mut rng));
            name.append_value(&scratch);
            scratch.clear();
            push_letters(&mut scratch, &mut rng, 7);
            scratch.push('@');
            push_letters(&mut scratch, &mut rng, 5);
            scratch.push_str(".com");
            email.append_value(&scratch);
            scratch.clear();
            let mut digits = rng.below(10_000_000_000_000_000);
            for group in 0..4 {
                if group > 0 {
                    scratch.push(' ');
                }
                for _ in 0..4 {
                    scratch.push(char::from(b'0' + (digits % 10) as u8));
                    digits /= 10;
                }
            }
            credit_card.append_value(&scratch);
            city.append_value(pick(CITIES, &mut rng));
            state.append_value(pick(STATES, &mut rng));
            date_time.push(self.event_time(n, &mut rng));
            extra.append_value(extra_string(&mut scratch, &mut rng));
        }
        vec![
            Arc::new(Int64Array::from(id)),
            Arc::new(name.finish()),
            Arc::new(email.finish()),
            Arc::new(credit_card.finish()),
            Arc::new(city.finish()),
            Arc::new(state.finish()),
            Arc::new(TimestampMillisecondArray::from(date_time)),
            Arc::new(extra.finish()),
        ]
    }
}

/// A random recent person (base 0), possibly a few ahead of the newest (Nexmark's
/// `nextBase0PersonId`).
#[inline]
fn next_person(last: u64, rng: &mut Rng) -> u64 {
    let people = last + 1;
    let active = people.min(NUM_ACTIVE_PEOPLE);
    people - active + rng.below(active + PERSON_ID_LEAD)
}

/// A random auction among those in flight, possibly a few ahead of the newest (Nexmark's
/// `nextBase0AuctionId`).
#[inline]
fn next_auction(last: u64, rng: &mut Rng) -> u64 {
    let min = last.saturating_sub(NUM_IN_FLIGHT_AUCTIONS);
    min + rng.below(last - min + 1 + AUCTION_ID_LEAD)
}

/// A skewed price in cents: `round(10^(6u) * 100)` for uniform `u`, as Nexmark's
/// `priceFrom` (from 1.00 to 1,000,000.00).
#[inline]
fn price_from(rng: &mut Rng) -> i64 {
    (f64::exp(rng.next_f64() * 6.0 * std::f64::consts::LN_10) * 100.0).round() as i64
}

#[inline]
fn pick<'a>(values: &[&'a str], rng: &mut Rng) -> &'a str {
    values[rng.below(values.len() as u64) as usize]
}

/// Appends `len` random lowercase letters.
#[inline]
fn push_letters(buf: &mut String, rng: &mut Rng, len: usize) {
    let mut bits = 0u64;
    for i in 0..len {
        if i % 8 == 0 {
            bits = rng.next_u64();
        }
        buf.push(char::from(b'a' + (((bits & 0xFF) * 26) >> 8) as u8));
        bits >>= 8;
    }
}

/// A short filler string of 1 to 10 letters (never empty: CSV reads empty as null).
#[inline]
fn extra_string<'a>(scratch: &'a mut String, rng: &mut Rng) -> &'a str {
    scratch.clear();
    let len = 1 + rng.below(10) as usize;
    push_letters(scratch, rng, len);
    scratch
}

/// Rows `indices` of q13's side table: each key with its decimal text.
fn side_input(indices: impl Iterator<Item = u64>, count: usize) -> Vec<ArrayRef> {
    let mut key = Vec::with_capacity(count);
    let mut value = StringBuilder::with_capacity(count, count * 5);
    for k in indices {
        key.push(k as i64);
        value.append_value(k.to_string());
    }
    vec![Arc::new(Int64Array::from(key)), Arc::new(value.finish())]
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::TimestampMillisecondType;

    use super::*;

    fn config(stream: pb::NexmarkStream, ooo: u64) -> NexmarkConfig {
        NexmarkConfig::from_spec(&pb::NexmarkSource {
            stream: stream as i32,
            seed: 42,
            max_out_of_orderness_ms: ooo,
            ..Default::default()
        })
    }

    fn int_column(batch: &RecordBatch, name: &str) -> Int64Array {
        batch.column_by_name(name).unwrap().as_primitive().clone()
    }

    #[test]
    fn bids_favour_hot_auctions_and_bidders() {
        let g = Generator::new(config(pb::NexmarkStream::Bid, 0));
        let batch = g.batch(0, 1, 10_000);
        for (column, min_top_share) in [("auction", 0.40), ("bidder", 0.60)] {
            let mut counts: HashMap<i64, usize> = HashMap::new();
            for v in int_column(&batch, column).values() {
                *counts.entry(*v).or_default() += 1;
            }
            let mut freq: Vec<usize> = counts.values().copied().collect();
            freq.sort_unstable_by(|a, b| b.cmp(a));
            let top: usize = freq.iter().take(10).sum();
            let share = top as f64 / batch.num_rows() as f64;
            assert!(share > min_top_share, "{column}: top-10 share {share}");
            assert!(
                counts.len() > 100,
                "{column}: only {} distinct",
                counts.len()
            );
        }
    }

    #[test]
    fn bids_refer_to_auctions_that_exist_or_are_just_ahead() {
        let g = Generator::new(config(pb::NexmarkStream::Bid, 0));
        let batch = g.batch(0, 1, 10_000);
        for (k, a) in int_column(&batch, "auction").values().iter().enumerate() {
            let newest = FIRST_AUCTION_ID + last_auction(bid_event(k as u64)) as i64;
            assert!(*a >= FIRST_AUCTION_ID && *a <= newest + AUCTION_ID_LEAD as i64);
        }
        let prices = int_column(&batch, "price");
        assert!(
            prices
                .values()
                .iter()
                .all(|p| (100..=100_000_000).contains(p))
        );
        let cheap = prices.values().iter().filter(|p| **p < 10_000).count();
        assert!(
            cheap > 2_000 && cheap < 5_000,
            "log-uniform prices: {cheap}"
        );
    }

    #[test]
    fn event_time_is_out_of_order_within_the_bound() {
        let bound = 2_000;
        for stream in [
            pb::NexmarkStream::Bid,
            pb::NexmarkStream::Auction,
            pb::NexmarkStream::Person,
        ] {
            let g = Generator::new(config(stream, bound));
            let batch = g.batch(3, 7, 5_000);
            let times = batch.column_by_name("date_time").unwrap();
            let times = times.as_primitive::<TimestampMillisecondType>();
            let mut max = i64::MIN;
            let mut disordered = 0;
            for t in times.values() {
                assert!(
                    *t >= max.saturating_sub(bound as i64),
                    "{stream:?}: {t} < {max} - {bound}"
                );
                if *t < max {
                    disordered += 1;
                }
                max = max.max(*t);
            }
            assert!(disordered > 0, "{stream:?} is never out of order");
        }
    }

    #[test]
    fn streams_share_the_event_clock_in_ratio_1_3_46() {
        // 100 blocks of events at 10,000 events/s span 0.5 s of event time in each stream.
        let end = |stream, rows| {
            let g = Generator::new(config(stream, 0));
            let batch = g.batch(0, 1, rows);
            let times = batch.column_by_name("date_time").unwrap();
            *times
                .as_primitive::<TimestampMillisecondType>()
                .values()
                .last()
                .unwrap()
        };
        let person = end(pb::NexmarkStream::Person, 100);
        let auction = end(pb::NexmarkStream::Auction, 300);
        let bid = end(pb::NexmarkStream::Bid, 4600);
        assert!(person <= auction && auction <= bid);
        assert!(bid - person < 5, "{person} {auction} {bid}");
        assert_eq!(bid, super::super::config::BASE_TIME_MS + 499);
    }

    #[test]
    fn persons_and_auctions_have_sequential_ids_and_sane_fields() {
        let g = Generator::new(config(pb::NexmarkStream::Person, 0));
        let p = g.batch(0, 1, 50);
        assert_eq!(int_column(&p, "id").values()[..3], [1000, 1001, 1002]);
        let cc = p
            .column_by_name("credit_card")
            .unwrap()
            .as_string::<i32>()
            .value(0)
            .to_string();
        assert_eq!(cc.len(), 19, "{cc}");
        let email = p
            .column_by_name("email_address")
            .unwrap()
            .as_string::<i32>()
            .value(0)
            .to_string();
        assert!(email.ends_with(".com") && email.contains('@'), "{email}");

        let g = Generator::new(config(pb::NexmarkStream::Auction, 0));
        let a = g.batch(10, 1, 50);
        assert_eq!(int_column(&a, "id").values()[0], 1010);
        let initial = int_column(&a, "initial_bid");
        let reserve = int_column(&a, "reserve");
        assert!(
            initial
                .values()
                .iter()
                .zip(reserve.values())
                .all(|(i, r)| r > i)
        );
        let category = int_column(&a, "category");
        assert!(category.values().iter().all(|c| (10..15).contains(c)));
        let dt = a.column_by_name("date_time").unwrap();
        let ex = a.column_by_name("expires").unwrap();
        let dt = dt.as_primitive::<TimestampMillisecondType>();
        let ex = ex.as_primitive::<TimestampMillisecondType>();
        assert!(dt.values().iter().zip(ex.values()).all(|(d, e)| e > d));
    }
}
