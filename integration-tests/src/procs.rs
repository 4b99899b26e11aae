//! Processes a test started indirectly (the workers of a `sluice run --workers N`).

/// Pids of the live children of `pid` (from `/proc`).
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat"))
            && let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r)
            && rest.split_whitespace().nth(1) == Some(&pid.to_string())
            && rest.split_whitespace().next() != Some("Z")
        {
            out.push(p);
        }
    }
    out
}
