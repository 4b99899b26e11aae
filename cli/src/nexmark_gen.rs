//! `sluice nexmark gen`: writes the events of the built-in Nexmark source to files.
//!
//! The files hold exactly the events a `nexmark` source with the same stream, count,
//! seed, out-of-orderness and rate produces, whatever its parallelism, so other tools
//! can compute expected results from the same input.

use clap::{Args, ValueEnum};
use sluice_common::pb;
use sluice_compute::connector::{SinkWriter, SourceReader, SubtaskInfo};
use sluice_connectors::file::FileWriter;
use sluice_connectors::nexmark::NexmarkReader;
use sluice_planner::job_spec::parse_duration_ms;

use crate::{Failure, runtime};

/// Nexmark streams.
#[derive(Clone, Copy, ValueEnum)]
pub enum Stream {
    /// Bids.
    Bid,
    /// Auctions.
    Auction,
    /// People.
    Person,
    /// Nexmark q13's side table: `key`, and `value` its decimal text.
    #[value(name = "side_input")]
    SideInput,
}

/// Output formats.
#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    /// JSON lines.
    Jsonl,
    /// CSV with a header.
    Csv,
    /// Parquet.
    Parquet,
}

/// Which generated events: the arguments `sluice nexmark gen` and `sluice kafka
/// produce` share.
#[derive(Args)]
pub struct EventArgs {
    /// Which stream.
    #[arg(long, value_enum, default_value = "bid")]
    stream: Stream,
    /// Number of events of that stream.
    #[arg(long)]
    pub events: u64,
    /// Generator seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Maximum displacement of event times, e.g. 2s.
    #[arg(long, default_value = "0ms")]
    max_out_of_orderness: String,
    /// Events (of all streams) per second of event time; 0 for the generator's default.
    #[arg(long, default_value_t = 0)]
    events_per_second: u64,
}

impl EventArgs {
    /// The generator source these arguments describe.
    pub fn spec(&self) -> Result<pb::NexmarkSource, Failure> {
        let ooo = parse_duration_ms(&self.max_out_of_orderness)
            .map_err(|e| Failure::usage(format!("--max-out-of-orderness: {e}")))?;
        let mut spec = pb::NexmarkSource {
            events: self.events,
            seed: self.seed,
            max_out_of_orderness_ms: ooo,
            events_per_second: self.events_per_second,
            ..Default::default()
        };
        spec.set_stream(match self.stream {
            Stream::Bid => pb::NexmarkStream::Bid,
            Stream::Auction => pb::NexmarkStream::Auction,
            Stream::Person => pb::NexmarkStream::Person,
            Stream::SideInput => pb::NexmarkStream::SideInput,
        });
        Ok(spec)
    }
}

/// Arguments of `sluice nexmark gen`.
#[derive(Args)]
pub struct GenArgs {
    #[command(flatten)]
    events: EventArgs,
    /// File format.
    #[arg(long, value_enum, default_value = "jsonl")]
    format: Format,
    /// Output directory (local path or s3:// URL); files are part-<i>.<ext>.
    #[arg(long)]
    out: String,
    /// Number of files to split the events into (readers use one split per file).
    #[arg(long, default_value_t = 1)]
    files: usize,
}

/// Runs `sluice nexmark gen`.
pub fn generate(args: GenArgs) -> Result<(), Failure> {
    if args.events.events == 0 {
        return Err(Failure::usage(
            "--events must be at least 1 (files cannot hold an unbounded stream)",
        ));
    }
    if args.files == 0 {
        return Err(Failure::usage("--files must be at least 1"));
    }
    let spec = args.events.spec()?;
    let mut sink = pb::FileSink {
        path: args.out.clone(),
        ..Default::default()
    };
    sink.set_format(match args.format {
        Format::Jsonl => pb::FileFormat::Jsonl,
        Format::Csv => pb::FileFormat::Csv,
        Format::Parquet => pb::FileFormat::Parquet,
    });
    let rt = runtime()?;
    rt.block_on(async {
        let mut written = 0u64;
        for index in 0..args.files {
            let info = SubtaskInfo {
                index,
                parallelism: args.files,
                fence: 0,
            };
            let mut reader =
                NexmarkReader::new(&spec, info, 8192).map_err(Failure::from_compute)?;
            let mut writer = FileWriter::create(&sink, reader.schema(), info)
                .await
                .map_err(Failure::from_compute)?;
            while let Some(b) = reader.next_batch().await.map_err(Failure::from_compute)? {
                written += b.batch.num_rows() as u64;
                writer
                    .write(&b.batch)
                    .await
                    .map_err(Failure::from_compute)?;
            }
            writer.finish().await.map_err(Failure::from_compute)?;
        }
        eprintln!("wrote {written} events to {}", args.out);
        Ok(())
    })
}
