//! The coding-session digest: what no compaction keeps, taken from the transcript's structure
//! deterministically (no model): the user's requests verbatim, the files the session created,
//! edited and read (with the episode each was last touched in), the commands it ran and how
//! they ended, the last error still unresolved, and the open to-do list.
//!
//! **Where it comes from.** A coding agent's transcript parser (Claude Code, Codex) turns each
//! tool call into an *action episode* (role `tool`) whose content is one line starting with
//! [`ACTION`] (`[action] Edit src/main.rs`, `[action] Bash: cargo test`, `[action] TodoWrite:
//! [in_progress] Fix the test; [pending] Docs`), and each failed tool result into a line
//! starting with [`FAILED`] (`[failed] Bash: cargo test → error[E0432]: unresolved import`).
//! Those lines are real episodes: `expand` leads from a digest entry to its episode.
//!
//! **How it is carried.** Like the facts ledger: the entries ([`crate::ledger::Kind`]'s digest
//! kinds) live in each summary row's ledger, merged across folds and kept whole; budgets apply
//! when the digest is rendered ([`render`]). A session without action episodes has no digest
//! (its requests are not collected: it is a chat, summarized as one).

use std::collections::BTreeMap;

use crate::ledger::{Entry, Kind};
use crate::tokens::estimate_tokens;
use crate::types::Role;

/// The start of an action episode's content.
pub const ACTION: &str = "[action] ";
/// The start of a failed tool result's content.
pub const FAILED: &str = "[failed] ";
/// Between a failed action and its error.
pub const ARROW: &str = " → ";

/// Longest action line kept (characters): a command or pattern beyond it is cut with `…`.
const MAX_ACTION: usize = 240;
/// Most to-do items kept from one list.
const MAX_TODOS: usize = 100;
/// Longest error line kept (characters).
const MAX_ERROR: usize = 240;
/// Most digest entries of one kind a row keeps: requests, files, commands and failures beyond
/// it drop the oldest (a bound against hostile input, far above a real session).
const MAX_PER_KIND: usize = 2_000;
/// The kinds an action walk gathers besides requests (created, edited, read, ran, failed,
/// to-do): how far its list may grow before it is bounded again.
const GATHERED_KINDS: usize = 6;

fn cut(s: &str, max: usize) -> String {
    let s = s.trim();
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max).collect();
    out.push('…');
    out
}

/// A request is kept as at most this many lines: a longer one is a pasted log or listing,
/// shown as its first [`REQUEST_HEAD_LINES`] and a count.
const REQUEST_MAX_LINES: usize = 12;
/// The lines a long request keeps.
const REQUEST_HEAD_LINES: usize = 8;
/// A request is kept as at most this many characters (then its start and a count).
pub const REQUEST_MAX_CHARS: usize = 1_000;

/// A user's turn as the digest keeps it as a request: padding trimmed (each line's runs of
/// spaces and tabs made one, blank lines at most one in a row), a pasted log or listing as
/// its first lines and a count, at most [`REQUEST_MAX_CHARS`]; `None` for a one-word turn
/// ("A", "ok", "yes"), which is an answer, not a request.
pub fn request_text(raw: &str) -> Option<String> {
    let mut lines: Vec<String> = Vec::new();
    for line in raw.lines() {
        let l = line.split_whitespace().collect::<Vec<_>>().join(" ");
        if l.is_empty() && lines.last().is_none_or(|p: &String| p.is_empty()) {
            continue;
        }
        lines.push(l);
    }
    while lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    let words: usize = lines
        .iter()
        .map(|l| l.split(' ').filter(|w| !w.is_empty()).count())
        .sum();
    if words < 2 {
        return None;
    }
    let total = lines.len();
    if total > REQUEST_MAX_LINES {
        lines.truncate(REQUEST_HEAD_LINES);
        lines.push(format!("… ({} more lines)", total - REQUEST_HEAD_LINES));
    }
    let text = lines.join("\n");
    let n = text.chars().count();
    if n <= REQUEST_MAX_CHARS {
        return Some(text);
    }
    let head: String = text.chars().take(REQUEST_MAX_CHARS - 40).collect();
    Some(format!(
        "{} … ({} more characters)",
        head.trim_end(),
        n - (REQUEST_MAX_CHARS - 40)
    ))
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A tool call as one action line: `[action] Edit src/main.rs`. `name` is the tool's name;
/// `arg` what it acted on (a path, a command, a pattern, a URL, or the to-do list already
/// rendered); `None` when the call named nothing.
pub fn action_line(name: &str, arg: Option<&str>) -> String {
    let name = one_line(name);
    match arg.map(one_line).filter(|a| !a.is_empty()) {
        Some(a) if is_file_tool(&name) => cut(&format!("{ACTION}{name} {a}"), MAX_ACTION + 20),
        // A to-do list is kept whole (each item is cut instead).
        Some(a) if name == "TodoWrite" => format!(
            "{ACTION}{name}: {}",
            a.split("; ")
                .map(|i| cut(i, MAX_ACTION))
                .take(MAX_TODOS)
                .collect::<Vec<_>>()
                .join("; ")
        ),
        Some(a) => format!("{ACTION}{name}: {}", cut(&a, MAX_ACTION)),
        None => format!("{ACTION}{name}"),
    }
}

/// A failed tool call as one line: `[failed] Bash: cargo test → error: …`. `action` is the
/// call's action line (or its text after [`ACTION`]); `output` the tool's result.
pub fn failure_line(action: &str, output: &str) -> String {
    let what = action.strip_prefix(ACTION).unwrap_or(action);
    format!("{FAILED}{what}{ARROW}{}", error_line(output))
}

/// The line of a tool's output that says what went wrong: the first line naming an error or
/// a failure, else the first line with a letter in it; markup (`<tool_use_error>`) and box
/// drawing removed.
pub fn error_line(output: &str) -> String {
    let clean = |l: &str| -> String {
        let mut t = l.to_string();
        for tag in ["<tool_use_error>", "</tool_use_error>"] {
            t = t.replace(tag, "");
        }
        let t: String = t
            .chars()
            .filter(|c| !('\u{2500}'..='\u{257f}').contains(c))
            .collect();
        one_line(&t)
    };
    let lines: Vec<String> = output.lines().map(clean).collect();
    let said = lines.iter().find(|l| {
        let low = l.to_lowercase();
        [
            "error",
            "fail",
            "panic",
            "exception",
            "denied",
            "not found",
            "exit code",
        ]
        .iter()
        .any(|w| low.contains(w))
    });
    let any = lines.iter().find(|l| l.chars().any(char::is_alphabetic));
    cut(
        said.or(any).map_or("(no output)", String::as_str),
        MAX_ERROR,
    )
}

/// Tools whose argument is a file path.
pub fn is_file_tool(name: &str) -> bool {
    matches!(
        name,
        "Read" | "Edit" | "MultiEdit" | "Write" | "NotebookEdit" | "NotebookRead" | "apply_patch"
    )
}

/// The digest kind of a file tool's call: `Write` creates (unless the file was touched before,
/// which merging decides), the editing tools edit, the rest read.
fn file_kind(name: &str) -> Kind {
    match name {
        "Write" => Kind::Created,
        "Edit" | "MultiEdit" | "NotebookEdit" | "apply_patch" => Kind::Edited,
        _ => Kind::Read,
    }
}

/// Digest entries of `episodes` (id, role, content), in order: action and failure lines, and
/// (when any action is among them, or `coding` says the session already has some) the user's
/// requests verbatim.
pub fn entries<S: AsRef<str>>(
    episodes: impl IntoIterator<Item = (u64, Role, S)>,
    coding: bool,
) -> Vec<Entry> {
    entries_with(episodes, coding, true)
}

/// Whether an episode is an action of a coding session (a tool call, or one that failed):
/// a range's requests are part of its digest only when the range holds one, or the session
/// is a coding session.
pub fn is_action(role: Role, content: &str) -> bool {
    role == Role::Tool && (content.starts_with(ACTION) || content.starts_with(FAILED))
}

/// [`entries`], told whether requests can be kept at all (`requests`: false when the caller
/// knows the range holds no action and the session is no coding session), so a long chat's
/// user messages are not gathered only to be dropped.
pub fn entries_with<S: AsRef<str>>(
    episodes: impl IntoIterator<Item = (u64, Role, S)>,
    coding: bool,
    requests_kept: bool,
) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::new();
    let mut requests: Vec<Entry> = Vec::new();
    let mut any_action = false;
    let entry = |kind, text: String, episode| Entry {
        text: crate::ledger::bounded_text(text),
        kind,
        episode,
        count: 1,
    };
    for (id, role, content) in episodes {
        let content = content.as_ref();
        // What is gathered stays within the bound the row keeps (each identifier once, the
        // newest `MAX_PER_KIND` of each kind, see `bounded`), applied as it grows: a long
        // coding session's walk never holds all of its requests or commands.
        if requests.len() >= 2 * MAX_PER_KIND {
            requests = bounded(crate::ledger::deduplicated(std::mem::take(&mut requests)));
        }
        if out.len() >= 2 * MAX_PER_KIND * GATHERED_KINDS {
            out = bounded(crate::ledger::deduplicated(std::mem::take(&mut out)));
        }
        match role {
            Role::User => {
                let t = content.trim();
                // Claude Code's own notes in the user's turn are not requests.
                if requests_kept
                    && !t.starts_with("[Request interrupted")
                    && let Some(r) = request_text(t)
                {
                    requests.push(entry(Kind::Request, r, id));
                }
            }
            Role::Tool => {
                if let Some(rest) = content.strip_prefix(ACTION) {
                    any_action = true;
                    let rest = rest.trim();
                    if let Some((name, list)) = rest.split_once(": ")
                        && name == "TodoWrite"
                    {
                        for item in list.split("; ").filter(|i| !i.trim().is_empty()) {
                            out.push(entry(Kind::Todo, item.trim().to_string(), id));
                        }
                        continue;
                    }
                    let (name, arg) = match rest.split_once(' ') {
                        Some((n, a)) if is_file_tool(n) => (n, Some(a)),
                        _ => (rest.split(':').next().unwrap_or(rest), None),
                    };
                    match arg {
                        Some(path) => out.push(entry(file_kind(name), path.to_string(), id)),
                        None => out.push(entry(Kind::Ran, rest.to_string(), id)),
                    }
                } else if let Some(rest) = content.strip_prefix(FAILED) {
                    any_action = true;
                    out.push(entry(Kind::Failed, rest.trim().to_string(), id));
                }
            }
            _ => {}
        }
    }
    if any_action || coding {
        out.extend(requests);
    }
    out
}

/// `entries` within [`MAX_PER_KIND`] per kind (the newest kept), order kept.
pub fn bounded(entries: Vec<Entry>) -> Vec<Entry> {
    let mut per: BTreeMap<&'static str, Vec<(u64, usize)>> = BTreeMap::new();
    for (i, e) in entries.iter().enumerate() {
        if e.kind.is_digest() {
            per.entry(e.kind.as_str()).or_default().push((e.episode, i));
        }
    }
    let mut drop = vec![false; entries.len()];
    for (_, mut v) in per {
        if v.len() > MAX_PER_KIND {
            v.sort();
            for (_, i) in &v[..v.len() - MAX_PER_KIND] {
                drop[*i] = true;
            }
        }
    }
    entries
        .into_iter()
        .zip(drop)
        .filter(|(_, d)| !d)
        .map(|(e, _)| e)
        .collect()
}

/// Whether `entries` hold a coding session's digest (any action).
pub fn is_coding(entries: &[Entry]) -> bool {
    entries
        .iter()
        .any(|e| e.kind.is_digest() && e.kind != Kind::Request)
}

/// What the last line of a digest says when its budget left entries out.
pub const LEFT_OUT: &str = "more digest entries left out for the budget";

/// The heading of the digest block in contexts and offline summaries.
pub const HEADING: &str = "Session digest (from the transcript; #N = episode last touched):";

/// What the digest shows, by section, from the entries of a ledger.
struct View<'a> {
    requests: Vec<&'a Entry>,
    edited: Vec<&'a Entry>,
    read: Vec<&'a Entry>,
    ran: Vec<&'a Entry>,
    unresolved: Option<&'a Entry>,
    todos: Vec<&'a Entry>,
}

fn view(entries: &[Entry]) -> View<'_> {
    let of = |k: Kind| -> Vec<&Entry> {
        let mut v: Vec<&Entry> = entries.iter().filter(|e| e.kind == k).collect();
        v.sort_by_key(|e| e.episode);
        v
    };
    let requests = of(Kind::Request);
    let mut edited: Vec<&Entry> = entries
        .iter()
        .filter(|e| matches!(e.kind, Kind::Created | Kind::Edited))
        .collect();
    edited.sort_by_key(|e| std::cmp::Reverse(e.episode));
    let mut read = of(Kind::Read);
    read.reverse();
    let mut ran = of(Kind::Ran);
    ran.reverse();
    // The newest failure is unresolved unless the same action ran again after it.
    let unresolved = of(Kind::Failed).into_iter().next_back().filter(|f| {
        let action = f.text.split(ARROW).next().unwrap_or("");
        let again = ran
            .iter()
            .any(|r| r.episode > f.episode && same_action(&r.text, action));
        // A failed file tool is resolved by a later touch of the same file.
        let touched = action.split_once(' ').is_some_and(|(tool, path)| {
            is_file_tool(tool)
                && entries
                    .iter()
                    .any(|e| e.kind.group() == 1 && e.text == path && e.episode > f.episode)
        });
        !again && !touched
    });
    // The to-do list is the newest snapshot.
    let todos_all = of(Kind::Todo);
    let newest = todos_all.last().map_or(0, |e| e.episode);
    let todos = todos_all
        .into_iter()
        .filter(|e| e.episode == newest)
        .collect();
    View {
        requests,
        edited,
        read,
        ran,
        unresolved,
        todos,
    }
}

/// Whether a later run `later` retries the failed action `failed`: the same tool, and at least
/// half of the words of the two commands in common (`cargo test` then `cargo test -p x`, or a
/// loop of 20 runs then one of 50; not `cargo test` then `cargo build` or `ls`).
fn same_action(later: &str, failed: &str) -> bool {
    if later == failed {
        return true;
    }
    let split = |s: &str| -> Option<(String, std::collections::BTreeSet<String>)> {
        let (tool, rest) = s.split_once(": ")?;
        let words = rest
            .split(|c: char| c.is_whitespace() || c == ';')
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect();
        Some((tool.to_string(), words))
    };
    let (Some((t1, w1)), Some((t2, w2))) = (split(later), split(failed)) else {
        return false;
    };
    if t1 != t2 || w1.is_empty() || w2.is_empty() {
        return false;
    }
    let common = w1.intersection(&w2).count();
    let union = w1.union(&w2).count();
    common * 2 >= union
}

/// The folder every one of `paths` lies under, ending in `/`, when there are at least two
/// paths and it is at least two folders deep (`/home/me/project/`); `None` otherwise.
fn common_dir<'a>(paths: impl Iterator<Item = &'a str>) -> Option<String> {
    let mut n = 0usize;
    let mut common: Option<Vec<&str>> = None;
    for p in paths {
        n += 1;
        let mut parts: Vec<&str> = p.split('/').collect();
        parts.pop(); // the file's own name
        common = Some(match common {
            None => parts,
            Some(c) => c
                .iter()
                .zip(&parts)
                .take_while(|(a, b)| a == b)
                .map(|(a, _)| *a)
                .collect(),
        });
    }
    let c = common?;
    let depth = c.iter().filter(|x| !x.is_empty()).count();
    (n >= 2 && depth >= 2).then(|| format!("{}/", c.join("/")))
}

/// The outcome of the newest run of `r`: its failure, when the newest failure of that action
/// came after it.
fn outcome<'a>(r: &Entry, entries: &'a [Entry]) -> Option<&'a str> {
    entries
        .iter()
        .filter(|e| e.kind == Kind::Failed && e.episode > r.episode)
        .filter(|e| e.text.split(ARROW).next() == Some(r.text.as_str()))
        .min_by_key(|e| e.episode)
        .and_then(|e| e.text.split_once(ARROW).map(|(_, err)| err))
}

/// The newest request among `entries`.
pub fn latest_request(entries: &[Entry]) -> Option<&Entry> {
    entries
        .iter()
        .filter(|e| e.kind == Kind::Request)
        .max_by_key(|e| e.episode)
}

/// The tokens a digest of `entries` needs to show its latest request whole (0 without a
/// coding session): the room a context keeps for it at least.
pub fn latest_cost(entries: &[Entry]) -> u32 {
    if !is_coding(entries) {
        return 0;
    }
    let latest = latest_request(entries).map_or(0, |r| {
        estimate_tokens(&format!("Latest request (#{}): {}", r.episode, r.text)) + 2
    });
    estimate_tokens(HEADING) + 2 + latest
}

/// The digest of `entries` as readable sections within `budget` tokens (empty when the
/// entries hold no coding session). What fits first: the latest request verbatim, the last
/// unresolved error, every edited or created file, the open to-dos (these may take the whole
/// budget); then, within a third of what they leave, the first request, earlier requests
/// (newest first), the commands (newest first, with their outcome), the files read. What the
/// budget leaves out is counted on the last line.
pub fn render(entries: &[Entry], budget: u32) -> String {
    if !is_coding(entries) {
        return String::new();
    }
    render_under(HEADING, entries, budget, Part::Whole).0
}

/// The digest as of the chain's last fold, as the stable head shows it beside a per-call note
/// that holds what came after ([`render_since`]): its newest request is the latest as of the
/// summary (a lone one is the first). With the episode of that request when the text shows it.
pub fn render_folded(entries: &[Entry], budget: u32) -> (String, Option<u64>) {
    if !is_coding(entries) {
        return (String::new(), None);
    }
    render_under(HEADING, entries, budget, Part::Folded)
}

/// Which part of a session a digest renders.
#[derive(Clone, Copy, PartialEq)]
enum Part {
    Whole,
    Folded,
    Since,
}

/// The heading of the digest of what happened after the summary a context's head shows.
pub const SINCE_HEADING: &str = "Session digest since the summary above (#N = episode):";

/// The digest of `entries`, those added or touched again after the summary's digest (which the
/// context's head shows), as [`render`] lays it out (empty when there are none): its first
/// request is not the session's, so none is called that.
pub fn render_since(entries: &[Entry], budget: u32) -> String {
    if !entries.iter().any(|e| e.kind.is_digest()) {
        return String::new();
    }
    render_under(SINCE_HEADING, entries, budget, Part::Since).0
}

/// The digest's text, and the episode of its newest request when the text shows it.
fn render_under(
    heading: &str,
    entries: &[Entry],
    budget: u32,
    part: Part,
) -> (String, Option<u64>) {
    let v = view(entries);
    let latest_label = match (part, v.requests.len()) {
        (Part::Folded, 1) => "First request",
        (Part::Folded, _) => "Latest request as of the summary",
        _ => "Latest request",
    };
    let mut used = estimate_tokens(heading) + 2;
    let mut left_out = 0usize;
    // The essential sections (the latest request, the open error, the first request, the
    // edited files, the to-dos) may take the whole budget; the rest at most a third of what they leave, so a
    // context keeps room for the summary prose.
    let mut cap = budget;
    let fits = |text: &str, used: &mut u32, cap: u32| -> bool {
        let c = estimate_tokens(text) + 2;
        if *used + c <= cap {
            *used += c;
            true
        } else {
            false
        }
    };
    // Sections in display order, filled in priority order.
    let mut latest = None;
    let mut first = None;
    let mut earlier: Vec<String> = Vec::new();
    let mut unresolved = None;
    let mut files: Vec<String> = Vec::new();
    let mut todos: Vec<String> = Vec::new();
    let mut commands: Vec<String> = Vec::new();
    let mut reads: Vec<String> = Vec::new();
    if let Some(r) = v.requests.last() {
        let t = format!("{latest_label} (#{}): {}", r.episode, r.text);
        if fits(&t, &mut used, cap) {
            latest = Some(t);
        } else {
            // Too long for the budget whole: its start, within at most 60% of the budget,
            // says that it was cut.
            let room = (budget.saturating_sub(used) * 3 / 5).saturating_sub(16);
            let mut chars = (room as usize) * 3;
            while chars > 40 {
                let head: String = r.text.chars().take(chars).collect();
                let t = format!(
                    "{latest_label} (#{}, first {} of {} characters): {head} …",
                    r.episode,
                    head.chars().count(),
                    r.text.chars().count()
                );
                if fits(&t, &mut used, cap) {
                    latest = Some(t);
                    break;
                }
                chars = chars * 4 / 5;
            }
            if latest.is_none() {
                left_out += 1;
            }
        }
    }
    // The sections after the latest request leave room for the line that says what was left
    // out.
    cap = budget.saturating_sub(estimate_tokens(&format!("(99 {LEFT_OUT})")) + 1);
    if let Some(f) = v.unresolved {
        let t = format!("Unresolved error (#{}): {}", f.episode, f.text);
        if fits(&t, &mut used, cap) {
            unresolved = Some(t);
        } else {
            left_out += 1;
        }
    }
    // The first request (where a session's standing rules are said) before the files.
    if part != Part::Since && v.requests.len() > 1 {
        let r = v.requests[0];
        let t = format!("First request (#{}): {}", r.episode, r.text);
        if fits(&t, &mut used, cap) {
            first = Some(t);
        } else {
            left_out += 1;
        }
    }
    // Paths under one folder are shown relative to it, the folder once.
    let root = common_dir(v.edited.iter().chain(&v.read).map(|e| e.text.as_str()));
    let shown = |p: &str| -> String {
        match &root {
            Some(r) => p.strip_prefix(r.as_str()).unwrap_or(p).to_string(),
            None => p.to_string(),
        }
    };
    let under = root
        .as_ref()
        .map(|r| format!(" (under {r})"))
        .unwrap_or_default();
    used += estimate_tokens(&under) * 2;
    for e in &v.edited {
        let new = if e.kind == Kind::Created { ", new" } else { "" };
        let t = format!("{} (#{}{new})", shown(&e.text), e.episode);
        if fits(&t, &mut used, cap) {
            files.push(t);
        } else {
            left_out += 1;
        }
    }
    for e in &v.todos {
        if fits(&e.text, &mut used, cap) {
            todos.push(e.text.clone());
        } else {
            left_out += 1;
        }
    }
    cap = cap.min(used + budget.saturating_sub(used) / 3);
    let from = usize::from(part != Part::Since);
    if v.requests.len() > from + 1 {
        for r in v.requests[from..v.requests.len() - 1].iter().rev() {
            let t = format!("(#{}) {}", r.episode, r.text);
            if fits(&t, &mut used, cap) {
                earlier.push(t);
            } else {
                left_out += 1;
            }
        }
        earlier.reverse();
    }
    for r in &v.ran {
        let t = match outcome(r, entries) {
            Some(err) => format!("{} (#{}) → failed: {err}", r.text, r.episode),
            None => format!("{} (#{})", r.text, r.episode),
        };
        if fits(&t, &mut used, cap) {
            commands.push(t);
        } else {
            left_out += 1;
        }
    }
    for e in &v.read {
        let t = format!("{} (#{})", shown(&e.text), e.episode);
        if fits(&t, &mut used, cap) {
            reads.push(t);
        } else {
            left_out += 1;
        }
    }
    let shown = latest
        .is_some()
        .then(|| v.requests.last().map(|r| r.episode))
        .flatten();
    let mut out = vec![heading.to_string()];
    out.extend(first);
    if !earlier.is_empty() {
        out.push(format!("Earlier requests: {}", earlier.join(" | ")));
    }
    out.extend(latest);
    out.extend(unresolved);
    if !files.is_empty() {
        out.push(format!("Files edited{under}: {}", files.join(" · ")));
    }
    if !todos.is_empty() {
        out.push(format!("To-do list: {}", todos.join(" · ")));
    }
    if !commands.is_empty() {
        out.push(format!("Commands (newest first): {}", commands.join(" · ")));
    }
    if !reads.is_empty() {
        out.push(format!(
            "Files read (newest first){under}: {}",
            reads.join(" · ")
        ));
    }
    // What was left out is said where the budget has room for the line.
    let said = format!("({left_out} {LEFT_OUT})");
    if left_out > 0 && used + estimate_tokens(&said) < budget {
        out.push(said);
    }
    (out.join("\n"), shown)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> Vec<(u64, Role, String)> {
        vec![
            (1, Role::User, "Fix the flaky checkout test, please.".into()),
            (2, Role::Assistant, "Looking.".into()),
            (3, Role::Tool, action_line("Read", Some("src/checkout.rs"))),
            (
                4,
                Role::Tool,
                action_line("Bash", Some("cargo test checkout")),
            ),
            (
                5,
                Role::Tool,
                failure_line(
                    &action_line("Bash", Some("cargo test checkout")),
                    "running 3 tests\nerror[E0432]: unresolved import `foo`\n",
                ),
            ),
            (6, Role::Tool, action_line("Edit", Some("src/checkout.rs"))),
            (7, Role::Tool, action_line("Write", Some("tests/retry.rs"))),
            (
                8,
                Role::Tool,
                action_line(
                    "TodoWrite",
                    Some("[completed] Find the cause; [in_progress] Add a retry test"),
                ),
            ),
            (9, Role::User, "Also keep the timeout at 30 s.".into()),
        ]
    }

    fn digest_of(eps: &[(u64, Role, String)]) -> Vec<Entry> {
        let mut l = crate::ledger::Ledger::default();
        for e in entries(eps.iter().map(|(i, r, c)| (*i, *r, c.as_str())), false) {
            crate::ledger::add(&mut l.entries, e.kind, e.text, e.episode, e.count);
        }
        l.entries
    }

    #[test]
    fn a_long_walk_holds_no_more_than_the_row_keeps_and_keeps_the_same_entries() {
        // 9,000 user turns (every third the same "yes") and a command per turn.
        let mut eps: Vec<(u64, Role, String)> = Vec::new();
        for i in 0..9_000u64 {
            let text = if i % 3 == 0 {
                "yes".to_string()
            } else {
                format!("request {i}")
            };
            eps.push((2 * i + 1, Role::User, text));
            eps.push((
                2 * i + 2,
                Role::Tool,
                format!("{ACTION}Bash: make step{}", i % 2_500),
            ));
        }
        let got = entries_with(eps.iter().map(|(i, r, t)| (*i, *r, t.as_str())), true, true);
        let requests: Vec<&Entry> = got.iter().filter(|e| e.kind == Kind::Request).collect();
        // Each identifier once, then the newest per kind: what the row's ledger keeps.
        let mut whole = Vec::new();
        // (A one-word "yes" is an answer, not a request: it takes no line.)
        for (id, _, t) in eps.iter().filter(|e| e.1 == Role::User) {
            if let Some(t) = request_text(t) {
                crate::ledger::add(&mut whole, Kind::Request, t, *id, 1);
            }
        }
        let want: Vec<u64> = bounded(whole).iter().map(|e| e.episode).collect();
        let mut have: Vec<u64> = bounded(crate::ledger::deduplicated(
            requests.iter().map(|e| (*e).clone()).collect(),
        ))
        .iter()
        .map(|e| e.episode)
        .collect();
        have.sort_unstable();
        let mut want = want;
        want.sort_unstable();
        assert_eq!(have, want);
        // Bounded as it went: never the 9,000 requests at once.
        assert!(requests.len() < 2 * MAX_PER_KIND, "{}", requests.len());
        assert!(got.len() < 2 * MAX_PER_KIND * (GATHERED_KINDS + 1));
    }

    #[test]
    fn lines_are_one_line_and_bounded() {
        assert_eq!(
            action_line("Edit", Some("src/a.rs")),
            "[action] Edit src/a.rs"
        );
        assert_eq!(
            action_line("Bash", Some("cargo test\n  --workspace")),
            "[action] Bash: cargo test --workspace"
        );
        assert_eq!(action_line("WebSearch", None), "[action] WebSearch");
        assert!(action_line("Bash", Some(&"x".repeat(1000))).chars().count() < 300);
        assert_eq!(
            error_line("╭──╮\n│ lefthook │\nerror: hook failed\n"),
            "error: hook failed"
        );
        assert_eq!(
            error_line("<tool_use_error>File has not been read yet.</tool_use_error>"),
            "File has not been read yet."
        );
    }

    #[test]
    fn the_digest_has_every_section_and_the_failure_until_it_is_fixed() {
        let mut eps = session();
        let d = render(&digest_of(&eps), 10_000);
        assert!(d.starts_with(HEADING), "{d}");
        assert!(
            d.contains("First request (#1): Fix the flaky checkout test, please."),
            "{d}"
        );
        assert!(
            d.contains("Latest request (#9): Also keep the timeout at 30 s."),
            "{d}"
        );
        assert!(
            d.contains("Unresolved error (#5): Bash: cargo test checkout → error[E0432]"),
            "{d}"
        );
        assert!(
            d.contains("Files edited: tests/retry.rs (#7, new) · src/checkout.rs (#6)"),
            "{d}"
        );
        assert!(
            d.contains("To-do list: [completed] Find the cause · [in_progress] Add a retry test"),
            "{d}"
        );
        assert!(
            d.contains("Bash: cargo test checkout (#4) → failed: error[E0432]"),
            "{d}"
        );
        // Read, then edited: one entry, "edited".
        assert!(!d.contains("Files read"), "{d}");
        // The same command run again fixes it.
        eps.push((
            10,
            Role::Tool,
            action_line("Bash", Some("cargo test checkout")),
        ));
        let d = render(&digest_of(&eps), 10_000);
        assert!(!d.contains("Unresolved error"), "{d}");
        assert!(d.contains("Bash: cargo test checkout (#10)"), "{d}");
    }

    #[test]
    fn a_retry_resolves_a_failure_but_another_command_does_not() {
        assert!(same_action("Bash: cargo test -p x", "Bash: cargo test"));
        assert!(same_action(
            "Bash: for i in $(seq 50); do npm test; done",
            "Bash: for i in $(seq 20); do npm test; done"
        ));
        assert!(!same_action("Bash: cargo build", "Bash: cargo test"));
        assert!(!same_action("Bash: ls", "Bash: cargo test"));
        assert!(!same_action("Grep: cargo test", "Bash: cargo test"));
    }

    #[test]
    fn a_small_budget_keeps_the_latest_request_and_edited_files_first() {
        let d = render(&digest_of(&session()), 60);
        assert!(d.contains("Latest request (#9)"), "{d}");
        assert!(
            d.contains("more digest entries left out for the budget"),
            "{d}"
        );
        assert!(!d.contains("First request"), "{d}");
    }

    #[test]
    fn requests_are_trimmed_one_word_answers_left_out_and_a_pasted_log_shown_as_its_start() {
        assert_eq!(request_text("A"), None);
        assert_eq!(request_text("  ok \n\n"), None);
        assert_eq!(
            request_text("  fix   the\tbuild   \n\n\n\nplease      "),
            Some("fix the build\n\nplease".into())
        );
        let log: String = (0..40)
            .map(|i| format!("{i:>4}   ERROR   worker-{i}   {}\n", " ".repeat(60)))
            .collect();
        let r = request_text(&format!("why does CI fail?\n{log}")).unwrap();
        assert_eq!(r.lines().count(), REQUEST_HEAD_LINES + 1, "{r}");
        assert!(r.starts_with("why does CI fail?\n0 ERROR worker-0"), "{r}");
        assert!(r.ends_with("… (33 more lines)"), "{r}");
        let long = "word ".repeat(600);
        let r = request_text(&long).unwrap();
        assert!(
            r.chars().count() <= REQUEST_MAX_CHARS,
            "{}",
            r.chars().count()
        );
        assert!(r.ends_with("more characters)"), "{r}");
        // As the digest gathers them: the one-word turn takes no line.
        let e = digest_of(&[
            (1, Role::User, "Add a --json flag to status".into()),
            (2, Role::Tool, format!("{ACTION}Edit src/status.rs")),
            (3, Role::User, "ok".into()),
        ]);
        let requests: Vec<_> = e.iter().filter(|x| x.kind == Kind::Request).collect();
        assert_eq!(requests.len(), 1, "{e:?}");
    }

    #[test]
    fn a_chat_has_no_digest() {
        let eps = [
            (1, Role::User, "hi".to_string()),
            (2, Role::Assistant, "hello".into()),
        ];
        assert!(digest_of(&eps).is_empty());
        assert_eq!(render(&digest_of(&eps), 1000), "");
    }
}
