//! `sluice bench scale` at a small size, as a smoke test of the simulation (the
//! benchmark's real size, 500 workers and 50 state nodes, runs by hand): the simulated
//! roles attach over the real protocols, the job deploys and checkpoints, and a lost
//! state node's shards are opened on the surviving ones.

use sluice_integration_tests::{run_sluice, tempdir};

#[test]
fn the_scale_simulation_runs_checkpoints_and_replaces_a_lost_nodes_shards() {
    let dir = tempdir();
    let args = [
        "bench",
        "scale",
        "--workers",
        "12",
        "--state-nodes",
        "3",
        "--parallelism",
        "24",
        "--shards",
        "9",
        "--seconds",
        "2",
    ];
    let out = run_sluice(&args, dir.path());
    out.assert_success();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row.len(), 11, "{}", out.stdout);
    assert_eq!(&row[..4], ["12", "3", "48", "9"], "{}", out.stdout);
    assert!(
        row[4].parse::<u64>().unwrap_or(0) > 0,
        "checkpoints: {}",
        out.stdout
    );
    assert!(
        out.stderr.contains("the survivors opened"),
        "{}",
        out.stderr
    );
}
