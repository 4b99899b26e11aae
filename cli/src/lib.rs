//! The `sluice` command: one binary, one subcommand per role and per user task.
//!
//! - `sluice run JOB.yaml`: runs a job on the embedded local runtime.
//! - `sluice run JOB.yaml --workers N`: runs it across N worker processes.
//! - `sluice nexmark gen`: writes the Nexmark events the built-in source produces.
//! - `sluice bench nexmark | state | checkpoint | cluster | exchange`: the benchmarks of
//!   the `sluice-bench` crate; [`bench`] parses their subcommands and wires them to this
//!   binary.
//! - `sluice state-service`: a state-service node.
//! - `sluice worker`: a compute worker (see `cluster::worker`).
//! - `sluice coordinator`: the coordinator (REST for users, gRPC for workers).
//! - `sluice submit | jobs | status | cancel | checkpoints | savepoint | stop | rescale`:
//!   jobs on a coordinator.
//!
//! This crate is the composition root: argument parsing, and the wiring of the roles
//! (and of the benchmarks) to the library crates. It holds no benchmark code.
//!
//! The command is a library too ([`main`]), so that a program can register its own
//! functions and then be the `sluice` command (`cli/examples/udf.rs`).
//!
//! Exit codes: 0 success, 1 a job or I/O failure, 2 a mistake in the job or the command
//! line (the message names file, line and column where there is one).

mod bench;
mod cluster;
mod deploy;
mod explain;
mod kafka;
mod live_table;
mod nexmark_gen;
mod progress;
mod run;
mod sql_shell;
mod state_service;
mod telemetry;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Sluice: a stream processing engine with disaggregated state"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a job file (YAML, or SQL when it ends in `.sql`) on the embedded local runtime.
    Run(run::RunArgs),
    /// Print the plan a job file becomes (tasks, parallelism, partitioning, keyed
    /// state, schemas) without running it.
    Explain(explain::ExplainArgs),
    /// An interactive SQL shell: define tables, run queries and watch their rows,
    /// `SHOW TABLES`, `DESCRIBE`, `EXPLAIN`; INSERTs go to `--coordinator` when given.
    Sql(sql_shell::SqlArgs),
    /// Nexmark benchmark data.
    Nexmark {
        #[command(subcommand)]
        command: NexmarkCommand,
    },
    /// Kafka test data.
    Kafka {
        #[command(subcommand)]
        command: kafka::KafkaCommand,
    },
    /// Benchmarks of whole jobs and services (the `sluice-bench` crate).
    Bench {
        #[command(subcommand)]
        command: bench::BenchCommand,
    },
    /// Run a compute worker (under `sluice run --workers N`, or by hand).
    Worker(cluster::worker::WorkerArgs),
    /// Run the coordinator: REST API for users, gRPC API for workers.
    Coordinator(cluster::coordinator::CoordinatorArgs),
    #[command(flatten)]
    Job(cluster::client::JobCommand),
    /// Diagnose a running job: back-pressure cascade, skew, watermark starvation,
    /// checkpoint alignment, state memory; exit code 1 when something is found.
    Doctor(cluster::doctor::DoctorArgs),
    /// Run a state-service node: keyed-state shards on RocksDB behind a cache, durable
    /// in an object store.
    StateService(state_service::StateServiceArgs),
    /// Bring up the cluster a cluster file describes on its hosts over SSH (`status`,
    /// `destroy`: report or remove it).
    Deploy(deploy::DeployArgs),
    /// Bearer tokens for the coordinator's REST API (`--auth-tokens FILE`).
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Make a new random token: prints it, and on stderr the line that admits it in a
    /// coordinator's tokens file (which holds only its hash).
    New {
        /// What it may do: `read` (GET only), `operate` (everything) or `join` (only
        /// a worker joining by itself: `sluice worker --join`).
        #[arg(long, default_value = "operate", value_parser = ["read", "operate", "join"])]
        role: String,
        /// Its name in refusals and the tokens file.
        #[arg(long, default_value = "user")]
        name: String,
    },
}

/// 32 random bytes from the kernel, in hex: a bearer token.
pub(crate) fn random_token() -> Result<String, Failure> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(|e| Failure::from(anyhow::anyhow!("reading /dev/urandom: {e}")))?;
    Ok(hex(&bytes))
}

/// `bytes` as lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `sluice token new`.
fn new_token(role: &str, name: &str) -> Result<(), Failure> {
    if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c == '#') {
        return Err(Failure::usage(format!(
            "--name `{name}`: one word without `#`"
        )));
    }
    let token = random_token()?;
    sluice_common::outln!("{token}");
    eprintln!(
        "{role} {} {name}",
        sluice_coordinator::auth::hash_line(&token)
    );
    Ok(())
}

#[derive(Subcommand)]
enum NexmarkCommand {
    /// Write the events the built-in Nexmark source produces to files.
    Gen(nexmark_gen::GenArgs),
}

/// A failure with the exit code it maps to.
#[derive(Debug)]
pub struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    /// A mistake of the user (exit code 2).
    pub fn usage(message: impl Into<String>) -> Self {
        Self {
            code: 2,
            message: message.into(),
        }
    }

    /// What it says.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// A coordinator that lost the lead (exit code 3).
    pub fn deposed(message: impl Into<String>) -> Self {
        Self {
            code: 3,
            message: message.into(),
        }
    }

    /// A failure already reported elsewhere: exit with `code`, print nothing.
    pub fn quiet(code: u8) -> Self {
        Self {
            code,
            message: String::new(),
        }
    }

    /// A failure while running (exit code 1), or a user error if the engine says so.
    pub fn from_compute(err: sluice_compute::Error) -> Self {
        let code = if matches!(err, sluice_compute::Error::Plan(_)) {
            2
        } else {
            1
        };
        Self {
            code,
            message: err.to_string(),
        }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Self {
            code: 1,
            message: format!("{e:#}"),
        }
    }
}

/// The `sluice` command line: parses the arguments and runs the role or task they name.
///
/// A program that registers user-defined functions
/// (`sluice_compute::expr::udf::register_scalar`) calls this afterwards, so that every
/// role it runs, and the worker processes it starts from its own executable, has them.
pub fn main() -> ExitCode {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    // Logged events go to stderr and, once a role starts OTLP export, to the collector.
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(sluice_telemetry::logs::OtlpLogs)
        .init();
    let cli = Cli::parse();
    // gRPC between roles goes over mutual TLS when SLUICE_TLS_CA/CERT/KEY name files.
    if let Err(e) = sluice_common::tls::init_cluster_tls() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Explain(args) => explain::run(args),
        Command::Sql(args) => sql_shell::run(args),
        Command::Nexmark {
            command: NexmarkCommand::Gen(args),
        } => nexmark_gen::generate(args),
        Command::Kafka { command } => kafka::run(command),
        Command::Bench { command } => bench::run(command),
        Command::Worker(args) => cluster::worker::worker(args),
        Command::Coordinator(args) => cluster::coordinator::serve(args),
        Command::Job(command) => cluster::client::run(command),
        Command::Doctor(args) => cluster::doctor::run(args),
        Command::StateService(args) => state_service::serve(args),
        Command::Deploy(args) => deploy::run(args),
        Command::Token {
            command: TokenCommand::New { role, name },
        } => new_token(&role, &name),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            if !f.message.is_empty() {
                eprintln!("error: {}", f.message);
            }
            ExitCode::from(f.code)
        }
    }
}

/// A multi-threaded runtime with one worker thread per core.
pub fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("sluice-task")
        .build()
        .map_err(|e| Failure {
            code: 1,
            message: format!("cannot start the runtime: {e}"),
        })
}
