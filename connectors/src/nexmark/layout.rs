//! Where each event sits in the global event-number space, and which ids exist when.
//!
//! Events are numbered 0, 1, 2 ... across all three streams. Every block of
//! [`BLOCK`] = 50 events holds, in this order, 1 person, 3 auctions and 46 bids (the
//! Nexmark proportions 1:3:46). The k-th event of a stream is therefore found by
//! arithmetic alone, and the ids a bid may refer to are those created before it, as in
//! the Nexmark generator (`lastBase0AuctionId`, `nextBase0PersonId` ...).

/// Persons per block.
pub const PERSON_PROPORTION: u64 = 1;
/// Auctions per block.
pub const AUCTION_PROPORTION: u64 = 3;
/// Bids per block.
pub const BID_PROPORTION: u64 = 46;
/// Events per block.
pub const BLOCK: u64 = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION;

/// The first person id.
pub const FIRST_PERSON_ID: i64 = 1000;
/// The first auction id.
pub const FIRST_AUCTION_ID: i64 = 1000;
/// The first category id.
pub const FIRST_CATEGORY_ID: i64 = 10;
/// Number of categories.
pub const NUM_CATEGORIES: u64 = 5;

/// Hot auction ids are multiples of this (among base-0 ids).
pub const HOT_AUCTION_STEP: u64 = 100;
/// Hot bidder and seller ids are multiples of this (plus one for bidders).
pub const HOT_PERSON_STEP: u64 = 100;
/// One bid in this many goes to a random recent auction, the rest to the hot auction
/// (Nexmark's `hotAuctionRatio`, default 2).
pub const HOT_AUCTION_RATIO: u64 = 2;
/// One bid in this many comes from a random recent person (Nexmark's `hotBiddersRatio`).
pub const HOT_BIDDER_RATIO: u64 = 4;
/// One auction in this many is sold by a random recent person (`hotSellersRatio`).
pub const HOT_SELLER_RATIO: u64 = 4;

/// Auctions still open that a random bid may choose from.
pub const NUM_IN_FLIGHT_AUCTIONS: u64 = 100;
/// Persons still active that a random bid or auction may choose from.
pub const NUM_ACTIVE_PEOPLE: u64 = 1000;
/// How far ahead of the newest auction a random bid may reach.
pub const AUCTION_ID_LEAD: u64 = 10;
/// How far ahead of the newest person a random bidder may reach.
pub const PERSON_ID_LEAD: u64 = 10;

/// The kind of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A new person.
    Person,
    /// A new auction.
    Auction,
    /// A bid.
    Bid,
}

/// The kind of event number `n`.
pub fn kind_of(n: u64) -> EventKind {
    match n % BLOCK {
        o if o < PERSON_PROPORTION => EventKind::Person,
        o if o < PERSON_PROPORTION + AUCTION_PROPORTION => EventKind::Auction,
        _ => EventKind::Bid,
    }
}

// Persons are simplest with one per block; the arithmetic below relies on it.
const _: () = assert!(PERSON_PROPORTION == 1);

/// Event number of the `k`-th person.
#[inline]
pub fn person_event(k: u64) -> u64 {
    k * BLOCK
}

/// Event number of the `k`-th auction.
#[inline]
pub fn auction_event(k: u64) -> u64 {
    (k / AUCTION_PROPORTION) * BLOCK + PERSON_PROPORTION + k % AUCTION_PROPORTION
}

/// Event number of the `k`-th bid.
#[inline]
pub fn bid_event(k: u64) -> u64 {
    (k / BID_PROPORTION) * BLOCK + PERSON_PROPORTION + AUCTION_PROPORTION + k % BID_PROPORTION
}

/// Base-0 id of the newest person created at or before event `n`.
#[inline]
pub fn last_person(n: u64) -> u64 {
    n / BLOCK
}

/// Base-0 id of the newest auction created at or before event `n` (`n` not the very
/// first person event, which precedes every auction).
#[inline]
pub fn last_auction(n: u64) -> u64 {
    let block = n / BLOCK;
    let offset = n % BLOCK;
    if offset < PERSON_PROPORTION {
        // A person opens the block: the newest auction is the last of the previous one.
        (block * AUCTION_PROPORTION).saturating_sub(1)
    } else {
        block * AUCTION_PROPORTION + (offset - PERSON_PROPORTION).min(AUCTION_PROPORTION - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_hold_one_person_three_auctions_and_46_bids() {
        let mut counts = [0u64; 3];
        for n in 0..BLOCK * 100 {
            counts[kind_of(n) as usize] += 1;
        }
        assert_eq!(counts, [100, 300, 4600]);
    }

    #[test]
    fn stream_indices_map_onto_distinct_events_of_their_kind() {
        let mut seen = std::collections::HashSet::new();
        for k in 0..100 {
            assert_eq!(kind_of(person_event(k)), EventKind::Person);
            assert!(seen.insert(person_event(k)));
        }
        for k in 0..300 {
            assert_eq!(kind_of(auction_event(k)), EventKind::Auction);
            assert!(seen.insert(auction_event(k)));
        }
        for k in 0..4600 {
            assert_eq!(kind_of(bid_event(k)), EventKind::Bid);
            assert!(seen.insert(bid_event(k)));
        }
        assert_eq!(seen.len() as u64, BLOCK * 100);
        assert!(seen.iter().all(|n| *n < BLOCK * 100));
    }

    #[test]
    fn bids_only_see_auctions_and_persons_created_before_them() {
        for k in 0..1000 {
            let n = bid_event(k);
            let a = last_auction(n);
            assert!(auction_event(a) < n);
            assert!(a + 1 == AUCTION_PROPORTION * (n / BLOCK + 1));
            assert!(person_event(last_person(n)) < n);
        }
        assert_eq!(last_auction(auction_event(7)), 7);
        assert_eq!(last_person(person_event(7)), 7);
    }
}
