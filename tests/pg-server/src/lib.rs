//! A real PostgreSQL server for tests and benchmarks: `initdb` in a temporary directory, then
//! `postgres` on a free loopback port, stopped when the test process ends (a watchdog shell
//! stops it when its parent is gone, and removes the directory).
//!
//! `initdb` and `postgres` refuse to run as root: as root the harness runs them as the
//! `postgres` user (which Debian's package creates) in a directory that user owns. Without a
//! PostgreSQL installation [`shared`] returns `None` after printing `SKIPPED` and the
//! install command.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// What to install when PostgreSQL is missing.
pub const INSTALL: &str = "apt-get update && apt-get install -y postgresql-15";

/// A running server.
#[derive(Debug)]
pub struct Server {
    bin: PathBuf,
    port: u16,
    dir: PathBuf,
    watchdog: u32,
}

/// The directory holding `initdb` and `postgres`, if PostgreSQL is installed.
pub fn bin_dir() -> Option<PathBuf> {
    if let Ok(d) = std::env::var("ABRIDGE_PG_BIN") {
        let d = PathBuf::from(d);
        if d.join("initdb").exists() {
            return Some(d);
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|b| b.join("initdb").exists() && b.join("postgres").exists())
        .collect();
    found.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    if let Some(b) = found.pop() {
        return Some(b);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .find(|p| p.join("initdb").exists() && p.join("postgres").exists())
    })
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// `program args…`, as the `postgres` user when this process is root.
fn as_owner(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

static SHARED: OnceLock<Option<Server>> = OnceLock::new();

/// The server shared by this test process (started on first use), or `None` (after printing
/// why) when PostgreSQL is not installed.
pub fn shared() -> Option<&'static Server> {
    SHARED
        .get_or_init(|| match Server::start() {
            Ok(s) => Some(s),
            Err(why) => {
                // CI installs PostgreSQL and sets this: there a missing server is a failure.
                if std::env::var_os("ABRIDGE_REQUIRE_PG").is_some() {
                    panic!("ABRIDGE_REQUIRE_PG is set but PostgreSQL cannot start: {why}");
                }
                eprintln!("SKIPPED: the PostgreSQL tests ({why}); install it with: {INSTALL}");
                None
            }
        })
        .as_ref()
}

impl Server {
    /// Start a server of its own (stopped on drop, or when this process ends).
    pub fn start() -> Result<Server, String> {
        let bin = bin_dir().ok_or("initdb and postgres are not installed")?;
        let dir = std::env::temp_dir().join(format!(
            "abridge-pg-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        if is_root() {
            let ok = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&dir)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok {
                return Err("running as root, but the directory cannot be given to the 'postgres' user (is the postgresql package installed?)".into());
            }
        }
        let data = dir.join("data");
        let out = as_owner(&bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "abridge",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--locale=C",
            ])
            .output()
            .map_err(|e| format!("cannot run initdb: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let port = free_port();
        // The watchdog: starts postgres, stops it (fast shutdown) when this process is gone
        // or asks, then removes the directory.
        let postgres = format!(
            "{} -D {} -p {port} -h 127.0.0.1 -k {} -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300 -c shared_buffers=64MB",
            bin.join("postgres").display(),
            data.display(),
            dir.display()
        );
        let run = if is_root() {
            format!("runuser -u postgres -- {postgres}")
        } else {
            postgres
        };
        let script = format!(
            "{run} >{log} 2>&1 & pg=$!; stop() {{ kill -INT $(head -1 {pid} 2>/dev/null) 2>/dev/null || kill -INT $pg 2>/dev/null; }}; trap stop TERM; while kill -0 {parent} 2>/dev/null && kill -0 $pg 2>/dev/null; do sleep 0.3; done; stop; wait $pg; rm -rf {dir}",
            log = dir.join("log").display(),
            pid = data.join("postmaster.pid").display(),
            parent = std::process::id(),
            dir = dir.display()
        );
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start postgres: {e}"))?;
        let server = Server {
            bin,
            port,
            dir,
            watchdog: child.id(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if server.psql("postgres", "SELECT 1").is_ok() {
                return Ok(server);
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(server.dir.join("log")).unwrap_or_default();
                return Err(format!(
                    "postgres did not start within 60 s: {}",
                    log.trim()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Run one SQL statement in `db` with psql.
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let psql = if self.bin.join("psql").exists() {
            self.bin.join("psql")
        } else {
            PathBuf::from("psql")
        };
        let out = Command::new(psql)
            .args(["-h", "127.0.0.1", "-U", "abridge", "-X", "-q", "-A", "-t"])
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-d")
            .arg(db)
            .arg("-c")
            .arg(sql)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    /// A new empty database; its `postgres://` URL.
    pub fn database(&self, label: &str) -> String {
        let name = format!(
            "{}_{}_{}",
            label
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                })
                .collect::<String>(),
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        self.psql("postgres", &format!("CREATE DATABASE {name}"))
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        self.url(&name)
    }

    /// The URL of database `name`.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://abridge@127.0.0.1:{}/{name}", self.port)
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.watchdog.to_string())
            .status();
    }
}
