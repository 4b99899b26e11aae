//! A user's requests to a job and their answers.
//!
//! [`Command`] is what the service sends a job's actor: a request with a channel for its
//! answer. The actor splits it into a [`Request`] (plain data, what the driver decides
//! on) and keeps the channel under a [`ReplyId`]; the driver answers with an
//! [`Answer`] or a refusal naming why, and the actor sends it on. So the driver never
//! holds a channel and its tests read answers as values.
//!
//! This module knows nothing of how the answers are reached (checkpoints, workers).

use tokio::sync::oneshot;

/// The answer channel of a command.
pub type Reply<T> = oneshot::Sender<Result<T, String>>;

/// A user's request to a job; the answer goes to `reply`.
#[derive(Debug)]
pub enum Command {
    /// Stop the job now.
    Cancel {
        /// Answered once the workers stopped.
        reply: Reply<()>,
    },
    /// Take savepoint `name`.
    Savepoint {
        /// Its name.
        name: String,
        /// Its `_metadata` path once written.
        reply: Reply<String>,
    },
    /// Take savepoint `name` (if given), then stop.
    Stop {
        /// The savepoint's name.
        savepoint: Option<String>,
        /// Answered once the workers stopped.
        reply: Reply<StopOutcome>,
    },
    /// Checkpoint, then run at `parallelism`.
    Rescale {
        /// The new parallelism of every node.
        parallelism: u32,
        /// Answered once the job runs at the new parallelism.
        reply: Reply<RescaleOutcome>,
    },
    /// Checkpoint, then place the job's state shards again and run on (see
    /// [`Request::MoveShards`]).
    MoveShards {
        /// Move the shards off the node at this endpoint (a drain); `None`: spread them
        /// evenly over `live` (a rebalance).
        off: Option<String>,
        /// The endpoints of the live state nodes that take placement.
        live: Vec<String>,
        /// Answered once the job runs again (or at once when nothing needs to move).
        reply: Reply<RescaleOutcome>,
    },
}

/// A [`Command`] without its channel: what the driver decides on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Stop the job now.
    Cancel,
    /// Take savepoint `name`.
    Savepoint {
        /// Its name.
        name: String,
    },
    /// Take savepoint `savepoint` (if given), then stop.
    Stop {
        /// The savepoint's name.
        savepoint: Option<String>,
    },
    /// Checkpoint, then run at `parallelism`.
    Rescale {
        /// The new parallelism.
        parallelism: u32,
    },
    /// Checkpoint, then place the shards again (off the node at `off`, or spread evenly
    /// over `live`), reopening the moved ones on their new nodes at that checkpoint.
    MoveShards {
        /// The endpoint of a drained node.
        off: Option<String>,
        /// The endpoints of the nodes that take placement.
        live: Vec<String>,
    },
}

/// Names a request's answer channel (kept by the actor).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplyId(pub u64);

/// A request's successful answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The job is cancelled and its workers stopped.
    Cancelled,
    /// The savepoint is written at this `_metadata` path.
    Savepoint(String),
    /// The job stopped.
    Stopped(StopOutcome),
    /// The job runs at the new parallelism (or already did).
    Rescaled(RescaleOutcome),
}

impl Command {
    /// The request and the channel its answer goes to.
    pub fn split(self) -> (Request, Responder) {
        match self {
            Command::Cancel { reply } => (Request::Cancel, Responder::Cancel(reply)),
            Command::Savepoint { name, reply } => {
                (Request::Savepoint { name }, Responder::Savepoint(reply))
            }
            Command::Stop { savepoint, reply } => {
                (Request::Stop { savepoint }, Responder::Stop(reply))
            }
            Command::Rescale { parallelism, reply } => {
                (Request::Rescale { parallelism }, Responder::Rescale(reply))
            }
            Command::MoveShards { off, live, reply } => {
                (Request::MoveShards { off, live }, Responder::Rescale(reply))
            }
        }
    }
}

/// A command's answer channel.
#[derive(Debug)]
pub enum Responder {
    /// Of [`Command::Cancel`].
    Cancel(Reply<()>),
    /// Of [`Command::Savepoint`].
    Savepoint(Reply<String>),
    /// Of [`Command::Stop`].
    Stop(Reply<StopOutcome>),
    /// Of [`Command::Rescale`].
    Rescale(Reply<RescaleOutcome>),
}

impl Responder {
    /// Sends `answer`; an answer of the wrong kind (a driver bug) is logged and sent as
    /// an error.
    pub fn send(self, answer: Result<Answer, String>) {
        fn mismatch<T>(answer: &Answer) -> Result<T, String> {
            tracing::error!(
                ?answer,
                "a job answered a request with the wrong kind of answer"
            );
            Err(format!("internal error: unexpected answer {answer:?}"))
        }
        match (self, answer) {
            (Responder::Cancel(r), Ok(Answer::Cancelled)) => send(r, Ok(())),
            (Responder::Savepoint(r), Ok(Answer::Savepoint(p))) => send(r, Ok(p)),
            (Responder::Stop(r), Ok(Answer::Stopped(o))) => send(r, Ok(o)),
            (Responder::Rescale(r), Ok(Answer::Rescaled(o))) => send(r, Ok(o)),
            (Responder::Cancel(r), Err(e)) => send(r, Err(e)),
            (Responder::Savepoint(r), Err(e)) => send(r, Err(e)),
            (Responder::Stop(r), Err(e)) => send(r, Err(e)),
            (Responder::Rescale(r), Err(e)) => send(r, Err(e)),
            (Responder::Cancel(r), Ok(a)) => send(r, mismatch(&a)),
            (Responder::Savepoint(r), Ok(a)) => send(r, mismatch(&a)),
            (Responder::Stop(r), Ok(a)) => send(r, mismatch(&a)),
            (Responder::Rescale(r), Ok(a)) => send(r, mismatch(&a)),
        }
    }
}

fn send<T>(reply: Reply<T>, value: Result<T, String>) {
    // The caller may have gone (a closed HTTP connection): nothing to do then.
    let _ = reply.send(value);
}

/// What a stop did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StopOutcome {
    /// The savepoint's `_metadata` path (empty without one).
    pub savepoint: String,
    /// Set when the job stopped although something did not go as it should: tasks that
    /// did not confirm committing the savepoint's output in time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// What a rescale did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RescaleOutcome {
    /// The checkpoint the job resumed from (for a rescale that changed nothing: the
    /// newest completed checkpoint, 0 without one).
    pub checkpoint_id: u64,
    /// Milliseconds from the request to the tasks running at the new parallelism.
    pub millis: u64,
    /// State bytes the state service downloaded meanwhile (0: no state moved).
    pub state_bytes_restored: u64,
    /// The job's parallelism now.
    pub parallelism: u32,
    /// The job already ran at that parallelism: nothing was redeployed.
    pub unchanged: bool,
    /// What happened, in words.
    pub message: String,
}
