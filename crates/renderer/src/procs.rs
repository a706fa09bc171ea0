//! The browser's processes as Linux lists them in /proc: how many are left in its process
//! group, and how much memory they hold. The renderer retires a browser past its memory
//! bound; tests check a killed browser leaves no process behind; its benchmark sums a
//! process tree's memory.

use std::collections::HashMap;
use std::fs;

/// A process: its id, its parent's, its state letter (`Z`: a zombie) and resident pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub pid: i32,
    pub parent: i32,
    pub state: char,
    pub resident_pages: u64,
}

/// A page of memory, in bytes.
const PAGE: u64 = 4096;

/// Every process this machine lists, with its process group.
pub fn all() -> Vec<(i32, Member)> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            member(pid, &stat)
        })
        .collect()
}

/// The processes whose process group is `group`.
pub fn members(group: i32) -> Vec<Member> {
    (all().into_iter())
        .filter(|(in_group, _)| *in_group == group)
        .map(|(_, member)| member)
        .collect()
}

/// The resident memory of the processes of `group`, in bytes.
pub fn resident_bytes(group: i32) -> u64 {
    members(group).iter().map(Member::resident_bytes).sum()
}

/// The resident memory of every process descended from `root` (not `root` itself), in
/// bytes.
pub fn descendants_resident_bytes(root: i32) -> u64 {
    let every = all();
    let parents: HashMap<i32, i32> = every.iter().map(|(_, m)| (m.pid, m.parent)).collect();
    let descends = |pid: i32| {
        let mut up = parents.get(&pid).copied().unwrap_or(0);
        while up > 1 {
            if up == root {
                return true;
            }
            up = parents.get(&up).copied().unwrap_or(0);
        }
        false
    };
    (every.iter())
        .filter(|(_, m)| descends(m.pid))
        .map(|(_, m)| m.resident_bytes())
        .sum()
}

impl Member {
    pub fn resident_bytes(&self) -> u64 {
        self.resident_pages.saturating_mul(PAGE)
    }
}

/// One line of /proc/PID/stat: its process group and what [`Member`] keeps. The name (the
/// second field) may hold spaces and parentheses, so the fields are read after its last `)`.
fn member(pid: i32, stat: &str) -> Option<(i32, Member)> {
    let (_, after) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let parent = fields.get(1)?.parse().ok()?;
    let group = fields.get(2)?.parse().ok()?;
    let resident_pages = fields.get(21)?.parse().ok()?;
    Some((
        group,
        Member {
            pid,
            parent,
            state,
            resident_pages,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_spaces_and_parentheses_in_its_name_is_read_after_the_name() {
        let line = "4242 (Chrome (x) y) S 1 4240 4240 0 -1 4194560 10 0 0 0 1 2 0 0 20 0 7 0 \
                    100 200000 512 18446744073709551615";

        let read = member(4242, line);

        let expected = Member {
            pid: 4242,
            parent: 1,
            state: 'S',
            resident_pages: 512,
        };
        assert_eq!(read, Some((4240, expected)));
    }

    #[test]
    fn this_test_process_is_a_member_of_its_own_group() {
        let own = std::process::id() as i32;
        let stat = fs::read_to_string(format!("/proc/{own}/stat")).expect("our own stat");
        let (group, _) = member(own, &stat).expect("a readable line");

        let found = members(group);

        assert!(found.iter().any(|m| m.pid == own), "{found:?}");
    }
}
