//! The Arrow schemas of the three Nexmark streams, and of q13's side table.

use std::sync::{Arc, LazyLock};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use sluice_common::pb;

/// Event-time columns are milliseconds without a time zone.
pub const TIMESTAMP: DataType = DataType::Timestamp(TimeUnit::Millisecond, None);

static BID: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("auction", DataType::Int64, false),
        Field::new("bidder", DataType::Int64, false),
        Field::new("price", DataType::Int64, false),
        Field::new("channel", DataType::Utf8, false),
        Field::new("url", DataType::Utf8, false),
        Field::new("date_time", TIMESTAMP, false),
        Field::new("extra", DataType::Utf8, false),
    ]))
});

static AUCTION: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("item_name", DataType::Utf8, false),
        Field::new("description", DataType::Utf8, false),
        Field::new("initial_bid", DataType::Int64, false),
        Field::new("reserve", DataType::Int64, false),
        Field::new("date_time", TIMESTAMP, false),
        Field::new("expires", TIMESTAMP, false),
        Field::new("seller", DataType::Int64, false),
        Field::new("category", DataType::Int64, false),
        Field::new("extra", DataType::Utf8, false),
    ]))
});

static PERSON: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("email_address", DataType::Utf8, false),
        Field::new("credit_card", DataType::Utf8, false),
        Field::new("city", DataType::Utf8, false),
        Field::new("state", DataType::Utf8, false),
        Field::new("date_time", TIMESTAMP, false),
        Field::new("extra", DataType::Utf8, false),
    ]))
});

static SIDE_INPUT: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("key", DataType::Int64, false),
        Field::new("value", DataType::Utf8, false),
    ]))
});

/// The schema of `stream`'s records.
pub fn schema(stream: pb::NexmarkStream) -> SchemaRef {
    match stream {
        pb::NexmarkStream::Bid => BID.clone(),
        pb::NexmarkStream::Auction => AUCTION.clone(),
        pb::NexmarkStream::Person => PERSON.clone(),
        pb::NexmarkStream::SideInput => SIDE_INPUT.clone(),
    }
}
