//! The corpus of block pages and of pages that are not (`tests/fixtures/blocks/`), and the
//! corpus of application shells and of pages that are not (`tests/fixtures/shells/`): each
//! file one answer as a site sends it, with what the worker must make of it.

use std::path::PathBuf;

/// One answer of the corpus.
#[derive(Debug, Clone)]
pub struct Answer {
    pub name: String,
    pub status: u16,
    /// As sent, `x-expect` left out.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// `page`, or the block as a failure reason names it after `blocked: `.
    pub expect: String,
}

impl Answer {
    pub fn is_page(&self) -> bool {
        self.expect == "page"
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        let found = self
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name));
        found.map(|(_, value)| value.as_str())
    }
}

/// The block pages' corpus.
pub const BLOCKS: &str = "blocks";
/// The application shells' corpus.
pub const SHELLS: &str = "shells";

fn folder(corpus: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(corpus)
}

/// Every answer of the block pages' corpus, by name.
pub fn all() -> Vec<Answer> {
    all_of(BLOCKS)
}

/// Every answer of `corpus`, by name.
pub fn all_of(corpus: &str) -> Vec<Answer> {
    let mut names: Vec<String> = std::fs::read_dir(folder(corpus))
        .expect("the corpus folder")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter_map(|file| file.strip_suffix(".http").map(str::to_owned))
        .collect();
    names.sort();
    names.iter().map(|name| answer_of(corpus, name)).collect()
}

/// The block pages' answer named `name` (its file without `.http`).
pub fn answer(name: &str) -> Answer {
    answer_of(BLOCKS, name)
}

/// The answer of `corpus` named `name`.
pub fn answer_of(corpus: &str, name: &str) -> Answer {
    let path = folder(corpus).join(format!("{name}.http"));
    let raw = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let split = (raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| (at, 4)))
    .or_else(|| raw.windows(2).position(|w| w == b"\n\n").map(|at| (at, 2)));
    let (at, gap) = split.unwrap_or_else(|| panic!("{name}: no blank line after the head"));
    let head = String::from_utf8_lossy(&raw[..at]).into_owned();
    let mut lines = head.lines().map(str::trim_end);
    let status_line = lines.next().unwrap_or_default();
    let status = (status_line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("{name}: no status in {status_line:?}"));
    let mut headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let expect = headers
        .iter()
        .position(|(n, _)| n.eq_ignore_ascii_case("x-expect"));
    let expect = expect.map(|i| headers.remove(i).1);
    Answer {
        name: name.to_owned(),
        status,
        headers,
        body: raw[at + gap..].to_vec(),
        expect: expect.unwrap_or_else(|| panic!("{name}: no x-expect")),
    }
}
