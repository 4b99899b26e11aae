//! A role on a host (coordinator, state node, worker): the command line and
//! environment it runs with, the files that describe it on the host, and the `sh`
//! scripts that start, stop and find it under systemd or as a plain process.
//!
//! Everything lives under the host's install directory:
//! `releases/<sha256>/sluice` (binaries by checksum), `bin/sluice` (the newest),
//! `etc/<role>.env` (its environment, readable by its owner only), `etc/<role>.digest`
//! (what it was last started as, to tell a change), `run/<role>.pid` and
//! `log/<role>.log` (process mode), `data/` (state nodes' default data directory).
//!
//! This module renders text; it must not run anything.

use sluice_planner::cluster_file::{ClusterSpec, HostSpec, ServiceManager};

use super::ssh::quote;

/// What a role is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The coordinator.
    Coordinator,
    /// A state-service node.
    StateNode,
    /// A compute worker.
    Worker,
    /// A member of the etcd cluster deploy runs for the coordinators' election.
    Etcd,
}

impl Kind {
    /// Its name in files, units and messages.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Coordinator => "coordinator",
            Kind::StateNode => "state-node",
            Kind::Worker => "worker",
            Kind::Etcd => "etcd",
        }
    }
}

/// One role of the cluster, rendered.
pub struct Role<'a> {
    /// What it is.
    pub kind: Kind,
    /// Where it runs.
    pub host: &'a HostSpec,
    /// Its systemd unit name, and its name in files.
    pub service: String,
    /// The executable when it is not this release's `sluice` (the host's etcd).
    pub program: Option<String>,
    /// Arguments after the binary.
    pub args: Vec<String>,
    /// Its environment: the cluster file's, and where its TLS files are.
    pub env: Vec<(String, String)>,
    /// Directories it needs, besides the install directory's own.
    pub data_dirs: Vec<String>,
    /// Files it reads, by path, with contents that are no secret (the REST tokens'
    /// hashes, its certificate).
    pub files: Vec<(String, String)>,
    /// Files only its user may read (its TLS key), sent like its environment: on
    /// standard input, never on a command line.
    pub secrets: Vec<(String, String)>,
}

/// What roles are given besides their command lines.
#[derive(Default)]
pub struct Extras {
    /// The coordinator's tokens file (`--auth-tokens`).
    pub tokens: String,
    /// The cluster's TLS material; none: plain HTTP and gRPC.
    pub tls: Option<TlsMaterial>,
    /// The CA's key (PEM), for coordinators that sign joining workers' certificates.
    pub ca_key: Option<String>,
}

/// The cluster's CA and each host's certificate, as PEM text.
#[derive(Default)]
pub struct TlsMaterial {
    /// The CA's certificate.
    pub ca: String,
    /// Certificate and key by host name.
    pub hosts: std::collections::HashMap<String, (String, String)>,
}

/// Every role of `cluster`, in the order they start: etcd members (when deploy runs
/// them), the coordinators, state nodes, workers.
pub fn roles<'a>(cluster: &'a ClusterSpec, extras: &Extras) -> Vec<Role<'a>> {
    let scheme = if extras.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let mut roles = Vec::new();
    // The coordinators' `--ha`: the user's etcd, or the members started here.
    let mut etcd_url = cluster.etcd.clone();
    if let Some(etcd) = &cluster.managed_etcd {
        let at = |host: usize, port: u16| {
            format!(
                "{scheme}://{}",
                join_host_port(&cluster.hosts[host].bind, port)
            )
        };
        let initial = etcd
            .hosts
            .iter()
            .map(|&h| format!("{}={}", cluster.hosts[h].name, at(h, etcd.peer_port)))
            .collect::<Vec<_>>()
            .join(",");
        for &h in &etcd.hosts {
            let host = &cluster.hosts[h];
            let data_dir = etcd
                .data_dir
                .clone()
                .unwrap_or_else(|| format!("{}/data/etcd", host.install_dir));
            let mut args: Vec<String> = [
                ("--name", host.name.clone()),
                ("--data-dir", data_dir.clone()),
                ("--listen-client-urls", at(h, etcd.client_port)),
                ("--advertise-client-urls", at(h, etcd.client_port)),
                ("--listen-peer-urls", at(h, etcd.peer_port)),
                ("--initial-advertise-peer-urls", at(h, etcd.peer_port)),
                ("--initial-cluster", initial.clone()),
                (
                    "--initial-cluster-token",
                    format!("sluice-{}", cluster.name),
                ),
                ("--initial-cluster-state", "new".to_owned()),
            ]
            .into_iter()
            .flat_map(|(flag, value)| [flag.to_owned(), value])
            .collect();
            if extras.tls.is_some() {
                // Clients (the coordinators) and peers alike present a certificate of
                // the cluster's CA, as every other channel of the cluster does.
                let base = format!("{}/etc/tls", host.install_dir);
                for prefix in ["", "peer-"] {
                    args.extend([
                        format!("--{prefix}cert-file"),
                        format!("{base}/host.pem"),
                        format!("--{prefix}key-file"),
                        format!("{base}/host.key"),
                        format!("--{prefix}trusted-ca-file"),
                        format!("{base}/ca.pem"),
                        format!("--{prefix}client-cert-auth"),
                    ]);
                }
            }
            roles.push(Role {
                kind: Kind::Etcd,
                host,
                service: format!("sluice-{}-etcd", cluster.name),
                program: Some(etcd.binary.clone()),
                args,
                env: Vec::new(),
                data_dirs: vec![data_dir],
                files: Vec::new(),
                secrets: Vec::new(),
            });
        }
        let members = etcd
            .hosts
            .iter()
            .map(|&h| join_host_port(&cluster.hosts[h].bind, etcd.client_port))
            .collect::<Vec<_>>()
            .join(",");
        let scheme = if extras.tls.is_some() {
            "etcds"
        } else {
            "etcd"
        };
        etcd_url = Some(format!("{scheme}://{members}"));
    }
    // Workers and state nodes are given every coordinator; they follow the leader.
    let grpc = cluster
        .coordinators
        .iter()
        .map(|c| {
            format!(
                "{scheme}://{}",
                join_host_port(&cluster.hosts[c.host].bind, c.grpc)
            )
        })
        .collect::<Vec<_>>()
        .join(",");
    let store = cluster.object_store.trim_end_matches('/');
    let role = |kind: Kind, host: usize, args: Vec<String>, data_dirs: Vec<String>| Role {
        kind,
        host: &cluster.hosts[host],
        service: format!("sluice-{}-{}", cluster.name, kind.name()),
        program: None,
        args,
        env: cluster.env.clone(),
        data_dirs,
        files: Vec::new(),
        secrets: Vec::new(),
    };
    for c in &cluster.coordinators {
        let host = &cluster.hosts[c.host];
        let mut args: Vec<String> = vec![
            "coordinator".into(),
            "--http".into(),
            join_host_port(&host.bind, c.http),
            "--grpc".into(),
            join_host_port(&host.bind, c.grpc),
            "--store".into(),
            format!("{store}/coordinator"),
            "--auth-tokens".into(),
            tokens_path(host, &cluster.name),
        ];
        if let Some(etcd) = &etcd_url {
            args.extend([
                "--ha".into(),
                etcd.clone(),
                "--ha-id".into(),
                host.name.clone(),
            ]);
        }
        if extras.tls.is_some() {
            let base = format!("{}/etc/tls/host", host.install_dir);
            args.extend([
                "--tls-cert".into(),
                format!("{base}.pem"),
                "--tls-key".into(),
                format!("{base}.key"),
            ]);
        }
        let mut coordinator = role(Kind::Coordinator, c.host, args, Vec::new());
        if let Some(key) = &extras.ca_key {
            let path = format!("{}/etc/tls/ca.key", host.install_dir);
            coordinator
                .args
                .extend(["--join-ca-key".into(), path.clone()]);
            coordinator.secrets.push((path, key.clone()));
        }
        coordinator
            .files
            .push((tokens_path(host, &cluster.name), extras.tokens.clone()));
        roles.push(coordinator);
    }
    for node in &cluster.state_nodes {
        let host = &cluster.hosts[node.host];
        let data_dir = node
            .data_dir
            .clone()
            .unwrap_or_else(|| format!("{}/data/state", host.install_dir));
        let mut args = vec![
            "state-service".into(),
            "--listen".into(),
            join_host_port(&host.bind, node.port),
            "--node-id".into(),
            host.name.clone(),
            "--data-dir".into(),
            data_dir.clone(),
            "--object-store".into(),
            format!("{store}/state"),
            "--coordinator".into(),
            grpc.clone(),
        ];
        for (flag, value) in [
            ("--memory", &node.memory),
            ("--disk-cache", &node.disk_cache),
        ] {
            if let Some(value) = value {
                args.extend([flag.to_owned(), value.clone()]);
            }
        }
        roles.push(role(Kind::StateNode, node.host, args, vec![data_dir]));
    }
    for worker in &cluster.workers {
        let host = &cluster.hosts[worker.host];
        let mut args = vec![
            "worker".into(),
            "--coordinator".into(),
            grpc.clone(),
            "--host".into(),
            host.bind.clone(),
            "--listen".into(),
            join_host_port(&host.bind, 0),
            "--slots".into(),
            worker.slots.to_string(),
        ];
        if let Some(memory) = &worker.network_memory {
            args.extend(["--network-memory".into(), memory.clone()]);
        }
        roles.push(role(Kind::Worker, worker.host, args, Vec::new()));
    }
    if let Some(tls) = &extras.tls {
        for role in &mut roles {
            role.add_tls(tls);
        }
    }
    roles
}

fn tokens_path(host: &HostSpec, cluster: &str) -> String {
    format!(
        "{}/etc/sluice-{cluster}-coordinator.tokens",
        host.install_dir
    )
}

/// `host:port`, bracketing IPv6 addresses.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

impl Role<'_> {
    fn dir(&self) -> &str {
        &self.host.install_dir
    }

    /// The cluster's CA and this host's certificate and key as files, named in the
    /// environment every role reads them from (gRPC between roles, the REST API).
    fn add_tls(&mut self, tls: &TlsMaterial) {
        let base = format!("{}/etc/tls", self.dir());
        let (cert, key) = tls.hosts.get(&self.host.name).cloned().unwrap_or_default();
        self.files.push((format!("{base}/ca.pem"), tls.ca.clone()));
        self.files.push((format!("{base}/host.pem"), cert));
        self.secrets.push((format!("{base}/host.key"), key));
        for (var, file) in [
            ("SLUICE_TLS_CA", "ca.pem"),
            ("SLUICE_TLS_CERT", "host.pem"),
            ("SLUICE_TLS_KEY", "host.key"),
        ] {
            self.env.push((var.into(), format!("{base}/{file}")));
        }
    }

    /// The binary of release `sha`.
    pub fn binary(&self, sha: &str) -> String {
        format!("{}/releases/{sha}/sluice", self.dir())
    }

    /// The command line, quoted for `sh`.
    fn command_line(&self, sha: &str) -> String {
        std::iter::once(self.program.clone().unwrap_or_else(|| self.binary(sha)))
            .chain(self.args.iter().cloned())
            .map(|a| quote(&a))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The environment file: `NAME='value'` lines, which both `sh` and systemd's
    /// `EnvironmentFile` read.
    pub fn env_file(&self) -> String {
        self.env
            .iter()
            .map(|(k, v)| format!("{k}={}\n", single_quoted(v)))
            .collect()
    }

    /// What the install script reads on standard input: one `path<TAB>base64` line
    /// per private file (its environment, its secrets).
    pub fn secret_input(&self) -> String {
        use base64::Engine;
        let env = (
            format!("{}/etc/{}.env", self.dir(), self.service),
            self.env_file(),
        );
        std::iter::once(&env)
            .chain(&self.secrets)
            .map(|(path, text)| {
                format!(
                    "{path}\t{}\n",
                    base64::engine::general_purpose::STANDARD.encode(text)
                )
            })
            .collect()
    }

    /// The systemd unit.
    pub fn unit(&self, sha: &str) -> String {
        format!(
            "[Unit]\n\
             Description=Sluice {service}\n\
             After=network-online.target\n\
             Wants=network-online.target\n\
             \n\
             [Service]\n\
             Type=simple\n\
             WorkingDirectory={dir}\n\
             EnvironmentFile={dir}/etc/{service}.env\n\
             ExecStart={command}\n\
             Restart=on-failure\n\
             RestartSec=2\n\
             KillSignal=SIGTERM\n\
             TimeoutStopSec=30\n\
             LimitNOFILE=1048576\n\
             \n\
             [Install]\n\
             WantedBy=multi-user.target\n",
            service = self.service,
            dir = self.dir(),
            command = self.command_line(sha),
        )
    }

    /// What the role is started as: equal texts mean nothing to change. The
    /// environment's values are in it, so only its checksum is stored.
    pub fn fingerprint(&self, sha: &str) -> String {
        format!(
            "{:?}\n{}\n{}\n{:?}",
            self.host.service,
            self.unit(sha),
            self.env_file(),
            self.files
        )
    }

    fn unit_path(&self) -> String {
        format!("/etc/systemd/system/{}.service", self.service)
    }

    /// Prints the role's pid when it runs (nothing otherwise); never fails.
    pub fn find_script(&self) -> String {
        match self.host.service {
            ServiceManager::Systemd => format!(
                "systemctl is-active --quiet {s} 2>/dev/null && systemctl show -p MainPID --value {s}; true",
                s = quote(&self.service)
            ),
            ServiceManager::Process => format!(
                "p=$(cat {pid} 2>/dev/null) && [ -n \"$p\" ] && kill -0 \"$p\" 2>/dev/null && \
                 tr '\\0' ' ' < /proc/\"$p\"/cmdline 2>/dev/null | grep -qF -- {marker} && echo \"$p\"; true",
                pid = quote(&format!("{}/run/{}.pid", self.dir(), self.service)),
                marker = quote(&self.marker()),
            ),
        }
    }

    /// What the command line of this role's process contains, so that a reused pid
    /// is not taken for it: the release directory, or an etcd member's data directory.
    fn marker(&self) -> String {
        match (&self.program, self.data_dirs.first()) {
            (Some(_), Some(data)) => data.clone(),
            _ => format!("{}/releases/", self.dir()),
        }
    }

    /// Stops the role if it runs (SIGTERM, then SIGKILL after 20 s).
    pub fn stop_script(&self) -> String {
        match self.host.service {
            ServiceManager::Systemd => {
                format!("systemctl stop {} 2>/dev/null; true", quote(&self.service))
            }
            ServiceManager::Process => format!(
                "p=$({find}); if [ -n \"$p\" ]; then kill -TERM \"$p\"; i=0; \
                 while kill -0 \"$p\" 2>/dev/null && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done; \
                 kill -KILL \"$p\" 2>/dev/null || true; fi; rm -f {pid}",
                find = self.find_script(),
                pid = quote(&format!("{}/run/{}.pid", self.dir(), self.service)),
            ),
        }
    }

    /// Writes the role's files (its environment comes on standard input), restarts it
    /// and records `digest`; prints its pid.
    pub fn install_script(&self, sha: &str, digest: &str) -> String {
        let dir = quote(self.dir());
        let s = &self.service;
        let mut script = format!(
            "set -e\ncd {dir}\nmkdir -p etc/tls run log\n{mkdirs}\
             tab=$(printf '\\t')\n\
             (umask 077; while IFS=\"$tab\" read -r p c; do printf '%s' \"$c\" | base64 -d > \"$p.part\"; \
             mv \"$p.part\" \"$p\"; done)\n{files}{stop}\n",
            mkdirs = self
                .data_dirs
                .iter()
                .map(|d| format!("mkdir -p {}\n", quote(d)))
                .collect::<String>(),
            files = self
                .files
                .iter()
                .map(|(path, text)| format!(
                    "(umask 077; printf '%s' {} > {p}.part)\nmv {p}.part {p}\n",
                    quote(text),
                    p = quote(path)
                ))
                .collect::<String>(),
            stop = self.stop_script(),
        );
        match self.host.service {
            ServiceManager::Systemd => script.push_str(&format!(
                "printf '%s' {unit} > {path}.part\nmv {path}.part {path}\n\
                 systemctl daemon-reload\nsystemctl enable --quiet {s}\nsystemctl restart {s}\n",
                unit = quote(&self.unit(sha)),
                path = quote(&self.unit_path()),
            )),
            ServiceManager::Process => script.push_str(&format!(
                "set -a\n. ./etc/{s}.env\nset +a\n\
                 nohup setsid {command} >> log/{s}.log 2>&1 < /dev/null &\n\
                 echo $! > run/{s}.pid\n",
                command = self.command_line(sha),
            )),
        }
        script.push_str(&format!(
            "printf '%s\\n' {digest} > etc/{s}.digest\nsleep 1\n{find}\n",
            digest = quote(digest),
            find = self.find_script(),
        ));
        script
    }

    /// The digest the role was last started with (empty when none).
    pub fn digest_script(&self) -> String {
        format!(
            "cat {}/etc/{}.digest 2>/dev/null; true",
            quote(self.dir()),
            self.service
        )
    }

    /// The last lines the role logged, to explain a failure.
    pub fn log_tail_script(&self) -> String {
        match self.host.service {
            ServiceManager::Systemd => format!(
                "journalctl -u {} -n 15 --no-pager 2>&1; true",
                quote(&self.service)
            ),
            ServiceManager::Process => format!(
                "tail -n 15 {}/log/{}.log 2>&1; true",
                quote(self.dir()),
                self.service
            ),
        }
    }

    /// Stops the role and removes its unit and files.
    pub fn remove_script(&self) -> String {
        let s = &self.service;
        let dir = quote(self.dir());
        let mut script = match self.host.service {
            ServiceManager::Systemd => format!(
                "if command -v systemctl >/dev/null; then systemctl disable --now {s} 2>/dev/null; \
                 rm -f {path}; systemctl daemon-reload; fi\n",
                path = quote(&self.unit_path()),
            ),
            ServiceManager::Process => format!("{}\n", self.stop_script()),
        };
        script.push_str(&format!(
            "rm -f {dir}/etc/{s}.env {dir}/etc/{s}.digest {dir}/run/{s}.pid\n"
        ));
        for (path, _) in self.files.iter().chain(&self.secrets) {
            script.push_str(&format!("rm -f {}\n", quote(path)));
        }
        script
    }
}

/// `'text'` for `sh` and systemd alike (a quote inside closes, escapes and reopens).
fn single_quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: &str = "\
name: demo
object_store: s3://bucket/sluice/
env: { AWS_SECRET_ACCESS_KEY: \"it's secret\" }
hosts:
  a: { address: h1, bind: 10.0.0.1 }
  b: { address: h2, service: process }
coordinator: { host: a }
state_nodes: [{ host: b, memory: 1GiB }]
workers: [{ host: a, slots: 2 }, { host: b }]
";

    #[test]
    fn roles_start_in_dependency_order_with_their_addresses() {
        let cluster = sluice_planner::cluster_file::parse_cluster("c", CLUSTER).unwrap();
        let roles = roles(&cluster, &Extras::default());
        let kinds: Vec<Kind> = roles.iter().map(|r| r.kind).collect();
        assert_eq!(
            kinds,
            [
                Kind::Coordinator,
                Kind::StateNode,
                Kind::Worker,
                Kind::Worker
            ]
        );
        assert_eq!(
            roles[0].args,
            [
                "coordinator",
                "--http",
                "10.0.0.1:8081",
                "--grpc",
                "10.0.0.1:6123",
                "--store",
                "s3://bucket/sluice/coordinator",
                "--auth-tokens",
                "/opt/sluice/etc/sluice-demo-coordinator.tokens"
            ]
        );
        assert!(roles[1].args.join(" ").contains(
            "--object-store s3://bucket/sluice/state --coordinator http://10.0.0.1:6123 --memory 1GiB"
        ));
        assert_eq!(roles[1].data_dirs, ["/opt/sluice/data/state"]);
        assert!(
            roles[2]
                .args
                .join(" ")
                .contains("--host 10.0.0.1 --listen 10.0.0.1:0 --slots 2")
        );
        assert_eq!(roles[3].service, "sluice-demo-worker");
        assert_eq!(join_host_port("::1", 80), "[::1]:80");
    }

    #[test]
    fn the_environment_file_reads_back_in_sh() {
        let cluster = sluice_planner::cluster_file::parse_cluster("c", CLUSTER).unwrap();
        let roles = roles(&cluster, &Extras::default());
        let role = &roles[0];
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "{}printf %s \"$AWS_SECRET_ACCESS_KEY\"",
                role.env_file().replace('\n', "; ")
            ))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), "it's secret");
        let unit = role.unit("abc");
        assert!(unit.contains("ExecStart=/opt/sluice/releases/abc/sluice coordinator --http"));
        assert!(unit.contains("EnvironmentFile=/opt/sluice/etc/sluice-demo-coordinator.env"));
        assert!(
            !unit.contains("secret"),
            "secrets stay in the environment file"
        );
    }

    #[test]
    fn etcd_members_start_first_and_the_coordinators_elect_through_them() {
        let text = CLUSTER.replace(
            "coordinator: { host: a }",
            "coordinators: [{ host: a }, { host: b }]\netcd: { hosts: [a], binary: /usr/bin/etcd }",
        );
        let cluster = sluice_planner::cluster_file::parse_cluster("c", &text).unwrap();
        let tls = TlsMaterial {
            ca: "CA".into(),
            hosts: [("a".into(), ("CERT".into(), "KEY".into()))].into(),
        };
        let extras = Extras {
            tokens: String::new(),
            tls: Some(tls),
            ca_key: Some("CAKEY".into()),
        };
        let roles = roles(&cluster, &extras);
        let etcd = &roles[0];
        assert_eq!(etcd.kind, Kind::Etcd);
        let line = etcd.args.join(" ");
        for expected in [
            "--name a --data-dir /opt/sluice/data/etcd",
            "--listen-client-urls https://10.0.0.1:2379",
            "--initial-cluster a=https://10.0.0.1:2380",
            "--initial-cluster-token sluice-demo",
            "--cert-file /opt/sluice/etc/tls/host.pem",
            "--peer-trusted-ca-file /opt/sluice/etc/tls/ca.pem --peer-client-cert-auth",
        ] {
            assert!(line.contains(expected), "{expected} in {line}");
        }
        // The host's etcd runs, not this release; its digest ignores the release, so an
        // upgrade of Sluice does not restart etcd.
        assert!(
            etcd.unit("abc")
                .contains("ExecStart=/usr/bin/etcd --name a")
        );
        assert_eq!(etcd.fingerprint("abc"), etcd.fingerprint("def"));
        assert_eq!(etcd.marker(), "/opt/sluice/data/etcd");
        let coordinator = roles[1].args.join(" ");
        assert!(
            coordinator.contains("--ha etcds://10.0.0.1:2379"),
            "{coordinator}"
        );
        // With workers joining, the coordinators hold the CA's key, as a secret file.
        assert!(coordinator.contains("--join-ca-key /opt/sluice/etc/tls/ca.key"));
        assert!(
            roles[1]
                .secrets
                .iter()
                .any(|(p, k)| p.ends_with("ca.key") && k == "CAKEY")
        );
        // Files the member reads (its key never on a command line) are installed with it.
        assert!(
            etcd.secrets
                .iter()
                .any(|(p, k)| p.ends_with("host.key") && k == "KEY")
        );
    }
}
