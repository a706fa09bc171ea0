//! `make stack`: the local stack kept up for invoking the function by hand. The emulator
//! (started by `make`, through `scripts/with-moto`), a local site, and a table and bucket
//! seeded with the job, runs and tasks the sample events in `events/` name. Prints the
//! environment and the exact `cargo lambda watch` / `cargo lambda invoke` lines; Enter puts
//! the data back as seeded, Ctrl-C stops.

use conveyor_testkit::{Site, Stack, demo, endpoint, scenario};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Names a person types, fixed so the printed environment stays true across restarts.
const TABLE: &str = "conveyor-tasks";
const BUCKET: &str = "conveyor-results";

#[tokio::main]
async fn main() {
    let site = Site::start().await;
    let stack = Stack::named(&endpoint(), TABLE, BUCKET).await;
    demo::seed(&stack, &site).await;
    print_instructions(&site, &stack);
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    loop {
        tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(_)) => {
                    demo::reset(&stack, &site).await;
                    println!("reset: every task as seeded, no stored object (Enter resets, Ctrl-C stops)");
                }
                // Standard input closed (not a terminal): stay up until Ctrl-C.
                _ => break,
            },
            _ = tokio::signal::ctrl_c() => return,
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// The settings the function reads, as `make run` gives them for the sample events: no host
/// limits or robots.txt, since five of the mixed batch's records are on one host, and a
/// host's rate would turn them into polite waits instead of the README's rows.
fn settings(stack: &Stack) -> String {
    let pairs: Vec<String> = scenario::unlimited_env(stack)
        .into_iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    let lines: Vec<String> = pairs.chunks(3).map(|line| line.join(" ")).collect();
    format!("  export {}", lines.join(" \\\n    "))
}

fn print_instructions(site: &Site, stack: &Stack) {
    let endpoint = endpoint();
    let settings = settings(stack);
    println!(
        "The local stack is up: the AWS emulator on {endpoint}, a site on {site}, table {TABLE} \
         and bucket {BUCKET} seeded for the sample events.

In another shell, set what the function reads (cargo lambda watch passes the environment on):

  export AWS_ENDPOINT_URL={endpoint} AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=test \\
    AWS_SECRET_ACCESS_KEY=test AWS_EC2_METADATA_DISABLED=true
{settings}

(the settings `make run` gives the function for the sample events: without host limits or
robots.txt, so each event gives its row of the README's table; unset HOST_MAX_RPS,
HOST_MAX_INFLIGHT and OBEY_ROBOTS to see politeness at its defaults turn records of one
host into polite waits)

run the function (it rebuilds on every change; a failed cold start is answered to the next
invoke, then needs a restart):

  cargo lambda watch

and, in a third shell, invoke it with a sample event:

  cargo lambda invoke conveyor-worker --data-file events/01-task-pending.json
  cargo lambda invoke conveyor-worker --data-file events/09-mixed-batch.json

and look at what it did:

  cargo run -p conveyor-ops -- progress --job {job} --run {run}
  cargo run -p conveyor-ops -- results --job {job} --run {run} --bucket {BUCKET}

Enter puts every task back as seeded (and removes stored objects); Ctrl-C stops the stack.",
        site = site.url(""),
        job = demo::JOB,
        run = demo::RUN,
    );
}
