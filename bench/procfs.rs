//! What Linux says about a process the benchmark started.

/// CPU seconds (user + system) so far, to the nanosecond: the sum of the process's threads'
/// run time in `/proc/<pid>/task/*/schedstat` (`/proc/<pid>/stat` counts in 10 ms ticks, too
/// coarse for a few hundred fast requests); the tick count where schedstat is missing.
pub fn cpu_seconds(pid: u32) -> f64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"));
    let nanos: Option<u64> = tasks.ok().map(|tasks| {
        tasks
            .filter_map(Result::ok)
            .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
            .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    });
    match nanos {
        Some(nanos) if nanos > 0 => nanos as f64 / 1e9,
        _ => stat_ticks_seconds(pid),
    }
}

fn stat_ticks_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<f64>().ok())
        .sum();
    ticks / 100.0
}

/// Resident memory in MiB.
pub fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}
