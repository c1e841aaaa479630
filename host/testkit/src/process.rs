//! Child processes the end-to-end tests run (provider stubs, client loops, browsers): killed
//! when dropped, and run to completion within a bound.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child that is killed and reaped when dropped, so a failing test leaves nothing running.
pub struct Bounded(pub Child);

impl Drop for Bounded {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `cmd` to completion within `bound`; returns (exit code, stdout, stderr). A child that
/// runs longer is killed and the test fails naming it.
pub fn run_bounded(mut cmd: Command, bound: Duration) -> (Option<i32>, String, String) {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    // Both pipes are drained while the child runs, so a chatty child cannot block on them.
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout")));
    let err = drain(Box::new(child.stderr.take().expect("stderr")));
    let mut child = Bounded(child);
    let deadline = Instant::now() + bound;
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            drop(child);
            panic!("{what} did not finish within {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status.code(),
        out.join().expect("stdout reader"),
        err.join().expect("stderr reader"),
    )
}

/// `tests/sdk_loops/stub_provider.py` (the local stand-in for the providers' APIs) run by
/// `python` on a free loopback port, stopping by itself after `max_seconds`, logging every
/// request to `log` when given. Returns the child and its URL.
pub fn start_stub_provider(
    python: &std::path::Path,
    max_seconds: &str,
    log: Option<&std::path::Path>,
) -> (Bounded, String) {
    use std::io::{BufRead, BufReader};
    let mut cmd = Command::new(python);
    cmd.arg(super::repo_root().join("tests/sdk_loops/stub_provider.py"))
        .args(["--max-seconds", max_seconds]);
    if let Some(log) = log {
        cmd.arg("--log").arg(log);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start stub_provider.py");
    let stdout = child.stdout.take().expect("stdout");
    let child = Bounded(child);
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the stub's port");
    let port: u16 = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("the stub's first line is not a port: {line:?}"));
    (child, format!("http://127.0.0.1:{port}"))
}
