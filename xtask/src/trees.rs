//! A process's descendants as Linux lists them in /proc, for the renderer's benchmark: their
//! summed resident memory now. (Their CPU time is `benches/reap.py`'s to count.)

use std::collections::HashMap;
use std::fs;

/// The resident memory of every process descended from `root` (not `root` itself), in bytes.
pub fn resident_bytes(root: u32) -> u64 {
    let stats = all_stats();
    let parents: HashMap<u32, u32> = stats.iter().map(|s| (s.pid, s.ppid)).collect();
    let descends = |pid: u32| {
        let mut up = parents.get(&pid).copied().unwrap_or(0);
        while up > 1 {
            if up == root {
                return true;
            }
            up = parents.get(&up).copied().unwrap_or(0);
        }
        false
    };
    stats
        .iter()
        .filter(|s| descends(s.pid))
        .map(|s| s.resident_pages * PAGE)
        .sum()
}

const PAGE: u64 = 4096;

struct Stat {
    pid: u32,
    ppid: u32,
    resident_pages: u64,
}

fn all_stats() -> Vec<Stat> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let fields = after_name(&stat);
            Some(Stat {
                pid,
                ppid: fields.get(1)?.parse().ok()?,
                resident_pages: fields.get(21)?.parse().ok()?,
            })
        })
        .collect()
}

/// The fields of a /proc/PID/stat line after the name, which may hold spaces.
fn after_name(stat: &str) -> Vec<&str> {
    stat.rsplit_once(')')
        .map_or_else(Vec::new, |(_, rest)| rest.split_whitespace().collect())
}
