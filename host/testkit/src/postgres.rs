//! A real PostgreSQL server for tests: `initdb` into a temporary folder and `pg_ctl start` on a
//! free loopback port, run as the unprivileged user tests/postgres/install.sh creates (tests run
//! as root, and PostgreSQL refuses root), for the e2e tests `postgres::` and the `load` bench.
//!
//! A watcher process stops the server and removes its folder when the test process exits,
//! however it exits: a static server (shared by a test binary's cases) is never dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The unprivileged user PostgreSQL runs as.
pub const USER: &str = "promptd-pg";
/// What installs PostgreSQL and HAProxy and creates [`USER`] (run as root).
pub const INSTALL: &str = "tests/postgres/install.sh";

/// PostgreSQL's binaries (the newest Debian installed), or a panic saying how to get them.
pub fn bin_dir() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|bin| bin.join("initdb").exists() && bin.join("pg_ctl").exists())
        .collect();
    dirs.sort();
    let Some(bin) = dirs.pop() else {
        panic!(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): run `bash {INSTALL}` \
             as root, which installs Debian's postgresql and haproxy and creates the user {USER}"
        );
    };
    let user = Command::new("id").arg("-u").arg(USER).output();
    if !user.is_ok_and(|o| o.status.success()) {
        panic!("no user {USER} to run PostgreSQL as: run `bash {INSTALL}` as root");
    }
    bin
}

/// A free loopback port (bound and released: a race with another process is unlikely here).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn uid_gid(user: &str) -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let out = Command::new("id").arg(flag).arg(user).output().unwrap();
        String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    (id("-u"), id("-g"))
}

/// `runuser -u promptd-pg -- BIN args…`, failing with its output.
fn run_as(bin: &Path, args: &[&str]) {
    let out = Command::new("runuser")
        .args(["-u", USER, "--"])
        .arg(bin)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("runuser {}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{} {args:?}: {}{}",
        bin.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A PostgreSQL server of its own, in a temporary folder.
pub struct Server {
    /// Its loopback port.
    pub port: u16,
    bin: PathBuf,
    dir: PathBuf,
}

static DATABASES: AtomicU32 = AtomicU32::new(0);

impl Server {
    /// `initdb` and `pg_ctl start` on a free port, as [`USER`]; returns once it accepts
    /// connections. A watcher stops it when this process exits.
    pub fn start() -> Server {
        let bin = bin_dir();
        let dir = std::env::temp_dir().join(format!(
            "promptd-pg-{}-{}",
            std::process::id(),
            DATABASES.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (uid, gid) = uid_gid(USER);
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        let data = dir.join("data");
        run_as(
            &bin.join("initdb"),
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ],
        );
        let port = free_port();
        let server = Server { port, bin, dir };
        server.watch_parent();
        server.resume();
        server
    }

    fn data(&self) -> String {
        self.dir.join("data").to_string_lossy().into_owned()
    }

    /// Starts (again) the server, on the same port, and waits until it accepts connections.
    pub fn resume(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=on",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("log").to_string_lossy().into_owned();
        run_as(
            &self.bin.join("pg_ctl"),
            &[
                "-D",
                &self.data(),
                "-l",
                &log,
                "-o",
                &options,
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
    }

    /// Stops the server at once (`immediate`: as if it crashed; it recovers from its WAL).
    pub fn stop(&self) {
        run_as(
            &self.bin.join("pg_ctl"),
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
    }

    /// A URL for `database` as the superuser.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// A new, empty database; returns its URL.
    pub fn database(&self) -> String {
        let name = format!(
            "t{}_{}",
            std::process::id(),
            DATABASES.fetch_add(1, Ordering::SeqCst)
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match postgres::Client::connect(&self.url("postgres"), postgres::NoTls) {
                Ok(mut admin) => {
                    admin
                        .batch_execute(&format!("CREATE DATABASE {name}"))
                        .unwrap();
                    return self.url(&name);
                }
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("connecting to the test server: {e}"),
            }
        }
    }

    /// Stops the server and removes its folder once this process has exited.
    // Never waited for: the watcher must outlive this process.
    #[allow(clippy::zombie_processes)]
    fn watch_parent(&self) {
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; \
             runuser -u {USER} -- {pg_ctl} -D {data} -m immediate stop >/dev/null 2>&1; \
             rm -rf {dir}",
            pid = std::process::id(),
            pg_ctl = self.bin.join("pg_ctl").display(),
            data = self.data(),
            dir = self.dir.display(),
        );
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", USER, "--"])
            .arg(self.bin.join("pg_ctl"))
            .args(["-D", &self.data(), "-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
