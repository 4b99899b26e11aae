//! Files as sources and sinks: CSV, JSON lines and Parquet on local disk or `s3://`.
//!
//! This module owns what the bytes of a file mean: schemas ([`schema`]), finding records
//! and their lines ([`records`]), decoding with per-record error handling ([`decode`],
//! [`dead_letter`]), reading a subtask's files ([`source`]) and writing its part files
//! ([`sink`]), committed in two phases when the job checkpoints: part names and stages
//! ([`part_name`]), the directory's atomic moves ([`part_dir`]) and recovery's decisions
//! ([`recovery`]); a partitioned sink writes a directory per partition value
//! ([`partitioned`]). It must not know how a path becomes a store (that is
//! [`store`](crate::store)) nor anything about watermarks or the runtime.
//!
//! # Formats
//!
//! CSV files have a header line, which is skipped: columns are matched to the schema by
//! position. JSON-lines fields are matched by name (unknown ones are ignored). Parquet
//! columns are matched by name and cast to the schema's types. Timestamps in text are
//! what arrow's writers emit (`2015-07-15T00:00:01.234`), and the sink writes the same.
//!
//! CSV and JSON-lines files are streamed in bounded chunks, Parquet files a row group at
//! a time (see [`source`]).
//!
//! # Checkpoints
//!
//! Every file is a split, named by its path under the source's root; its position
//! ([`position`]) is the byte offset and line of the next unread record of a text file,
//! or the next row group and row of a Parquet file, counting only the records already
//! returned. A reader of any parallelism resumes from the positions of all readers of
//! the same source, seeking each of its files with ranged reads.
//!
//! # Errors in the input
//!
//! A CSV or JSON-lines record that does not decode is handled by the source's
//! `on_error`: `fail` stops with [`Error::BadRecord`](sluice_compute::error::Error::BadRecord)
//! naming `file:line`; `skip` drops it; `dead_letter` writes it to
//! `<dead_letter_path>/bad-<subtask>.txt`. Skipped and dead-lettered records are counted
//! in [`SourceCounters::skipped`](sluice_compute::connector::SourceCounters). A bad Parquet file
//! always fails, and so does a text record longer than
//! [`MAX_RECORD`](source::MAX_RECORD) (64 MiB).

pub mod dead_letter;
pub mod decode;
pub mod parquet_object;
pub mod part_dir;
pub mod part_name;
pub mod partitioned;
pub mod position;
pub mod records;
pub mod recovery;
pub mod schema;
pub mod sink;
pub mod source;

pub use partitioned::PartitionedWriter;
pub use sink::FileWriter;
pub use source::{FileReader, source_schema};

#[cfg(test)]
mod resume_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod two_phase_tests;
