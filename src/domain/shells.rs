//! Application shells: a page whose static HTML is the empty frame of a client-side app (a
//! mount node and script tags), whose content only a browser's run of its scripts brings.
//! Stored as fetched, such a page is a success with nothing in it. This module holds the
//! rules that tell one, as one table where each row names its source, and the check of one
//! response against them. A stored shell's task is marked `shell`, with the rule it met
//! (`render: auto` is to send it to the browser once the rendering tier ships). The rest of
//! the feature is listed in `domain/render.rs`.
//!
//! A page is a shell only with next to no text of its own: at most [`MAX_SHELL_TEXT`]
//! bytes outside its scripts, styles, templates, `<noscript>` and title. So a short but
//! complete page (a 404, a one-line notice) is not one, for it has no mount node, and a
//! server-rendered app (its mount node full) is not one, for it has its text. An AMP page is
//! never one: AMP renders on the server by its rules. Only HTML is read.
//!
//! The check is cheap for the pages it clears. A page without a `<script` tag cannot draw
//! anything in a browser either (one `memmem` search). Then one search for all the markers
//! any rule needs (Aho-Corasick's packed SIMD search, 1.5 µs for 16 KiB of HTML) finds
//! none, and the page is not read further. A page with a marker is tokenized (html5gum, a WHATWG tokenizer), and the reading
//! stops as soon as its text passes the bound.

use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use html5gum::{DefaultEmitter, Token, Tokenizer};
use memchr::memmem;

use crate::domain::bounds::{Bounded, is_html_type};

/// The rule a stored shell met, as the task and the object's metadata record it. A rule
/// name a later release adds reads back as it was written.
pub type ShellRule = Bounded<64>;

/// At most this many bytes of text (whitespace left out) in a shell: a "Loading..." or a
/// title line, not a paragraph.
pub const MAX_SHELL_TEXT: usize = 80;
/// The most bytes read of a page. A longer page is not taken for a shell: shells are a few
/// kilobytes of markup, with their scripts loaded from elsewhere.
pub const SHELL_WINDOW: usize = 512 * 1024;

/// The rule a shell met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shell {
    pub rule: &'static str,
}

impl Shell {
    /// As the task and the object record it.
    pub fn recorded(self) -> ShellRule {
        ShellRule::new(self.rule)
    }
}

/// The rule of the application shell a stored page is, if it is one.
pub fn shell_rule(content_type: &str, body: &[u8]) -> Option<ShellRule> {
    shell_of(Some(content_type), body).map(Shell::recorded)
}

/// One rule of the table.
struct Rule {
    /// As the task records it (`render_reason`, `shell_rule`).
    name: &'static str,
    /// Where the marker comes from.
    source: &'static str,
    /// Whether what the page showed meets the rule.
    met: fn(&Seen) -> bool,
}

/// The rules, the most specific first. Each also needs the page's text within the bound.
const RULES: [Rule; 3] = [
    Rule {
        name: "next data",
        source: "Next.js: the page's props in <script id=\"__NEXT_DATA__\">, rendered into #__next by the client when the server did not",
        met: |seen| seen.next_data,
    },
    Rule {
        name: "mount node",
        source: "the root element a client app mounts on: #root (Create React App, Vite's React), #app (Vue, Vite), #__next (Next.js), #__nuxt (Nuxt), #___gatsby (Gatsby), <app-root> and ng-app (Angular), data-reactroot (React before 18)",
        met: |seen| seen.mount_node,
    },
    Rule {
        name: "noscript",
        source: "a <noscript> telling the reader to turn JavaScript on (\"You need to enable JavaScript to run this app.\", Create React App's template)",
        met: |seen| seen.noscript_asks_for_javascript,
    },
];

/// Each rule's name and source, most specific first, for the docs.
pub fn rules() -> impl Iterator<Item = (&'static str, &'static str)> {
    RULES.iter().map(|rule| (rule.name, rule.source))
}

/// The ids client apps mount on.
const MOUNT_IDS: [&[u8]; 6] = [
    b"root",
    b"app",
    b"__next",
    b"__nuxt",
    b"___gatsby",
    b"svelte",
];
/// The attributes that mark a mount node whatever its id.
const MOUNT_ATTRIBUTES: [&[u8]; 3] = [b"ng-app", b"data-reactroot", b"data-v-app"];
/// The elements that are mount nodes by their name.
const MOUNT_ELEMENTS: [&[u8]; 1] = [b"app-root"];
/// A page without one of these bytes strings meets no rule: it is not tokenized.
const MARKERS: [&[u8]; 11] = [
    b"\"root\"",
    b"\"app\"",
    b"__next",
    b"__nuxt",
    b"___gatsby",
    b"\"svelte\"",
    b"ng-app",
    b"data-reactroot",
    b"data-v-app",
    b"app-root",
    b"noscript",
];
/// A script tag: an app's shell loads its code with one.
static SCRIPT: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(b"<script"));

/// The markers' search, built at its first use.
static MARKED: LazyLock<AhoCorasick> = LazyLock::new(|| {
    AhoCorasickBuilder::new()
        .match_kind(MatchKind::LeftmostFirst)
        .build(MARKERS)
        // Cannot fail: a few short literals are far under the automaton's limits.
        .expect("the markers' automaton")
});

/// Elements whose text is not the page's own.
const NOT_TEXT: [&[u8]; 5] = [b"script", b"style", b"template", b"noscript", b"title"];

/// The application shell `body` is, if it is one. `content_type` is the response's; a body
/// without one is read as HTML only if it starts like markup.
pub fn shell_of(content_type: Option<&str>, body: &[u8]) -> Option<Shell> {
    if body.len() > SHELL_WINDOW || !is_html(content_type, body) {
        return None;
    }
    if SCRIPT.find(body).is_none() || !MARKED.is_match(body) {
        return None;
    }
    let seen = read(body)?;
    RULES
        .iter()
        .find(|rule| (rule.met)(&seen))
        .map(|rule| Shell { rule: rule.name })
}

/// What the tokenizer saw of a page with little text.
#[derive(Debug, Default)]
struct Seen {
    next_data: bool,
    mount_node: bool,
    noscript_asks_for_javascript: bool,
}

/// The page's markers, or `None` once its text passes the bound (or it is AMP).
fn read(body: &[u8]) -> Option<Seen> {
    let mut emitter = DefaultEmitter::default();
    // Script and style content is text of its own, not markup: the tokenizer switches to
    // their states at their start tags, as a browser's tree builder would make it.
    emitter.naively_switch_states(true);
    let (mut seen, mut text) = (Seen::default(), 0_usize);
    let mut inside: Option<Vec<u8>> = None;
    for token in Tokenizer::new_with_emitter(body, emitter).flatten() {
        match token {
            Token::StartTag(tag) if inside.is_none() => {
                if &tag.name[..] == b"html" && is_amp(&tag.attributes) {
                    return None;
                }
                note_element(&mut seen, &tag.name, &tag.attributes);
                if NOT_TEXT.contains(&&tag.name[..]) && !tag.self_closing {
                    inside = Some(tag.name.to_vec());
                }
            }
            Token::EndTag(tag) if inside.as_deref() == Some(&tag.name[..]) => inside = None,
            Token::String(chunk) => match inside.as_deref() {
                Some(b"noscript") => {
                    seen.noscript_asks_for_javascript |= mentions_javascript(&chunk);
                }
                Some(_) => {}
                None => {
                    text += chunk.iter().filter(|b| !b.is_ascii_whitespace()).count();
                    if text > MAX_SHELL_TEXT {
                        return None;
                    }
                }
            },
            _ => {}
        }
    }
    Some(seen)
}

type Attributes =
    std::collections::BTreeMap<html5gum::HtmlString, html5gum::Spanned<html5gum::HtmlString, ()>>;

/// Notes a start tag that is a mount node, or the Next.js data script.
fn note_element(seen: &mut Seen, name: &[u8], attributes: &Attributes) {
    let id = attributes.get(&b"id"[..]).map(|v| &v.value[..]);
    if name == b"script" && id == Some(&b"__NEXT_DATA__"[..]) {
        seen.next_data = true;
    }
    let mount = MOUNT_ELEMENTS.contains(&name)
        || id.is_some_and(|id| MOUNT_IDS.contains(&id))
        || MOUNT_ATTRIBUTES
            .iter()
            .any(|attribute| attributes.contains_key(*attribute));
    seen.mount_node |= mount;
}

/// `<html amp>` or `<html ⚡>`: an AMP page.
fn is_amp(attributes: &Attributes) -> bool {
    attributes.contains_key(&b"amp"[..]) || attributes.contains_key("⚡".as_bytes())
}

fn mentions_javascript(text: &[u8]) -> bool {
    text.windows(10)
        .any(|w| w.eq_ignore_ascii_case(b"javascript"))
}

/// HTML by its type, or, without a type, a body that starts with `<` (after whitespace).
fn is_html(content_type: Option<&str>, body: &[u8]) -> bool {
    match content_type {
        Some(value) => is_html_type(value),
        None => body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'<'),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_names_its_source_and_each_name_is_its_own() {
        for rule in &RULES {
            assert!(!rule.source.is_empty(), "{}", rule.name);
        }
        let mut names: Vec<_> = RULES.iter().map(|r| r.name).collect();
        names.dedup();
        assert_eq!(names.len(), RULES.len());
    }

    #[test]
    fn each_rule_finds_its_shell() {
        let cases = [
            (
                r#"<!doctype html><html><head><title>Shop</title></head><body><div id="root"></div><script src="/static/js/main.4f1c.js"></script></body></html>"#,
                "mount node",
            ),
            (
                r#"<html><body><div id="__next"></div><script id="__NEXT_DATA__" type="application/json">{"props":{"pageProps":{}},"page":"/"}</script></body></html>"#,
                "next data",
            ),
            (
                r#"<html><body><noscript>You need to enable JavaScript to run this app.</noscript><div id="main"></div><script src="/main.js"></script></body></html>"#,
                "noscript",
            ),
            (
                r#"<html><head><base href="/"></head><body><app-root></app-root><script src="main.js" type="module"></script></body></html>"#,
                "mount node",
            ),
        ];
        for (page, rule) in cases {
            assert_eq!(
                shell_of(Some("text/html; charset=utf-8"), page.as_bytes()),
                Some(Shell { rule }),
                "{page}"
            );
        }
    }

    #[test]
    fn pages_with_their_own_text_are_not_shells() {
        let article = "Boils a full kettle in under four minutes. ".repeat(6);
        let cases = [
            // A short but complete page: no mount node.
            "<html><body><h1>Gone</h1><p>This page has moved.</p></body></html>".to_owned(),
            // A server-rendered app: its mount node holds the page.
            format!(r#"<html><body><div id="root"><p>{article}</p></div></body></html>"#),
            // A <noscript> beside the page's own text.
            format!(
                "<html><body><noscript>Enable JavaScript for the map.</noscript><p>{article}</p></body></html>"
            ),
            // AMP renders on the server.
            r#"<html amp><body><div id="app"></div><script src="/v0.js"></script></body></html>"#
                .to_owned(),
            // Nothing to run: no script, whatever its markers.
            r#"<html><body><div id="root"></div></body></html>"#.to_owned(),
            // A script's text is not the page's, but neither is it a mount node.
            r#"<html><body><script>var id = "root";</script></body></html>"#.to_owned(),
        ];
        for page in &cases {
            assert_eq!(shell_of(Some("text/html"), page.as_bytes()), None, "{page}");
        }
    }

    #[test]
    fn only_html_is_read() {
        let shell =
            br#"<html><body><div id="root"></div><script src="/a.js"></script></body></html>"#;

        assert!(shell_of(None, shell).is_some());
        assert_eq!(
            shell_of(Some("application/json"), br#"{"id":"root"}"#),
            None
        );
        assert_eq!(shell_of(None, br#"{"id":"root"}"#), None);
        assert_eq!(shell_of(Some("application/pdf"), b"%PDF-1.7 root"), None);
        assert_eq!(shell_of(Some("text/plain"), shell), None);
    }

    #[test]
    fn a_page_past_the_window_is_not_read() {
        let mut page =
            br#"<html><body><div id="root"></div><script src="/a.js"></script>"#.to_vec();
        page.extend(std::iter::repeat_n(b' ', SHELL_WINDOW));

        assert_eq!(shell_of(Some("text/html"), &page), None);
    }
}
