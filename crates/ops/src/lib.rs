//! conveyor-ops: the operator's routines, one file each, and the local event source
//! mapping. Each routine gets only the stores it uses. The `conveyor-ops` binary
//! (`src/bin/conveyor-ops`) runs them. It is a crate of its own, so the Lambda function's
//! crate links none of it (nor clap or indicatif).

pub mod hosts;
pub mod local_mapping;
pub mod progress;
pub mod redrive;
pub mod replay;
pub mod requeue;
pub mod results;
pub mod submit;

/// `n` and its noun, plural unless one ("1 task", "2 tasks", "2 batches").
pub fn count(n: impl Into<u64>, noun: &str) -> String {
    let sibilant = ["s", "x", "ch", "sh"].iter().any(|end| noun.ends_with(end));
    match n.into() {
        1 => format!("1 {noun}"),
        n if sibilant => format!("{n} {noun}es"),
        n => format!("{n} {noun}s"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_count_says_its_noun_in_the_number_it_has() {
        assert_eq!(super::count(1_u64, "task"), "1 task");
        assert_eq!(super::count(0_u64, "task"), "0 tasks");
        assert_eq!(super::count(4_u64, "batch"), "4 batches");
        assert_eq!(super::count(2_u64, "failed SQS call"), "2 failed SQS calls");
    }
}
