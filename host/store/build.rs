//! The schema migrations of both databases, listed from their folders: a new migration is a
//! new numbered file (`NNN-what.sql`), and nothing else names it. The numbers must run
//! 1, 2, 3, … without a gap or a repeat (a database records how many have run).

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    for (dir, file) in [
        ("src/migrations", "sqlite_migrations.rs"),
        ("src/pg", "pg_migrations.rs"),
    ] {
        println!("cargo::rerun-if-changed={dir}");
        let list = listed(dir);
        std::fs::write(Path::new(&out).join(file), list).expect("write the migration list");
    }
}

/// `&[include_str!(…), …]` of the numbered `.sql` files of `dir`, in order.
fn listed(dir: &str) -> String {
    let root = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let mut files: Vec<(u32, String)> = std::fs::read_dir(Path::new(&root).join(dir))
        .unwrap_or_else(|e| panic!("read {dir}: {e}"))
        .filter_map(|e| {
            let path = e.expect("a directory entry").path();
            let name = path.file_name()?.to_str()?.to_string();
            let n = name.strip_suffix(".sql")?.split('-').next()?.parse().ok()?;
            Some((n, path.to_string_lossy().into_owned()))
        })
        .collect();
    files.sort();
    let mut s = String::from("&[\n");
    for (k, (n, path)) in files.iter().enumerate() {
        assert_eq!(
            *n as usize,
            k + 1,
            "{dir}: migration {n} is out of sequence (the numbers must run 1, 2, 3, … once each)"
        );
        writeln!(s, "    include_str!({path:?}),").unwrap();
    }
    s.push(']');
    s
}
