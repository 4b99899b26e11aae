//! Commands on a host over the user's own OpenSSH client (`ssh`), as Ansible does: the
//! user's config, agent and `known_hosts` apply, and one master connection per host is
//! shared by every command of a run (`ControlMaster`), closed when the run ends.
//!
//! This module knows how to reach a host and run POSIX `sh` there; it must not know
//! what a role is.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use sluice_planner::cluster_file::HostSpec;

/// The SSH client of one deploy run.
pub struct Ssh {
    config: Option<PathBuf>,
    control: tempfile::TempDir,
    used: Mutex<BTreeSet<Vec<String>>>,
}

/// What a remote command printed, or why it could not run.
pub type Outcome = Result<String, String>;

impl Ssh {
    /// A client reading `config` instead of `~/.ssh/config` when given.
    pub fn new(config: Option<PathBuf>) -> std::io::Result<Ssh> {
        // ControlPath must fit a Unix socket name (about 100 bytes): a short directory.
        let control = tempfile::Builder::new()
            .prefix("sluice-ssh-")
            .tempdir_in("/tmp")?;
        Ok(Ssh {
            config,
            control,
            used: Mutex::new(BTreeSet::new()),
        })
    }

    /// `ssh` with this run's options and `host`'s user, port and jump host, up to the
    /// destination.
    fn base(&self, host: &HostSpec) -> Vec<String> {
        let mut args: Vec<String> = Vec::new();
        if let Some(config) = &self.config {
            args.push("-F".into());
            args.push(config.display().to_string());
        }
        for option in [
            "BatchMode=yes",
            "ConnectTimeout=10",
            "ServerAliveInterval=5",
            "ServerAliveCountMax=3",
            "ControlMaster=auto",
            "ControlPersist=60",
        ] {
            args.push("-o".into());
            args.push(option.into());
        }
        args.push("-o".into());
        args.push(format!("ControlPath={}/%C", self.control.path().display()));
        if let Some(port) = host.port {
            args.push("-p".into());
            args.push(port.to_string());
        }
        if let Some(user) = &host.user {
            args.push("-l".into());
            args.push(user.clone());
        }
        if let Some(jump) = &host.jump {
            args.push("-J".into());
            args.push(jump.clone());
        }
        args.push(host.address.clone());
        args
    }

    /// Runs `script` with `sh` on `host`, feeding it `stdin`; its standard output, or
    /// an error with the last lines it wrote to standard error.
    pub fn run(&self, host: &HostSpec, script: &str, stdin: Input<'_>) -> Outcome {
        let base = self.base(host);
        if let Ok(mut used) = self.used.lock() {
            used.insert(base.clone());
        }
        let mut command = Command::new("ssh");
        command
            .args(&base)
            .arg("--")
            .arg(format!("sh -c {}", quote(script)))
            .stdin(match stdin {
                Input::None => Stdio::null(),
                _ => Stdio::piped(),
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start ssh: {e} (is OpenSSH's client installed?)"))?;
        let feed = child.stdin.take();
        let fed = match (stdin, feed) {
            (Input::Bytes(bytes), Some(mut pipe)) => {
                pipe.write_all(bytes).map_err(|e| e.to_string())
            }
            (Input::File(path), Some(mut pipe)) => std::fs::File::open(path)
                .and_then(|mut file| std::io::copy(&mut file, &mut pipe).map(drop))
                .map_err(|e| format!("sending {}: {e}", path.display())),
            _ => Ok(()),
        };
        let output = child
            .wait_with_output()
            .map_err(|e| format!("waiting for ssh: {e}"))?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() {
            fed?;
            return Ok(stdout);
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let reason = if tail.is_empty() {
            format!("exit status {}", output.status.code().unwrap_or(-1))
        } else {
            tail.join("; ")
        };
        // ssh exits 255 for its own failures (connection, authentication).
        if output.status.code() == Some(255) {
            return Err(format!("cannot connect over SSH: {reason}"));
        }
        Err(reason)
    }
}

impl Drop for Ssh {
    /// Closes every master connection this run opened.
    fn drop(&mut self) {
        let used = self.used.lock().map(|u| u.clone()).unwrap_or_default();
        for base in used {
            let (destination, options) = base.split_last().expect("base ends in a host");
            let _ = Command::new("ssh")
                .args(options)
                .args(["-O", "exit", destination.as_str()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// What a remote command reads.
#[derive(Clone, Copy)]
pub enum Input<'a> {
    /// Nothing.
    None,
    /// These bytes (kept off the command line, where `ps` would show them).
    Bytes(&'a [u8]),
    /// A local file's contents.
    File(&'a Path),
}

/// `text` as one word of POSIX `sh`.
pub fn quote(text: &str) -> String {
    if !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@,+%".contains(c))
    {
        return text.to_owned();
    }
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn words_survive_the_shell() {
        for word in [
            "plain",
            "",
            "two words",
            "it's",
            "$HOME",
            "a'b'c",
            "`x`",
            "\\n",
        ] {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", quote(word)))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), word);
        }
        assert_eq!(quote("/opt/sluice"), "/opt/sluice");
    }
}
