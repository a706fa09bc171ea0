//! An OTLP/HTTP trace receiver for the tests: `scripts/otlp_receiver.py` in the emulator's
//! venv, decoding each request with the OpenTelemetry protobuf definitions, on 127.0.0.1.
//! A test reads back every span it received as JSON.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How the receiver answers: as a collector should, after a long wait, or with a 503.
#[derive(Debug, Clone, Copy)]
pub enum Mode {
    Ok,
    Slow,
    Refuse,
}

pub struct Receiver {
    pub endpoint: String,
    child: Child,
}

impl Receiver {
    pub async fn start(mode: Mode) -> Self {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let venv = std::env::var("VENV").unwrap_or_else(|_| format!("{root}/.venv"));
        let mode = match mode {
            Mode::Ok => "ok",
            Mode::Slow => "slow",
            Mode::Refuse => "refuse",
        };
        let mut child = Command::new(format!("{venv}/bin/python"))
            .args([&format!("{root}/scripts/otlp_receiver.py"), "--mode", mode])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the OTLP receiver");
        let stdout = child.stdout.take().expect("its stdout");
        let mut line = String::new();
        let mut stdout = BufReader::new(stdout);
        let read = stdout.read_line(&mut line);
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .expect("the receiver says its port within 30 s")
            .expect("its first line");
        let port = line.trim().strip_prefix("port ").expect("`port N`");
        Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            child,
        }
    }

    /// Every span received so far, and how many export requests came.
    pub async fn spans(&self) -> (u64, Vec<Value>) {
        let url = format!("{}/spans", self.endpoint);
        let text = reqwest::get(url).await.expect("GET /spans").text().await;
        let json: Value = serde_json::from_str(&text.expect("a body")).expect("JSON");
        let requests = json["requests"].as_u64().unwrap_or_default();
        let spans = json["spans"].as_array().cloned().unwrap_or_default();
        (requests, spans)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}
