//! # Cluster files
//!
//! The YAML file `sluice deploy` reads: which hosts a cluster runs on and which roles
//! each host plays. Mistakes are reported as `file:line:column: message`, as in job
//! files, with the same parser and typed readers.
//!
//! ```yaml
//! name: prod                           # names services and process titles; [a-z0-9-]
//! object_store: s3://bucket/sluice     # state and checkpoints (file:///dir on shared disks)
//! install_dir: /opt/sluice             # default; a host may set its own
//! service: systemd                     # systemd (default) | process (no supervisor)
//! env:                                 # for every role, in a file only root reads
//!   AWS_REGION: eu-west-1
//! hosts:
//!   a: { address: 10.0.0.1, user: admin, port: 22, jump: bastion, bind: 10.0.0.1 }
//!   b: { address: 10.0.0.2 }
//! coordinator: { host: a, http: 8081, grpc: 6123 }
//! # or a leader and standbys: coordinators: [{ host: a }, { host: b }] with
//! # etcd: etcd://10.0.0.5:2379 (an etcd cluster of yours), or an etcd deploy runs:
//! # etcd: { hosts: [a, b, c], client_port: 2379, peer_port: 2380, data_dir: /var/lib/x,
//! #         binary: /usr/bin/etcd }        # 1, 3 or 5 members; the host's etcd by default
//! state_nodes:
//!   - { host: b, port: 7071, memory: 4GiB, disk_cache: 100GiB, data_dir: /data/sluice }
//! workers:
//!   - { host: b, slots: 2, network_memory: 1GiB }
//! worker_join: true   # workers not listed (auto-scaled) join with the join token
//! version: 0.3.0       # the release every host runs (default: the deploying binary)
//! releases: https://downloads.example.com/sluice/{version}/sluice-linux-x86_64
//! #         where release {version} is fetched from: https://, http://, file:/// or a path
//! ```
//!
//! `address` is what SSH connects to (a name in the user's SSH config works); `bind` is
//! the address the roles listen on and others reach them at (default: `address`).
//!
//! This module owns the format and its checks; it must not know about SSH, processes or
//! how a role is started.

use std::collections::HashMap;

use crate::job_spec::fields::{self, Fields, Result};
use crate::job_spec::marked_yaml::{self, Node, PosError, Value};
use crate::job_spec::{JobSpecError, at, check_size};

/// How a host keeps the roles running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceManager {
    /// A systemd unit per role, restarted when it fails.
    Systemd,
    /// A detached process per role with a pid file, for hosts without systemd
    /// (containers); nothing restarts a role that dies.
    Process,
}

/// A host of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostSpec {
    /// Its name in the cluster file.
    pub name: String,
    /// What SSH connects to.
    pub address: String,
    /// SSH user (default: the SSH config's).
    pub user: Option<String>,
    /// SSH port (default: the SSH config's).
    pub port: Option<u16>,
    /// A jump host (`ssh -J`).
    pub jump: Option<String>,
    /// Where Sluice is installed on it.
    pub install_dir: String,
    /// The address its roles listen on and advertise.
    pub bind: String,
    /// How its roles are kept running.
    pub service: ServiceManager,
}

/// The coordinator role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordinatorSpec {
    /// Index into [`ClusterSpec::hosts`].
    pub host: usize,
    /// REST port.
    pub http: u16,
    /// Workers' gRPC port.
    pub grpc: u16,
}

/// A state-service node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateNodeSpec {
    /// Index into [`ClusterSpec::hosts`].
    pub host: usize,
    /// Its gRPC port.
    pub port: u16,
    /// RocksDB, disk cache and spool files (default: `data/state` in the install dir).
    pub data_dir: Option<String>,
    /// Memory budget, as written (`4GiB`), already checked.
    pub memory: Option<String>,
    /// Disk cache size, as written, already checked.
    pub disk_cache: Option<String>,
}

/// A compute worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSpec {
    /// Index into [`ClusterSpec::hosts`].
    pub host: usize,
    /// Jobs it runs at once.
    pub slots: u32,
    /// Network memory per job, as written, already checked.
    pub network_memory: Option<String>,
}

/// An etcd cluster `sluice deploy` runs on some of the hosts (the etcd binary is the
/// host's own, Debian's `etcd-server` for one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdSpec {
    /// Indexes into [`ClusterSpec::hosts`], one member each.
    pub hosts: Vec<usize>,
    /// The port clients (the coordinators) use.
    pub client_port: u16,
    /// The port members talk to each other on.
    pub peer_port: u16,
    /// Each member's data directory (default: under the host's install directory).
    pub data_dir: Option<String>,
    /// The etcd executable on the hosts.
    pub binary: String,
}

/// A checked cluster file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSpec {
    /// The cluster's name.
    pub name: String,
    /// The durable store of state and checkpoints.
    pub object_store: String,
    /// Environment of every role, in file order.
    pub env: Vec<(String, String)>,
    /// The hosts, in file order.
    pub hosts: Vec<HostSpec>,
    /// The coordinators: one, or a leader and standbys elected through `etcd`.
    pub coordinators: Vec<CoordinatorSpec>,
    /// The etcd cluster standby coordinators elect their leader in
    /// (`etcd://host:port[,host:port]`), when it is the user's.
    pub etcd: Option<String>,
    /// The etcd cluster deploy runs, when it is deploy's (one of the two is required
    /// with more than one coordinator).
    pub managed_etcd: Option<EtcdSpec>,
    /// The state nodes.
    pub state_nodes: Vec<StateNodeSpec>,
    /// The workers.
    pub workers: Vec<WorkerSpec>,
    /// Whether workers not listed (an auto-scaled group) may join with the cluster's
    /// join token; the coordinators then hold the CA's key to sign their certificates.
    pub worker_join: bool,
    /// The release every host runs, fetched from `releases` (`None`: the binary deploy
    /// is given, or the deploying one).
    pub version: Option<String>,
    /// Where release `{version}` is fetched from: a URL or path template.
    pub releases: Option<String>,
}

const TOP_KEYS: &[&str] = &[
    "name",
    "object_store",
    "install_dir",
    "service",
    "env",
    "hosts",
    "coordinator",
    "coordinators",
    "etcd",
    "state_nodes",
    "workers",
    "worker_join",
    "version",
    "releases",
];
const HOST_KEYS: &[&str] = &[
    "address",
    "user",
    "port",
    "jump",
    "install_dir",
    "bind",
    "service",
];
const SERVICES: &[(&str, ServiceManager)] = &[
    ("systemd", ServiceManager::Systemd),
    ("process", ServiceManager::Process),
];

/// Parses the cluster file `text`; `file` names it in errors.
///
/// # Errors
/// The first mistake, with its position: YAML syntax, an unknown or missing key, a
/// value of the wrong type, a role on a host the file does not name, two roles on one
/// address and port, or a second role of one kind on a host.
pub fn parse_cluster(file: &str, text: &str) -> std::result::Result<ClusterSpec, JobSpecError> {
    check_size(file, text)?;
    let root = marked_yaml::parse(text).map_err(|e| at(file, e))?;
    decode(&root).map_err(|e| at(file, e))
}

fn decode(root: &Node) -> Result<ClusterSpec> {
    let top = Fields::new(root, "", TOP_KEYS)?;
    let name_entry = top.require("name", " (the cluster's name)")?;
    let name = fields::string(name_entry.value, "name")?;
    if !name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(PosError::new(
            name_entry.value.pos,
            format!("`name` may hold only a-z, 0-9 and `-`, found `{name}`"),
        ));
    }
    let store = top.require("object_store", " (s3://bucket/prefix or file:///dir)")?;
    let object_store = fields::string(store.value, "object_store")?;
    if !(object_store.starts_with("s3://") || object_store.starts_with("file:///")) {
        return Err(PosError::new(
            store.value.pos,
            format!(
                "`object_store` must be s3://bucket/prefix or file:///dir, found `{object_store}`"
            ),
        ));
    }
    let install_dir = match top.get("install_dir") {
        Some(e) => absolute(e.value, "install_dir")?,
        None => "/opt/sluice".to_owned(),
    };
    let service = top
        .opt("service", |n, p| fields::choice(n, p, SERVICES))?
        .unwrap_or(ServiceManager::Systemd);
    let env = match top.get("env") {
        Some(e) => env(e.value)?,
        None => Vec::new(),
    };
    let hosts_entry = top.require("hosts", " (name: { address: ... } per host)")?;
    let hosts_fields = host_map(hosts_entry.value)?;
    let mut hosts = Vec::new();
    for (key, value) in hosts_fields {
        hosts.push(host(key, value, &install_dir, service)?);
    }
    let mut places = Places::default();
    let coordinators = match (top.get("coordinator"), top.get("coordinators")) {
        (Some(one), None) => vec![coordinator(one.value, "coordinator", &hosts, &mut places)?],
        (None, Some(list)) => match &list.value.value {
            Value::Seq(items) if (1..=3).contains(&items.len()) => items
                .iter()
                .enumerate()
                .map(|(i, n)| coordinator(n, &format!("coordinators[{i}]"), &hosts, &mut places))
                .collect::<Result<Vec<_>>>()?,
            _ => {
                return Err(PosError::new(
                    list.value.pos,
                    format!(
                        "expected a list of 1 to 3 coordinators for `coordinators`, found {}",
                        list.value.describe()
                    ),
                ));
            }
        },
        (Some(_), Some(both)) => {
            return Err(PosError::new(
                both.key.pos,
                "give `coordinator` (one) or `coordinators` (a list), not both",
            ));
        }
        (None, None) => {
            return Err(PosError::new(
                root.pos,
                "missing `coordinator` ({ host: NAME }) or `coordinators` (a list)",
            ));
        }
    };
    let (etcd, managed_etcd) = match top.get("etcd") {
        None => (None, None),
        Some(e) if matches!(e.value.value, Value::Map(_)) => {
            (None, Some(etcd_members(e.value, &hosts, &mut places)?))
        }
        Some(e) => {
            let url = fields::string(e.value, "etcd")?;
            if !url.starts_with("etcd://") && !url.starts_with("etcds://") {
                return Err(PosError::new(
                    e.value.pos,
                    format!(
                        "`etcd` must be etcd://host:port[,host:port] (etcds:// over TLS), or \
                         {{ hosts: [...] }} for an etcd deploy runs; found `{url}`"
                    ),
                ));
            }
            (Some(url), None)
        }
    };
    if etcd.is_none() && managed_etcd.is_none() && coordinators.len() > 1 {
        return Err(PosError::new(
            root.pos,
            "several coordinators elect their leader through etcd: add `etcd: etcd://host:port` \
             (yours) or `etcd: { hosts: [NAME, ...] }` (deploy runs it)",
        ));
    }
    let state_nodes = list(&top, "state_nodes")?
        .iter()
        .enumerate()
        .map(|(i, n)| state_node(n, &format!("state_nodes[{i}]"), &hosts, &mut places))
        .collect::<Result<Vec<_>>>()?;
    let workers = list(&top, "workers")?
        .iter()
        .enumerate()
        .map(|(i, n)| worker(n, &format!("workers[{i}]"), &hosts, &mut places))
        .collect::<Result<Vec<_>>>()?;
    if workers.is_empty() {
        return Err(PosError::new(
            root.pos,
            "the cluster has no workers: add `workers: [{ host: NAME }]`",
        ));
    }
    let releases = match top.get("releases") {
        Some(e) => {
            let template = fields::string(e.value, "releases")?;
            check_releases(&template).map_err(|m| PosError::new(e.value.pos, m))?;
            Some(template)
        }
        None => None,
    };
    let version = match top.get("version") {
        Some(e) => {
            let version = fields::string(e.value, "version")?;
            check_version(&version).map_err(|m| PosError::new(e.value.pos, m))?;
            if releases.is_none() {
                return Err(PosError::new(
                    e.key.pos,
                    "`version` needs `releases`, the URL or path its binary is fetched from \
                     (with `{version}` in it)",
                ));
            }
            Some(version)
        }
        None => None,
    };
    Ok(ClusterSpec {
        name,
        object_store,
        env,
        hosts,
        coordinators,
        etcd,
        managed_etcd,
        state_nodes,
        workers,
        worker_join: top.opt("worker_join", fields::bool_value)?.unwrap_or(false),
        version,
        releases,
    })
}

/// A release version names a path segment: letters, digits, `.`, `-`, `_` and `+`.
pub fn check_version(version: &str) -> std::result::Result<(), String> {
    let fits = !version.is_empty()
        && version.len() <= 64
        && !version.starts_with('.')
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+'));
    if fits {
        Ok(())
    } else {
        Err(format!(
            "a version may hold only letters, digits, `.`, `-`, `_` and `+` (at most 64, not \
             starting with `.`), found `{version}`"
        ))
    }
}

fn check_releases(template: &str) -> std::result::Result<(), String> {
    if !template.contains("{version}") {
        return Err(format!(
            "`releases` must name where each version is, with `{{version}}` in it; found \
             `{template}`"
        ));
    }
    let kind_ok = ["https://", "http://", "file:///", "/"]
        .iter()
        .any(|p| template.starts_with(p));
    if kind_ok {
        Ok(())
    } else {
        Err(format!(
            "`releases` must be an https://, http:// or file:/// URL or an absolute path, \
             found `{template}`"
        ))
    }
}

fn etcd_members(node: &Node, hosts: &[HostSpec], places: &mut Places) -> Result<EtcdSpec> {
    let f = Fields::new(
        node,
        "etcd",
        &["hosts", "client_port", "peer_port", "data_dir", "binary"],
    )?;
    let entry = f.require("hosts", " (the hosts that run an etcd member)")?;
    let Value::Seq(items) = &entry.value.value else {
        return Err(PosError::new(
            entry.value.pos,
            format!(
                "expected a list of host names for `etcd.hosts`, found {}",
                entry.value.describe()
            ),
        ));
    };
    if ![1, 3, 5].contains(&items.len()) {
        return Err(PosError::new(
            entry.value.pos,
            format!(
                "etcd needs 1, 3 or 5 members (a majority must live), found {}",
                items.len()
            ),
        ));
    }
    let mut members: Vec<usize> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("etcd.hosts[{i}]");
        let name = fields::string(item, &path)?;
        let Some(host) = hosts.iter().position(|h| h.name == name) else {
            let names: Vec<&str> = hosts.iter().map(|h| h.name.as_str()).collect();
            return Err(PosError::new(
                item.pos,
                format!(
                    "`{name}` names no host under `hosts`; the hosts are {}",
                    fields::one_of(&names)
                ),
            ));
        };
        places.role(host, "etcd member", item, &path)?;
        members.push(host);
    }
    let mut ports = [("client_port", 2379), ("peer_port", 2380)].map(|(k, d)| (k, d, 0));
    for (key, default, value) in &mut ports {
        for &host in &members {
            *value = port_or(&f, key, *default, &hosts[host], places)?;
        }
    }
    Ok(EtcdSpec {
        hosts: members,
        client_port: ports[0].2,
        peer_port: ports[1].2,
        data_dir: f.opt("data_dir", absolute)?,
        binary: f
            .opt("binary", fields::string)?
            .unwrap_or_else(|| "etcd".to_owned()),
    })
}

/// Ports taken per bind address, and roles per host, to refuse collisions where the
/// second one is written.
#[derive(Default)]
struct Places {
    ports: HashMap<(String, u16), String>,
    roles: HashMap<(usize, &'static str), String>,
}

impl Places {
    fn port(&mut self, host: &HostSpec, port: &Node, path: &str) -> Result<u16> {
        let number = port_value(port, path)?;
        let key = (host.bind.clone(), number);
        if let Some(first) = self.ports.get(&key) {
            return Err(PosError::new(
                port.pos,
                format!(
                    "port {number} on host {} ({}) is already taken by `{first}`",
                    host.name, host.bind
                ),
            ));
        }
        self.ports.insert(key, path.to_owned());
        Ok(number)
    }

    fn role(&mut self, host: usize, kind: &'static str, node: &Node, path: &str) -> Result<()> {
        if let Some(first) = self.roles.insert((host, kind), path.to_owned()) {
            return Err(PosError::new(
                node.pos,
                format!("a host runs at most one {kind}, and `{first}` already runs on this one"),
            ));
        }
        Ok(())
    }
}

fn host_map(node: &Node) -> Result<Vec<(&Node, &Node)>> {
    match &node.value {
        Value::Map(entries) if !entries.is_empty() => {
            Ok(entries.iter().map(|(k, v)| (k, v)).collect())
        }
        _ => Err(PosError::new(
            node.pos,
            format!(
                "expected a mapping of host names to hosts for `hosts`, found {}",
                node.describe()
            ),
        )),
    }
}

fn host(key: &Node, value: &Node, install_dir: &str, service: ServiceManager) -> Result<HostSpec> {
    let name = fields::string(key, "hosts")?;
    let path = format!("hosts.{name}");
    let f = Fields::new(value, &path, HOST_KEYS)?;
    let address = fields::string(
        f.require("address", " (what SSH connects to)")?.value,
        &f.path_of("address"),
    )?;
    let text = |key: &str| f.opt(key, fields::string);
    Ok(HostSpec {
        bind: text("bind")?.unwrap_or_else(|| address.clone()),
        user: text("user")?,
        port: f.opt("port", port_value)?,
        jump: text("jump")?,
        install_dir: f
            .opt("install_dir", absolute)?
            .unwrap_or_else(|| install_dir.to_owned()),
        service: f
            .opt("service", |n, p| fields::choice(n, p, SERVICES))?
            .unwrap_or(service),
        name,
        address,
    })
}

fn coordinator(
    node: &Node,
    path: &str,
    hosts: &[HostSpec],
    places: &mut Places,
) -> Result<CoordinatorSpec> {
    let f = Fields::new(node, path, &["host", "http", "grpc"])?;
    let host = host_ref(&f, hosts)?;
    places.role(host, "coordinator", node, path)?;
    let http = port_or(&f, "http", 8081, &hosts[host], places)?;
    let grpc = port_or(&f, "grpc", 6123, &hosts[host], places)?;
    Ok(CoordinatorSpec { host, http, grpc })
}

fn state_node(
    node: &Node,
    path: &str,
    hosts: &[HostSpec],
    places: &mut Places,
) -> Result<StateNodeSpec> {
    let f = Fields::new(
        node,
        path,
        &["host", "port", "data_dir", "memory", "disk_cache"],
    )?;
    let host = host_ref(&f, hosts)?;
    places.role(host, "state node", node, path)?;
    Ok(StateNodeSpec {
        port: port_or(&f, "port", 7071, &hosts[host], places)?,
        data_dir: f.opt("data_dir", absolute)?,
        memory: f.opt("memory", byte_size)?,
        disk_cache: f.opt("disk_cache", byte_size)?,
        host,
    })
}

fn worker(node: &Node, path: &str, hosts: &[HostSpec], places: &mut Places) -> Result<WorkerSpec> {
    let f = Fields::new(node, path, &["host", "slots", "network_memory"])?;
    let host = host_ref(&f, hosts)?;
    places.role(host, "worker", node, path)?;
    Ok(WorkerSpec {
        slots: f
            .opt("slots", |n, p| fields::u32_in(n, p, 1, 1024))?
            .unwrap_or(1),
        network_memory: f.opt("network_memory", byte_size)?,
        host,
    })
}

/// A list under `key` (missing: empty).
fn list<'a>(top: &Fields<'a>, key: &str) -> Result<&'a [Node]> {
    match top.get(key) {
        None => Ok(&[]),
        Some(e) => match &e.value.value {
            Value::Seq(items) => Ok(items),
            Value::Null => Ok(&[]),
            _ => Err(PosError::new(
                e.value.pos,
                format!("expected a list for `{key}`, found {}", e.value.describe()),
            )),
        },
    }
}

/// The host a role names, by index.
fn host_ref(f: &Fields<'_>, hosts: &[HostSpec]) -> Result<usize> {
    let entry = f.require("host", " (a name under `hosts`)")?;
    let name = fields::string(entry.value, &f.path_of("host"))?;
    hosts.iter().position(|h| h.name == name).ok_or_else(|| {
        let names: Vec<&str> = hosts.iter().map(|h| h.name.as_str()).collect();
        PosError::new(
            entry.value.pos,
            format!(
                "`{}` names no host under `hosts`; the hosts are {}",
                name,
                fields::one_of(&names)
            ),
        )
    })
}

fn port_or(
    f: &Fields<'_>,
    key: &str,
    default: u16,
    host: &HostSpec,
    places: &mut Places,
) -> Result<u16> {
    let path = f.path_of(key);
    match f.get(key) {
        Some(e) => places.port(host, e.value, &path),
        None => {
            let written = Node {
                value: Value::Scalar {
                    text: default.to_string(),
                    quoted: false,
                },
                pos: f.pos,
            };
            places.port(host, &written, &format!("{path} (default {default})"))
        }
    }
}

fn port_value(node: &Node, path: &str) -> Result<u16> {
    fields::u32_in(node, path, 1, 65535).map(|p| p as u16)
}

fn absolute(node: &Node, path: &str) -> Result<String> {
    let text = fields::string(node, path)?;
    if !text.starts_with('/') || text.contains(['\n', '\0']) {
        return Err(PosError::new(
            node.pos,
            format!("`{path}` must be an absolute path, found `{text}`"),
        ));
    }
    Ok(text.trim_end_matches('/').to_owned())
}

fn byte_size(node: &Node, path: &str) -> Result<String> {
    let text = fields::string(node, path)?;
    sluice_common::byte_size::parse(&text)
        .map_err(|e| PosError::new(node.pos, format!("bad size for `{path}`: {e}")))?;
    Ok(text)
}

fn env(node: &Node) -> Result<Vec<(String, String)>> {
    let Value::Map(entries) = &node.value else {
        return Err(PosError::new(
            node.pos,
            format!(
                "expected a mapping of variable names to values for `env`, found {}",
                node.describe()
            ),
        ));
    };
    entries
        .iter()
        .map(|(k, v)| {
            let name = fields::string(k, "env")?;
            let valid = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(PosError::new(
                    k.pos,
                    format!(
                        "`{name}` is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
                    ),
                ));
            }
            let value = match &v.value {
                Value::Scalar { text, .. } if !text.contains(['\n', '\0']) => text.clone(),
                _ => {
                    return Err(PosError::new(
                        v.pos,
                        format!(
                            "expected a one-line value for `env.{name}`, found {}",
                            v.describe()
                        ),
                    ));
                }
            };
            Ok((name, value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "\
name: demo
object_store: s3://bucket/sluice
env:
  AWS_REGION: us-east-1
hosts:
  a: { address: 127.0.0.2, port: 2222, user: root }
  b: { address: 127.0.0.3, service: process, install_dir: /srv/sluice/ }
coordinator: { host: a }
state_nodes:
  - { host: b, memory: 256MiB }
workers:
  - { host: a, slots: 2 }
  - { host: b }
";

    fn error(text: &str) -> String {
        parse_cluster("cluster.yaml", text).unwrap_err().to_string()
    }

    #[test]
    fn a_cluster_file_reads_with_defaults() {
        let c = parse_cluster("cluster.yaml", GOOD).unwrap();
        assert_eq!(c.name, "demo");
        assert_eq!(c.env, vec![("AWS_REGION".into(), "us-east-1".into())]);
        assert_eq!(c.hosts[0].bind, "127.0.0.2");
        assert_eq!(c.hosts[0].port, Some(2222));
        assert_eq!(c.hosts[0].install_dir, "/opt/sluice");
        assert_eq!(c.hosts[0].service, ServiceManager::Systemd);
        assert_eq!(c.hosts[1].install_dir, "/srv/sluice");
        assert_eq!(c.hosts[1].service, ServiceManager::Process);
        assert_eq!(
            c.coordinators[0],
            CoordinatorSpec {
                host: 0,
                http: 8081,
                grpc: 6123
            }
        );
        assert_eq!(c.state_nodes[0].port, 7071);
        assert_eq!(c.state_nodes[0].memory.as_deref(), Some("256MiB"));
        assert_eq!(c.workers[0].slots, 2);
        assert_eq!(c.workers[1].host, 1);
    }

    #[test]
    fn mistakes_point_at_their_place() {
        let two_on_one_port = GOOD.replace("{ host: b, memory", "{ host: a, port: 8081, memory");
        assert_eq!(
            error(&two_on_one_port),
            "cluster.yaml:10:22: port 8081 on host a (127.0.0.2) is already taken by \
             `coordinator.http (default 8081)`"
        );
        assert_eq!(
            error(&GOOD.replace("{ host: b }", "{ host: c }")),
            "cluster.yaml:13:13: `c` names no host under `hosts`; the hosts are a or b"
        );
        assert_eq!(
            error(&GOOD.replace("{ host: b }", "{ host: a }")),
            "cluster.yaml:13:5: a host runs at most one worker, and `workers[0]` already \
             runs on this one"
        );
        assert!(
            error(&GOOD.replace("address: 127.0.0.3", "adress: 1"))
                .starts_with("cluster.yaml:7:8: unknown key `adress` in hosts.b")
        );
        assert!(
            error(&GOOD.replace("service: process", "service: docker"))
                .starts_with("cluster.yaml:7:37: unknown value `docker` for `hosts.b.service`")
        );
        assert!(error(&GOOD.replace("256MiB", "lots")).starts_with("cluster.yaml:10:24: bad size"));
        assert!(error(&GOOD.replace("s3://bucket/sluice", "bucket")).contains("must be s3://"));
        assert!(error(&GOOD.replace("AWS_REGION", "AWS-REGION")).starts_with("cluster.yaml:4:3:"));
        assert!(error(&GOOD.replace("/srv/sluice/", "srv")).contains("absolute path"));
        assert!(error("name: x\nobject_store: s3://b\nhosts: { a: { address: h } }\ncoordinator: { host: a }\n")
            .contains("no workers"));
        assert!(error("name: Prod\n").starts_with("cluster.yaml:1:7: `name` may hold only"));
    }

    #[test]
    fn a_version_is_fetched_from_releases() {
        let plain = parse_cluster("c", GOOD).unwrap();
        assert_eq!((plain.version, plain.releases), (None, None));
        let with =
            format!("{GOOD}version: 1.10\nreleases: https://dl.example.com/{{version}}/sluice\n");
        let c = parse_cluster("c", &with).unwrap();
        assert_eq!(c.version.as_deref(), Some("1.10"));
        assert_eq!(
            c.releases.as_deref(),
            Some("https://dl.example.com/{version}/sluice")
        );
        let path = format!("{GOOD}releases: /srv/releases/{{version}}/sluice\n");
        assert!(parse_cluster("c", &path).unwrap().version.is_none());
        assert_eq!(
            error(&format!("{GOOD}version: 0.3.0\n")),
            "cluster.yaml:14:1: `version` needs `releases`, the URL or path its binary is \
             fetched from (with `{version}` in it)"
        );
        assert!(
            error(&format!("{GOOD}releases: https://dl.example.com/sluice\n"))
                .starts_with("cluster.yaml:14:11: `releases` must name where each version is")
        );
        assert!(
            error(&format!("{GOOD}releases: ftp://x/{{version}}\n"))
                .contains("must be an https://")
        );
        assert!(
            error(&format!("{GOOD}version: ../x\nreleases: /r/{{version}}\n"))
                .starts_with("cluster.yaml:14:10: a version may hold only")
        );
    }

    #[test]
    fn several_coordinators_need_etcd() {
        let ha = GOOD.replace(
            "coordinator: { host: a }",
            "coordinators: [{ host: a }, { host: b }]\netcd: etcd://127.0.0.1:2379",
        );
        let c = parse_cluster("cluster.yaml", &ha).unwrap();
        assert_eq!(c.coordinators.len(), 2);
        assert_eq!(c.etcd.as_deref(), Some("etcd://127.0.0.1:2379"));
        assert!(error(&ha.replace("\netcd: etcd://127.0.0.1:2379", "")).contains("add `etcd:"));
        assert!(error(&ha.replace("etcd://", "http://")).contains("`etcd` must be etcd://"));
        let tls = parse_cluster("c", &ha.replace("etcd://", "etcds://")).unwrap();
        assert_eq!(tls.etcd.as_deref(), Some("etcds://127.0.0.1:2379"));
        assert!(
            error(&ha.replace("{ host: b }]", "{ host: a }]")).contains("at most one coordinator")
        );
        assert!(error(&format!("{ha}coordinator: {{ host: a }}\n")).contains("not both"));
    }

    #[test]
    fn deploy_may_run_the_etcd_members_itself() {
        let ha = GOOD.replace(
            "coordinator: { host: a }",
            "coordinators: [{ host: a }, { host: b }]\netcd: { hosts: [a], client_port: 2479 }",
        );
        let c = parse_cluster("cluster.yaml", &ha).unwrap();
        let etcd = c.managed_etcd.expect("a managed etcd");
        assert_eq!(
            (
                etcd.hosts,
                etcd.client_port,
                etcd.peer_port,
                etcd.binary.as_str()
            ),
            (vec![0], 2479, 2380, "etcd")
        );
        assert_eq!(c.etcd, None);
        let two = error(&ha.replace("hosts: [a]", "hosts: [a, b]"));
        assert!(two.contains("1, 3 or 5 members"), "{two}");
        let unknown = error(&ha.replace("hosts: [a]", "hosts: [z]"));
        assert!(unknown.contains("`z` names no host"), "{unknown}");
        // The member's client port is the coordinator's gRPC port on the same host.
        let taken = error(&ha.replace("client_port: 2479", "client_port: 6123"));
        assert!(taken.contains("port 6123 on host a"), "{taken}");
        let typo = error(&ha.replace("client_port", "clients_port"));
        assert!(typo.contains("clients_port"), "{typo}");
    }

    #[test]
    fn the_example_cluster_file_is_valid() {
        let text = include_str!("../../infra/cluster.example.yaml");
        let c = parse_cluster("infra/cluster.example.yaml", text).unwrap();
        assert_eq!((c.hosts.len(), c.workers.len()), (4, 2));
        assert_eq!(c.hosts[1].jump.as_deref(), Some("bastion.example.com"));
    }

    #[test]
    fn no_input_panics() {
        for end in 0..GOOD.len() {
            if GOOD.is_char_boundary(end) {
                let _ = parse_cluster("c", &GOOD[..end]);
            }
        }
        let _ = parse_cluster("c", &"[".repeat(100_000));
    }
}
