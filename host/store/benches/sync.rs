//! What a `stat` between a file's write and its sync costs (BENCHMARKS.md, issue 50's sixth
//! stop). Since Linux 6.13 a `stat` that reads a file's times makes its next write take a
//! fine-grained time, so a file stated between its writes changes its modification time at
//! every write, and its `fdatasync` writes the inode too. The store checks its `-wal` at every
//! commit, so it asks for the inode alone (`identity` in lib.rs): this bench shows why.
//!
//! `cargo bench -p promptd-store --bench sync` writes 8 KiB and syncs a file in the target
//! directory 2,000 times in each way, three rounds taking turns, and prints the wall and CPU
//! time per sync. `SYNC_ROUNDS` and `SYNC_WRITES` change the counts. Linux only.

#[cfg(target_os = "linux")]
fn main() {
    linux::main();
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("the sync bench runs on Linux only");
}

#[cfg(target_os = "linux")]
mod linux {
    use std::os::unix::fs::FileExt;
    use std::path::Path;
    use std::time::{Duration, Instant};

    /// What runs between a write and its sync.
    #[derive(Clone, Copy)]
    enum Between {
        Nothing,
        /// A `stat` that reads the times, as `std::fs::metadata` does.
        WholeStat,
        /// A `statx` asking for the inode alone, as the store reads its `-wal` and `-shm`.
        InodeOnly,
    }

    impl Between {
        fn name(self) -> &'static str {
            match self {
                Between::Nothing => "nothing",
                Between::WholeStat => "a whole stat (times read)",
                Between::InodeOnly => "a statx of the inode alone",
            }
        }

        fn run(self, path: &Path) {
            match self {
                Between::Nothing => {}
                Between::WholeStat => {
                    std::fs::metadata(path).expect("stat");
                }
                Between::InodeOnly => {
                    use rustix::fs::{statx, AtFlags, StatxFlags, CWD};
                    statx(CWD, path, AtFlags::empty(), StatxFlags::INO).expect("statx");
                }
            }
        }
    }

    /// This thread's CPU time so far (`/proc/thread-self/schedstat`, in nanoseconds).
    fn cpu() -> Duration {
        let stat = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
        let ns = stat
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .expect("schedstat's first field");
        Duration::from_nanos(ns)
    }

    /// Writes and syncs `writes` times with `between` in between: wall and CPU time per sync.
    fn measure(path: &Path, between: Between, writes: u32) -> (Duration, Duration) {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .expect("open");
        let block = [7u8; 8192];
        let (wall, used) = (Instant::now(), cpu());
        for i in 0..writes {
            file.write_all_at(&block, u64::from(i % 64) * 8192)
                .expect("write");
            between.run(path);
            file.sync_data().expect("fdatasync");
        }
        (wall.elapsed() / writes, (cpu() - used) / writes)
    }

    fn count(var: &str, default: u32) -> u32 {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    pub fn main() {
        let (rounds, writes) = (count("SYNC_ROUNDS", 3), count("SYNC_WRITES", 2000));
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("sync-bench");
        std::fs::create_dir_all(&dir).expect("bench dir");
        let path = dir.join("file");
        std::fs::write(&path, vec![0u8; 64 * 8192]).expect("create the file");
        let ways = [Between::Nothing, Between::WholeStat, Between::InodeOnly];
        let mut results = vec![Vec::new(); ways.len()];
        for _ in 0..rounds {
            for (way, result) in ways.iter().zip(&mut results) {
                result.push(measure(&path, *way, writes));
            }
        }
        println!(
            "{writes} × (pwrite 8 KiB, then it, then fdatasync), {rounds} rounds taking turns, in {}",
            dir.display()
        );
        println!("| between the write and the sync | wall per sync | CPU per sync |");
        println!("| --- | --- | --- |");
        for (way, result) in ways.iter().zip(&results) {
            let show = |pick: fn(&(Duration, Duration)) -> Duration| {
                result
                    .iter()
                    .map(|r| format!("{:.1}", pick(r).as_secs_f64() * 1e6))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            println!(
                "| {} | {} µs | {} µs |",
                way.name(),
                show(|r| r.0),
                show(|r| r.1)
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
