//! Leader election among coordinators through etcd (`sluice coordinator --ha
//! etcd://host:port[,host:port]`).
//!
//! Each coordinator holds an etcd lease it keeps alive, lists itself under
//! `<prefix>/coordinators/` with that lease, and campaigns in etcd's election service
//! under `<prefix>/leader`. The one elected leads: it resumes every job from the store
//! and serves workers, state nodes and users; the others are standbys that refuse those
//! calls with the leader's address, so clients given every coordinator's address find
//! it. A leader that cannot renew its lease deposes itself before etcd could let the
//! lease expire (by its own clock, a margin early), so two leaders never act at once;
//! the create-if-absent `_metadata` write still refuses a deposed leader's commit.
//!
//! It knows etcd's v3 gRPC API (the subset in `coordinator/proto/etcd/`) and nothing
//! of jobs: the coordinator asks [`Elector::check`] before serving, and the process
//! watches [`Elector::deposed`] to stop.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::task::AbortOnDropHandle;
use tonic::transport::{Channel, Endpoint};

#[allow(missing_docs, clippy::all, clippy::pedantic)]
mod pb {
    pub mod mvccpb {
        tonic::include_proto!("mvccpb");
    }
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }
    pub mod v3electionpb {
        tonic::include_proto!("v3electionpb");
    }
}

use pb::etcdserverpb::kv_client::KvClient;
use pb::etcdserverpb::lease_client::LeaseClient;
use pb::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest, PutRequest, RangeRequest,
};
use pb::v3electionpb::election_client::ElectionClient;
use pb::v3electionpb::{CampaignRequest, LeaderRequest};

/// How long a call to etcd may take before it counts as unreachable.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// One coordinator as the others see it (the value of its keys in etcd).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// A name unique among the coordinators.
    pub id: String,
    /// `http://host:port` of its REST API.
    pub http: String,
    /// `http://host:port` of its gRPC API (workers, state nodes).
    pub grpc: String,
}

/// What this coordinator is right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Waiting to lead; `leader` as last seen, `error` while etcd cannot be reached.
    Standby {
        /// The leader, when there is one.
        leader: Option<Member>,
        /// Why etcd could not be asked, when it could not.
        error: Option<String>,
    },
    /// Elected: serves.
    Leader,
    /// Was the leader and lost the lease: must stop acting at once.
    Deposed(String),
}

/// How to take part in the election.
#[derive(Clone, Debug)]
pub struct HaOptions {
    /// etcd client URLs (`http://host:port`).
    pub endpoints: Vec<String>,
    /// Key prefix of this cluster in etcd.
    pub prefix: String,
    /// The lease's time to live: a dead leader is replaced after about this long.
    pub lease_ttl: Duration,
    /// This coordinator.
    pub me: Member,
}

/// Parses `etcd://host:port[,host:port…]` into client URLs (`etcds://`: over mutual
/// TLS with this process's cluster identity, `SLUICE_TLS_*`).
pub fn parse_etcd_url(url: &str) -> Result<Vec<String>, String> {
    let (scheme, rest) = match (url.strip_prefix("etcd://"), url.strip_prefix("etcds://")) {
        (Some(rest), _) => ("http", rest),
        (None, Some(rest)) => ("https", rest),
        (None, None) => {
            return Err(format!(
                "{url:?} is not an etcd address: expected etcd://host:port[,host:port] \
                 (etcds:// over TLS)"
            ));
        }
    };
    let endpoints: Vec<String> = rest
        .trim_end_matches('/')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|hp| {
            if hp.contains('/') || !hp.contains(':') {
                Err(format!("{hp:?} in {url:?} is not host:port"))
            } else {
                Ok(format!("{scheme}://{hp}"))
            }
        })
        .collect::<Result<_, _>>()?;
    if endpoints.is_empty() {
        return Err(format!("{url:?} names no etcd endpoint"));
    }
    Ok(endpoints)
}

/// This coordinator's part in the election; dropping it stops taking part (the lease
/// then expires; [`Elector::resign`] hands over at once).
pub struct Elector {
    options: HaOptions,
    channel: Channel,
    role: watch::Sender<Role>,
    lease: Mutex<i64>,
    tasks: Mutex<Vec<AbortOnDropHandle<()>>>,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("me", &self.options.me)
            .finish_non_exhaustive()
    }
}

fn unreachable(endpoints: &[String], e: impl std::fmt::Display) -> String {
    format!("etcd at {} is unreachable: {e}", endpoints.join(","))
}

async fn timed<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(format!("{what}: {}", s.message())),
        Err(_) => Err(format!("{what}: no answer within {CALL_TIMEOUT:?}")),
    }
}

impl Elector {
    /// Joins the election: checks that etcd answers (an error naming it otherwise, so a
    /// coordinator never starts half-way), takes a lease, lists itself and campaigns in
    /// the background.
    pub async fn join(options: HaOptions) -> Result<Arc<Self>, String> {
        if options.lease_ttl < Duration::from_secs(2) {
            return Err(format!(
                "the lease time to live must be at least 2 s (got {:?})",
                options.lease_ttl
            ));
        }
        let endpoints = options
            .endpoints
            .iter()
            .map(|u| {
                // A user's plain etcd stays plain when the roles talk TLS to each other.
                let endpoint = if u.starts_with("https://") {
                    sluice_common::tls::endpoint(u)
                } else {
                    Endpoint::from_shared(u.clone()).map_err(|e| e.to_string())
                };
                endpoint
                    .map(|e| e.connect_timeout(CALL_TIMEOUT).tcp_nodelay(true))
                    .map_err(|e| format!("etcd endpoint {u:?}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let channel = Channel::balance_list(endpoints.into_iter());
        let (role, _) = watch::channel(Role::Standby {
            leader: None,
            error: None,
        });
        let elector = Arc::new(Self {
            options,
            channel,
            role,
            lease: Mutex::new(0),
            tasks: Mutex::new(Vec::new()),
        });
        let lease = elector
            .grant()
            .await
            .map_err(|e| unreachable(&elector.options.endpoints, e))?;
        let run = tokio::spawn(Arc::clone(&elector).run(lease));
        let observe = tokio::spawn(Arc::clone(&elector).observe());
        elector
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend([AbortOnDropHandle::new(run), AbortOnDropHandle::new(observe)]);
        Ok(elector)
    }

    fn election(&self) -> Vec<u8> {
        format!("{}/leader", self.options.prefix).into_bytes()
    }

    fn members_prefix(&self) -> String {
        format!("{}/coordinators/", self.options.prefix)
    }

    /// A new lease, with this coordinator listed under it.
    async fn grant(&self) -> Result<i64, String> {
        let ttl = self.options.lease_ttl.as_secs() as i64;
        let granted = timed(
            "granting a lease",
            LeaseClient::new(self.channel.clone()).lease_grant(LeaseGrantRequest { ttl, id: 0 }),
        )
        .await?;
        if !granted.error.is_empty() {
            return Err(format!("granting a lease: {}", granted.error));
        }
        let value = serde_json::to_vec(&self.options.me).unwrap_or_default();
        timed(
            "listing this coordinator",
            KvClient::new(self.channel.clone()).put(PutRequest {
                key: format!("{}{}", self.members_prefix(), self.options.me.id).into_bytes(),
                value,
                lease: granted.id,
            }),
        )
        .await?;
        *self.lease.lock().unwrap_or_else(|p| p.into_inner()) = granted.id;
        Ok(granted.id)
    }

    /// One lease after another: campaign under it, lead while it lasts.
    async fn run(self: Arc<Self>, mut lease: i64) {
        loop {
            let (valid_tx, mut valid) =
                watch::channel(Some(Instant::now() + self.options.lease_ttl));
            let _alive = AbortOnDropHandle::new(tokio::spawn(keep_alive(
                self.channel.clone(),
                lease,
                self.options.lease_ttl,
                valid_tx,
            )));
            let lost = async {
                // Deposed a margin before etcd could expire the lease by its clock, or
                // at once when etcd says it is gone.
                let margin = self.options.lease_ttl / 4;
                loop {
                    let Some(until) = *valid.borrow_and_update() else {
                        return;
                    };
                    let at = until.checked_sub(margin).unwrap_or(until);
                    tokio::select! {
                        _ = tokio::time::sleep_until(at.into()) => {
                            if *valid.borrow() == Some(until) {
                                return;
                            }
                        }
                        changed = valid.changed() => if changed.is_err() {
                            tokio::time::sleep_until(at.into()).await;
                            return;
                        }
                    }
                }
            };
            let campaign = async {
                loop {
                    let r = ElectionClient::new(self.channel.clone())
                        .campaign(CampaignRequest {
                            name: self.election(),
                            lease,
                            value: serde_json::to_vec(&self.options.me).unwrap_or_default(),
                        })
                        .await;
                    match r {
                        Ok(_) => return,
                        Err(s) => {
                            self.set_error(format!("campaigning: {}", s.message()));
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
            };
            tokio::pin!(lost);
            tokio::select! {
                () = campaign => {
                    self.role.send_replace(Role::Leader);
                    tracing::info!("elected leader of the coordinators (lease {lease:x})");
                    lost.await;
                    let reason = format!(
                        "lost the lead: the etcd lease could not be renewed for {:?} ({})",
                        self.options.lease_ttl * 3 / 4,
                        unreachable(&self.options.endpoints, "no keep-alive answered")
                    );
                    self.role.send_replace(Role::Deposed(reason));
                    return;
                }
                () = &mut lost => {
                    self.set_error(unreachable(
                        &self.options.endpoints,
                        "the lease expired while waiting to lead",
                    ));
                }
            }
            // A standby whose lease expired takes a new one once etcd answers again.
            lease = loop {
                match self.grant().await {
                    Ok(l) => break l,
                    Err(e) => {
                        self.set_error(unreachable(&self.options.endpoints, e));
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            };
        }
    }

    fn set_error(&self, error: String) {
        self.role.send_if_modified(|r| match r {
            Role::Standby { error: e, .. } if e.as_ref() != Some(&error) => {
                *e = Some(error);
                true
            }
            _ => false,
        });
    }

    /// Keeps a standby's view of the leader current, once a second.
    async fn observe(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            if !matches!(*self.role.borrow(), Role::Standby { .. }) {
                continue;
            }
            let seen = self.leader().await;
            self.role.send_if_modified(|r| match r {
                Role::Standby { leader, error } => {
                    let (l, e) = match seen.clone() {
                        Ok(l) => (l, None),
                        Err(e) => (leader.clone(), Some(e)),
                    };
                    let changed = *leader != l || *error != e;
                    *leader = l;
                    *error = e;
                    changed
                }
                _ => false,
            });
        }
    }

    /// The leader etcd names now (`None`: none is elected).
    async fn leader(&self) -> Result<Option<Member>, String> {
        match timed(
            "asking for the leader",
            ElectionClient::new(self.channel.clone()).leader(LeaderRequest {
                name: self.election(),
            }),
        )
        .await
        {
            Ok(r) => {
                Ok(r.kv.and_then(|kv| serde_json::from_slice::<Member>(&kv.value).ok()))
            }
            Err(e) if e.contains("no leader") => Ok(None),
            Err(e) => Err(unreachable(&self.options.endpoints, e)),
        }
    }

    /// Waits until `wanted` picks something out of the role.
    async fn wait_role<T>(&self, wanted: impl Fn(&Role) -> Option<T>) -> Option<T> {
        let mut role = self.role.subscribe();
        loop {
            if let Some(t) = wanted(&role.borrow_and_update()) {
                return Some(t);
            }
            if role.changed().await.is_err() {
                return None;
            }
        }
    }

    /// Whether this coordinator may serve; otherwise why not, naming the leader.
    pub fn check(&self) -> Result<(), String> {
        match &*self.role.borrow() {
            Role::Leader => Ok(()),
            Role::Standby { leader, error } => {
                Err(standby_message(leader.as_ref(), error.as_deref()))
            }
            Role::Deposed(reason) => Err(format!("this coordinator stopped leading: {reason}")),
        }
    }

    /// Returns once this coordinator lost the lead, with why.
    pub async fn deposed(&self) -> String {
        self.wait_role(|r| match r {
            Role::Deposed(reason) => Some(reason.clone()),
            _ => None,
        })
        .await
        .unwrap_or_else(|| "the election stopped".into())
    }

    /// Waits until elected.
    pub async fn elected(&self) {
        if self
            .wait_role(|r| matches!(r, Role::Leader).then_some(()))
            .await
            .is_none()
        {
            std::future::pending::<()>().await;
        }
    }

    /// The coordinators listed in etcd, and which of them leads.
    pub async fn members(&self) -> Result<(Vec<Member>, Option<Member>), String> {
        let prefix = self.members_prefix().into_bytes();
        let listed = timed(
            "listing the coordinators",
            KvClient::new(self.channel.clone()).range(RangeRequest {
                range_end: prefix_end(&prefix),
                key: prefix,
                limit: 0,
            }),
        )
        .await
        .map_err(|e| unreachable(&self.options.endpoints, e))?;
        let members = listed
            .kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice::<Member>(&kv.value).ok())
            .collect();
        Ok((members, self.leader().await.ok().flatten()))
    }

    /// This coordinator.
    pub fn me(&self) -> &Member {
        &self.options.me
    }

    /// Leaves the election at once (the lease revoked, so a standby takes over without
    /// waiting for it to expire).
    pub async fn resign(&self) {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).clear();
        let id = *self.lease.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = timed(
            "revoking the lease",
            LeaseClient::new(self.channel.clone()).lease_revoke(LeaseRevokeRequest { id }),
        )
        .await
        {
            tracing::warn!("leaving the election: {e} (the lease expires by itself)");
        }
    }
}

/// What a standby answers instead of serving.
pub fn standby_message(leader: Option<&Member>, error: Option<&str>) -> String {
    match (leader, error) {
        (_, Some(e)) => format!(
            "this coordinator is a standby and no leader can be confirmed: {e}; jobs make no \
             progress until etcd answers"
        ),
        (Some(l), None) => format!(
            "this coordinator is a standby; the leader is {} (REST {}, gRPC {})",
            l.id, l.http, l.grpc
        ),
        (None, None) => "this coordinator is a standby; no leader is elected yet".into(),
    }
}

/// The end of the key range holding every key that starts with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Renews `lease` every third of its time to live; publishes until when it is valid
/// (from the moment each renewal was sent), and `None` once etcd says it is gone.
async fn keep_alive(
    channel: Channel,
    lease: i64,
    ttl: Duration,
    valid: watch::Sender<Option<Instant>>,
) {
    let every = ttl / 3;
    loop {
        let (tx, rx) = mpsc::channel(1);
        // etcd answers the stream's headers with the first renewal: queued before.
        let mut sent = Instant::now();
        if tx.try_send(LeaseKeepAliveRequest { id: lease }).is_err() {
            return;
        }
        let opened = tokio::time::timeout(
            CALL_TIMEOUT,
            LeaseClient::new(channel.clone()).lease_keep_alive(ReceiverStream::new(rx)),
        )
        .await;
        let mut stream = match opened {
            Ok(Ok(s)) => s.into_inner(),
            _ => {
                tokio::time::sleep(every.min(Duration::from_secs(1))).await;
                continue;
            }
        };
        loop {
            match tokio::time::timeout(every, stream.message()).await {
                Ok(Ok(Some(r))) if r.ttl > 0 => {
                    valid.send_replace(Some(sent + Duration::from_secs(r.ttl as u64)));
                }
                Ok(Ok(Some(_))) => {
                    valid.send_replace(None);
                    return;
                }
                _ => break,
            }
            tokio::time::sleep_until((sent + every).into()).await;
            sent = Instant::now();
            if tx.send(LeaseKeepAliveRequest { id: lease }).await.is_err() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_urls_parse_or_say_what_is_wrong() {
        assert_eq!(
            parse_etcd_url("etcd://127.0.0.1:2379,127.0.0.2:2379").unwrap(),
            vec!["http://127.0.0.1:2379", "http://127.0.0.2:2379"]
        );
        assert_eq!(
            parse_etcd_url("etcds://10.0.0.1:2379").unwrap(),
            vec!["https://10.0.0.1:2379"]
        );
        assert!(
            parse_etcd_url("http://x:1")
                .unwrap_err()
                .contains("not an etcd address")
        );
        assert!(
            parse_etcd_url("etcd://")
                .unwrap_err()
                .contains("names no etcd")
        );
        assert!(
            parse_etcd_url("etcd://host")
                .unwrap_err()
                .contains("not host:port")
        );
    }

    #[test]
    fn a_prefix_range_ends_after_every_key_with_the_prefix() {
        assert_eq!(prefix_end(b"a/"), b"a0".to_vec());
        assert_eq!(prefix_end(&[0x61, 0xff]), vec![0x62]);
    }
}
