//! `sluice kafka produce`: loads test data into a Kafka topic; `sluice kafka
//! create-topic` makes an empty one (a sink's output).
//!
//! The records are the built-in Nexmark generator's events (the same a `nexmark` source
//! with the same settings produces), written by the Kafka sink's own writer, so a job
//! reading the topic sees what a job reading the generator would.

use std::collections::HashMap;

use clap::{Args, Subcommand, ValueEnum};
use sluice_common::pb;
use sluice_connectors::kafka::admin::{ensure_topic, produce_nexmark};

use crate::nexmark_gen::EventArgs;
use crate::{Failure, runtime};

/// Kafka commands.
#[derive(Subcommand)]
pub enum KafkaCommand {
    /// Write generated events into a topic (created when missing).
    Produce(ProduceArgs),
    /// Create a topic (nothing happens when it exists).
    CreateTopic(TopicArgs),
}

/// The topic a command writes or creates.
#[derive(Args)]
pub struct TopicArgs {
    /// Bootstrap brokers, host:port[,host:port...].
    #[arg(long, default_value = "127.0.0.1:9092")]
    brokers: String,
    /// The topic.
    #[arg(long)]
    topic: String,
    /// Partitions of the topic when it has to be created.
    #[arg(long, default_value_t = 1)]
    partitions: i32,
}

impl TopicArgs {
    /// Creates the topic unless it exists; its number of partitions.
    async fn ensure(&self, properties: &HashMap<String, String>) -> Result<usize, Failure> {
        if self.partitions < 1 {
            return Err(Failure::usage("--partitions must be at least 1"));
        }
        ensure_topic(&self.brokers, &self.topic, self.partitions, properties)
            .await
            .map_err(Failure::from_compute)
    }
}

/// Record formats.
#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    /// One JSON object per record.
    Json,
    /// One CSV line per record, no header.
    Csv,
}

/// Arguments of `sluice kafka produce`.
#[derive(Args)]
pub struct ProduceArgs {
    #[command(flatten)]
    topic: TopicArgs,
    /// Write the built-in Nexmark generator's events (the only source for now).
    #[arg(long, required = true)]
    from_nexmark: bool,
    #[command(flatten)]
    events: EventArgs,
    /// Record format.
    #[arg(long, value_enum, default_value = "json")]
    format: Format,
    /// Columns whose values (in the record format) are each record's key; records without
    /// a key are spread over the partitions.
    #[arg(long, value_delimiter = ',')]
    key: Vec<String>,
    /// A librdkafka producer setting, `name=value` (repeatable).
    #[arg(long = "property", value_name = "NAME=VALUE")]
    properties: Vec<String>,
}

/// Runs a Kafka command.
pub fn run(command: KafkaCommand) -> Result<(), Failure> {
    match command {
        KafkaCommand::Produce(args) => produce(args),
        KafkaCommand::CreateTopic(args) => create_topic(args),
    }
}

fn create_topic(args: TopicArgs) -> Result<(), Failure> {
    let partitions = runtime()?.block_on(args.ensure(&HashMap::new()))?;
    eprintln!(
        "Kafka topic {} has {partitions} partitions on {}",
        args.topic, args.brokers
    );
    Ok(())
}

fn produce(args: ProduceArgs) -> Result<(), Failure> {
    if args.events.events == 0 {
        return Err(Failure::usage("--events must be at least 1"));
    }
    let mut properties = HashMap::new();
    for p in &args.properties {
        let Some((name, value)) = p.split_once('=') else {
            return Err(Failure::usage(format!(
                "--property `{p}` is not NAME=VALUE"
            )));
        };
        properties.insert(name.trim().to_owned(), value.trim().to_owned());
    }
    let spec = args.events.spec()?;
    let mut sink = pb::KafkaSink {
        brokers: args.topic.brokers.clone(),
        topic: args.topic.topic.clone(),
        key_columns: args.key.clone(),
        properties: properties.clone(),
        ..Default::default()
    };
    sink.set_format(match args.format {
        Format::Json => pb::KafkaFormat::Json,
        Format::Csv => pb::KafkaFormat::Csv,
    });
    let rt = runtime()?;
    rt.block_on(async {
        let partitions = args.topic.ensure(&properties).await?;
        let written = produce_nexmark(&spec, &sink)
            .await
            .map_err(Failure::from_compute)?;
        eprintln!(
            "wrote {written} events to Kafka topic {} ({partitions} partitions) on {}",
            args.topic.topic, args.topic.brokers
        );
        Ok(())
    })
}
