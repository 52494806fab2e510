//! Finding transcript files under a directory (`backfill`, `watch`): walkdir, which detects
//! symbolic-link loops, with links leaving the tree ignored unless the caller asks for them.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

/// Deepest folder level visited below the root.
pub const MAX_DEPTH: usize = 16;

/// A transcript file found by [`transcript_files`].
#[derive(Clone, Debug)]
pub struct Found {
    /// The path as reached from the root (through any in-tree links).
    pub path: PathBuf,
    /// The path relative to the root, `/`-separated.
    pub rel: String,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, ms since the epoch (0 when unknown).
    pub mtime_ms: u64,
}

/// What a walk found, and what it passed over and why.
#[derive(Debug, Default)]
pub struct Walk {
    /// Files with a wanted extension, each real file once, sorted by `rel`.
    pub files: Vec<Found>,
    /// One line per entry passed over: a link loop, a link out of the tree, an unreadable
    /// folder.
    pub skipped: Vec<String>,
}

/// Every file under `root` whose extension is one of `exts`, hidden entries (`.name`) left
/// out. Symbolic links are followed inside the tree; a link whose target lies outside the
/// tree is passed over unless `follow_out` (and a loop is always reported and cut). A file
/// reached through several links is listed once.
pub fn transcript_files(root: &Path, exts: &[&str], follow_out: bool) -> std::io::Result<Walk> {
    let canon_root = std::fs::canonicalize(root)?;
    if !canon_root.is_dir() {
        return Err(std::io::Error::other("not a directory"));
    }
    let mut walk = Walk::default();
    // Real path → (reached without a link, the file as found).
    let mut found: std::collections::BTreeMap<PathBuf, (bool, Found)> = Default::default();
    let rel_of = |p: &Path| {
        p.strip_prefix(root)
            .unwrap_or(p)
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/")
    };
    let it = walkdir::WalkDir::new(root)
        .follow_links(true)
        .max_depth(MAX_DEPTH)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| e.depth() == 0 || !e.file_name().to_string_lossy().starts_with('.'));
    let mut it = it;
    while let Some(entry) = it.next() {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                let at = e.path().map(rel_of).unwrap_or_default();
                if e.loop_ancestor().is_some() {
                    walk.skipped.push(format!(
                        "{at}: a symbolic-link loop (a link to a folder above it); not followed"
                    ));
                } else {
                    walk.skipped.push(format!("{at}: {e}"));
                }
                continue;
            }
        };
        if entry.path_is_symlink() && !follow_out {
            let inside =
                std::fs::canonicalize(entry.path()).is_ok_and(|t| t.starts_with(&canon_root));
            if !inside {
                walk.skipped.push(format!(
                    "{}: a symbolic link out of the folder; not followed (--follow-links follows it)",
                    rel_of(entry.path())
                ));
                if entry.file_type().is_dir() {
                    it.skip_current_dir();
                }
                continue;
            }
        }
        if !entry.file_type().is_file() {
            continue;
        }
        let ext = entry
            .path()
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("");
        if !exts.contains(&ext) {
            continue;
        }
        let Ok(real) = std::fs::canonicalize(entry.path()) else {
            continue;
        };
        let rel = rel_of(entry.path());
        // One real file once, however many links lead to it, under its own name when the
        // walk reaches it directly too.
        let direct = real == canon_root.join(&rel);
        if found.get(&real).is_some_and(|(d, _)| *d || !direct) {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue };
        let file = Found {
            path: entry.path().to_path_buf(),
            rel,
            size: meta.len(),
            mtime_ms: meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis() as u64),
        };
        found.insert(real, (direct, file));
    }
    walk.files = found.into_values().map(|(_, f)| f).collect();
    walk.files.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(walk)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn link_loops_are_cut_and_outside_links_ignored() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.jsonl"), "{}\n").unwrap();
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join("p1")).unwrap();
        std::fs::create_dir_all(root.join("p2")).unwrap();
        std::fs::write(root.join("p1/notes.jsonl"), "{}\n").unwrap();
        std::fs::write(root.join("p2/notes.jsonl"), "{}\n").unwrap();
        std::fs::write(root.join(".hidden.jsonl"), "{}\n").unwrap();
        // Three self-links: a naive walk never ends.
        for (at, to) in [("p1/a", ".."), ("p1/b", ".."), ("p2/c", "../p1")] {
            symlink(to, root.join(at)).unwrap();
        }
        symlink(outside.path(), root.join("out")).unwrap();
        symlink(root.join("p1/notes.jsonl"), root.join("alias.jsonl")).unwrap();
        let w = transcript_files(root, &["jsonl"], false).unwrap();
        let rels: Vec<&str> = w.files.iter().map(|f| f.rel.as_str()).collect();
        // Each real file once, nothing from outside.
        assert_eq!(rels.len(), 2, "{rels:?}");
        assert_eq!(rels, ["p1/notes.jsonl", "p2/notes.jsonl"]);
        assert!(!rels.iter().any(|r| r.contains("secret")), "{rels:?}");
        assert!(
            w.skipped.iter().any(|s| s.contains("loop")),
            "{:?}",
            w.skipped
        );
        assert!(
            w.skipped
                .iter()
                .any(|s| s.starts_with("out:") && s.contains("--follow-links")),
            "{:?}",
            w.skipped
        );
        let w = transcript_files(root, &["jsonl"], true).unwrap();
        assert!(w.files.iter().any(|f| f.rel == "out/secret.jsonl"));
    }
}
