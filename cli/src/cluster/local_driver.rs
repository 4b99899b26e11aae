//! `sluice run JOB.yaml --workers N`: a small driver standing in for the coordinator.
//!
//! It plans the job here first (so a mistake in the job is reported once, with exit
//! code 2), listens for control connections on 127.0.0.1, starts N `sluice worker`
//! child processes (`--control` pointing back here; their stdout and stderr are this
//! process's), waits for each to say hello with its data address, sends every worker
//! the job graph, its index and all data addresses, and waits for the reports.
//!
//! Failing fast: the first worker that reports an error, exits, or closes its control
//! connection before reporting ends the run: the other workers are killed and
//! `sluice run` exits 1 with that worker's error. Every wait is bounded: the workers
//! must say hello within [`HELLO_TIMEOUT`]; after that the run lasts as long as the
//! workers are alive and connected (they fail their own stuck connections after the
//! peer timeout).

use std::time::{Duration, Instant};

use sluice_common::pb;
use sluice_common::pb::cluster as pbc;
use sluice_compute::cluster::control::{self, CONTROL_VERSION};
use sluice_compute::network::NetworkConfig;
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::task::JoinSet;

use crate::Failure;
use crate::run::{RunState, StateArgs, Summary, connect_state};

/// How long workers have to start and say hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(30);

/// Settings of a multi-process run.
#[derive(Debug, Clone)]
pub struct DriverOptions {
    /// Number of worker processes.
    pub workers: u32,
    /// Data-plane settings sent to every worker.
    pub network: NetworkConfig,
    /// Workers print per-task metrics this often (0: only at the end).
    pub metrics_interval_ms: u64,
}

fn fail(message: impl Into<String>) -> Failure {
    Failure::from(anyhow::anyhow!("{}", message.into()))
}

/// Runs `graph` on `options.workers` worker processes of this binary.
pub async fn run(
    graph: pb::JobGraph,
    options: &DriverOptions,
    state: &StateArgs,
) -> Result<Summary, Failure> {
    let start = Instant::now();
    let plan = sluice_compute::plan::plan(graph.clone())
        .await
        .map_err(Failure::from_compute)?;
    let remote = connect_state(&plan, state).await?;
    let result = run_workers(graph, options, remote.as_ref(), start).await;
    if let Some(r) = remote {
        r.close().await;
    }
    result
}

/// Deploys the job on the workers and waits for them; with remote state, opens the
/// shards first and commits the last epoch the workers made durable at the end.
async fn run_workers(
    graph: pb::JobGraph,
    options: &DriverOptions,
    remote: Option<&RunState>,
    start: Instant,
) -> Result<Summary, Failure> {
    let remote_state = match remote {
        Some(r) => {
            let held = r
                .state
                .open_all()
                .await
                .map_err(|e| Failure::from_compute(e.into()))?;
            Some(pbc::RemoteStateRef {
                endpoint: r.endpoint.clone(),
                job_id: r.state.layout().job_id().to_owned(),
                shards: r.state.layout().len() as u32,
                first_epoch: held + 1,
            })
        }
        None => None,
    };
    let n = options.workers.max(1) as usize;
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| fail(format!("cannot listen for workers: {e}")))?;
    let control_addr = listener
        .local_addr()
        .map_err(|e| fail(format!("control address: {e}")))?
        .to_string();
    let exe = std::env::current_exe().map_err(|e| fail(format!("cannot find sluice: {e}")))?;
    let mut children: Vec<Child> = Vec::with_capacity(n);
    for _ in 0..n {
        let child = Command::new(&exe)
            .args([
                "worker",
                "--listen",
                "127.0.0.1:0",
                "--control",
                &control_addr,
            ])
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| fail(format!("cannot start a worker: {e}")))?;
        children.push(child);
    }
    let pids: Vec<u32> = children.iter().map(|c| c.id().unwrap_or(0)).collect();

    // Hellos, matched to children by pid.
    let mut conns: Vec<Option<(tokio::net::TcpStream, String)>> = (0..n).map(|_| None).collect();
    let deadline = Instant::now() + HELLO_TIMEOUT;
    while conns.iter().any(Option::is_none) {
        let accepted = tokio::time::timeout_at(deadline.into(), listener.accept()).await;
        let (mut stream, _) = match accepted {
            Err(_) => {
                return Err(fail(format!(
                    "workers did not start within {HELLO_TIMEOUT:?}"
                )));
            }
            Ok(Err(e)) => return Err(fail(format!("accepting a worker: {e}"))),
            Ok(Ok(s)) => s,
        };
        let hello: Option<pbc::Hello> =
            tokio::time::timeout_at(deadline.into(), control::read_message(&mut stream))
                .await
                .map_err(|_| fail("a worker did not say hello in time"))?
                .map_err(|e| fail(format!("bad hello from a worker: {e}")))?;
        let Some(hello) = hello else { continue };
        if hello.protocol_version != CONTROL_VERSION {
            return Err(fail(format!(
                "a worker speaks control protocol {}, expected {CONTROL_VERSION}",
                hello.protocol_version
            )));
        }
        match pids.iter().position(|&p| p == hello.pid) {
            Some(i) if conns[i].is_none() => conns[i] = Some((stream, hello.data_address)),
            _ => return Err(fail(format!("unexpected hello from pid {}", hello.pid))),
        }
    }
    let conns: Vec<(tokio::net::TcpStream, String)> = conns.into_iter().flatten().collect();
    let peers: Vec<String> = conns.iter().map(|(_, a)| a.clone()).collect();

    // Deploy, then wait for one report per worker, or the first failure.
    let mut waits: JoinSet<(usize, Result<pbc::Report, String>)> = JoinSet::new();
    for (i, (mut stream, _)) in conns.into_iter().enumerate() {
        let deployment = pbc::Deployment {
            job: Some(graph.clone()),
            worker_index: i as u32,
            peers: peers.clone(),
            network: Some(options.network.to_proto()),
            metrics_interval_ms: options.metrics_interval_ms,
            remote_state: remote_state.clone(),
        };
        control::write_message(&mut stream, &deployment)
            .await
            .map_err(|e| fail(format!("deploying to worker {i}: {e}")))?;
        waits.spawn(async move {
            let got = control::read_message::<_, pbc::Report>(&mut stream).await;
            let r = match got {
                Ok(Some(r)) => Ok(r),
                Ok(None) => Err("closed its control connection before reporting".to_owned()),
                Err(e) => Err(format!("control connection failed: {e}")),
            };
            // Keep the connection open until the worker exits on its own.
            let _ = tokio::time::timeout(Duration::from_secs(10), async {
                let mut b = [0u8; 1];
                let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut b).await;
            })
            .await;
            (i, r)
        });
    }
    let mut reports: Vec<Option<pbc::Report>> = (0..n).map(|_| None).collect();
    let mut done = 0;
    let mut failure: Option<(usize, String, bool)> = None;
    while done < n && failure.is_none() {
        tokio::select! {
            joined = waits.join_next() => {
                let Some(joined) = joined else { break };
                let (i, r) = joined.map_err(|e| fail(format!("driver task: {e}")))?;
                match r {
                    Ok(report) if report.error.is_empty() => {
                        reports[i] = Some(report);
                        done += 1;
                    }
                    Ok(report) => failure = Some((i, report.error, report.user_error)),
                    Err(e) => failure = Some((i, e, false)),
                }
            }
            (i, status) = wait_any(&mut children) => {
                if reports[i].is_none() {
                    failure = Some((i, format!("exited ({status}) before reporting"), false));
                }
            }
        }
    }
    if let Some((i, message, user)) = failure {
        for c in &mut children {
            let _ = c.start_kill();
        }
        for c in &mut children {
            let _ = tokio::time::timeout(Duration::from_secs(5), c.wait()).await;
        }
        let text = format!("worker {i} (pid {}): {message}", pids[i]);
        return Err(if user {
            Failure::usage(text)
        } else {
            fail(text)
        });
    }
    for c in &mut children {
        if tokio::time::timeout(Duration::from_secs(10), c.wait())
            .await
            .is_err()
        {
            let _ = c.start_kill();
        }
    }
    let mut s = Summary {
        records_in: 0,
        records_out: 0,
        late: 0,
        skipped: 0,
        barriers: 0,
        seconds: start.elapsed().as_secs_f64(),
    };
    let last_epoch = reports
        .iter()
        .flatten()
        .map(|r| r.last_flushed_epoch)
        .max()
        .unwrap_or(0);
    if let Some(r) = remote
        && last_epoch > 0
    {
        // As `sluice run` in one process: every worker finished, so the last epoch is
        // committed as the job's checkpoint.
        r.state
            .commit(last_epoch, &[last_epoch])
            .await
            .map_err(|e| Failure::from_compute(e.into()))?;
    }
    for r in reports.into_iter().flatten() {
        s.records_in += r.records_in;
        s.records_out += r.records_out;
        s.late += r.late;
        s.skipped += r.skipped;
        s.barriers += r.barriers;
    }
    Ok(s)
}

/// The first child to exit, with its status (pending forever once all have exited).
async fn wait_any(children: &mut [Child]) -> (usize, String) {
    loop {
        for (i, c) in children.iter_mut().enumerate() {
            if let Ok(Some(status)) = c.try_wait()
                && !status.success()
            {
                return (i, status.to_string());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
