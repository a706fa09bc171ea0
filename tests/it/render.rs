//! Rendering (issue #53), the parts built so far: every page of the shells' corpus
//! (`tests/fixtures/shells/`) is judged as it expects; served by a real local site with
//! politeness at its production defaults, a shell is stored as fetched and its task marked
//! `shell` with the rule it met, on the task and on the object, the same whichever of two
//! deliveries stores it; a page that is not a shell is stored unmarked; `conveyor-ops
//! results` says which results are shells.

use conveyor_testkit::block_pages::{self, Answer, SHELLS};
use conveyor_testkit::*;
use conveyor_worker::domain::shells::shell_of;

use crate::ops::{ops, succeeded};
use crate::polite_defaults::production_defaults;

/// What the worker makes of `answer`: `page`, or the shell rule it meets.
fn judged(answer: &Answer) -> String {
    let shell = shell_of(answer.header("content-type"), &answer.body);
    shell.map_or_else(|| "page".to_owned(), |shell| shell.rule.to_owned())
}

#[test]
fn every_answer_of_the_shells_corpus_is_judged_as_it_expects() {
    let answers = block_pages::all_of(SHELLS);
    assert!(answers.iter().filter(|a| a.is_page()).count() >= 6);
    assert!(answers.iter().filter(|a| !a.is_page()).count() >= 6);

    let wrong: Vec<String> = answers
        .iter()
        .filter(|answer| judged(answer) != answer.expect)
        .map(|a| format!("{}: {} (expected {})", a.name, judged(a), a.expect))
        .collect();

    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[tokio::test]
async fn a_shell_is_stored_as_fetched_and_its_task_marked_with_its_rule() {
    // Arrange: each answer on a site of its own at the production pace, one task each; the
    // first shell delivered twice in the batch.
    let stack = Stack::new().await;
    stack.put_active_run().await;
    let answers = block_pages::all_of(SHELLS);
    let mut sites = Vec::new();
    for answer in &answers {
        let site = Site::start().await;
        let url = site.url(&format!("/shells/{}", answer.name));
        stack.put_task(&answer.name, &url, "pending").await;
        sites.push(site);
    }
    let twice = answers.iter().find(|a| !a.is_page()).expect("a shell");
    let mut records: Vec<_> = answers.iter().map(|a| delivery(&a.name)).collect();
    records.push(delivery(&twice.name));
    let worker = stack.worker_with(|t| t.politeness = production_defaults());

    // Act
    let reply = run_batch(&worker, records).await;

    // Assert: every task succeeded with the bytes served; shells marked, pages not.
    assert!(retried(&reply).is_empty(), "{reply:?}");
    for answer in &answers {
        let task = stack.task(&answer.name).await;
        assert_eq!(
            task.status(),
            Some("successful"),
            "{}: {task:?}",
            answer.name
        );
        let key = task.s("result_key").expect("a result key").to_owned();
        let object = stack.object(&key).await.expect("the stored object");
        assert_eq!(object.body, answer.body, "{}", answer.name);
        let marked = task.0.get("shell").map(|v| v.as_bool().copied());
        if answer.is_page() {
            assert_eq!(marked, None, "{}", answer.name);
            assert_eq!(task.s("shell_rule"), None, "{}", answer.name);
            assert_eq!(object.metadata.get("shell"), None, "{}", answer.name);
            continue;
        }
        assert_eq!(marked, Some(Ok(true)), "{}", answer.name);
        assert_eq!(task.s("shell_rule"), Some(answer.expect.as_str()));
        assert_eq!(object.metadata.get("shell"), Some(&answer.expect));
    }
    let results = ops(&stack, &["results", "--job", JOB, "--run", RUN]).await;
    let lines = succeeded(&results);
    let shells = answers.iter().filter(|a| !a.is_page()).count();
    let summary = String::from_utf8_lossy(&results.stderr);
    assert!(
        summary.contains(&format!("({shells} application shells)")),
        "{summary}"
    );
    for answer in &answers {
        let line = lines
            .lines()
            .find(|l| l.starts_with(&answer.name))
            .expect("a line");
        let marked = format!("shell ({})", answer.expect);
        assert_eq!(line.contains(&marked), !answer.is_page(), "{line}");
    }
}
