//! The published WIT is versioned as hosts need it. `wit/released/abridge@X.wit` is the WIT
//! of each version as it was published; `wit/abridge.wit` must declare the newest of them and
//! may differ from it only in ways a host written from it never notices (documentation, new
//! exports it does not call, imports it no longer needs to supply). A change that would make
//! such a host fail at instantiation — a new import, an import or export whose signature
//! changed, a record with a field more, an export gone — needs a new version (the minor
//! number while the major is 0). Each step between released versions is classified the same
//! way, and the report is written to `target/wit-changes.txt` (CI prints it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use wit_parser::{Resolve, Type, TypeDefKind, WorldItem};

/// What a host written from the older WIT meets in the newer one.
#[derive(Debug, Default)]
struct Changes {
    /// Changes that make such a host fail at instantiation.
    breaking: Vec<String>,
    /// Changes it never notices.
    compatible: Vec<String>,
}

/// One parsed WIT: its version and its `engine` world's imported and exported functions
/// (`interface.function` → signature with every type written out) and named types
/// (`interface.type` → structure).
struct Parsed {
    version: (u64, u64, u64),
    imports: BTreeMap<String, String>,
    exports: BTreeMap<String, String>,
    types: BTreeMap<String, String>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A type with every named type written out, so two WITs compare by structure.
fn shape(r: &Resolve, t: &Type) -> String {
    match t {
        Type::Bool => "bool".into(),
        Type::U8 => "u8".into(),
        Type::U16 => "u16".into(),
        Type::U32 => "u32".into(),
        Type::U64 => "u64".into(),
        Type::S8 => "s8".into(),
        Type::S16 => "s16".into(),
        Type::S32 => "s32".into(),
        Type::S64 => "s64".into(),
        Type::F32 => "f32".into(),
        Type::F64 => "f64".into(),
        Type::Char => "char".into(),
        Type::String => "string".into(),
        Type::ErrorContext => "error-context".into(),
        Type::Id(id) => kind_shape(r, &r.types[*id].kind, r.types[*id].name.as_deref()),
    }
}

fn opt_shape(r: &Resolve, t: &Option<Type>) -> String {
    t.as_ref().map_or("_".into(), |t| shape(r, t))
}

fn kind_shape(r: &Resolve, k: &TypeDefKind, name: Option<&str>) -> String {
    match k {
        TypeDefKind::Record(x) => format!(
            "record {{{}}}",
            x.fields
                .iter()
                .map(|f| format!("{}: {}", f.name, shape(r, &f.ty)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        TypeDefKind::Variant(x) => format!(
            "variant {{{}}}",
            x.cases
                .iter()
                .map(|c| format!("{}({})", c.name, opt_shape(r, &c.ty)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        TypeDefKind::Enum(x) => format!(
            "enum {{{}}}",
            x.cases
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        TypeDefKind::Flags(x) => format!(
            "flags {{{}}}",
            x.flags
                .iter()
                .map(|f| f.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        TypeDefKind::Tuple(x) => format!(
            "tuple<{}>",
            x.types
                .iter()
                .map(|t| shape(r, t))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        TypeDefKind::Option(t) => format!("option<{}>", shape(r, t)),
        TypeDefKind::Result(x) => {
            format!("result<{}, {}>", opt_shape(r, &x.ok), opt_shape(r, &x.err))
        }
        TypeDefKind::List(t) => format!("list<{}>", shape(r, t)),
        TypeDefKind::Map(k, v) => format!("map<{}, {}>", shape(r, k), shape(r, v)),
        TypeDefKind::FixedLengthList(t, n) => format!("list<{}, {n}>", shape(r, t)),
        TypeDefKind::Future(t) => format!("future<{}>", opt_shape(r, t)),
        TypeDefKind::Stream(t) => format!("stream<{}>", opt_shape(r, t)),
        TypeDefKind::Type(t) => shape(r, t),
        TypeDefKind::Resource => format!("resource {}", name.unwrap_or("?")),
        TypeDefKind::Handle(h) => format!("handle {h:?}"),
        TypeDefKind::Unknown => "unknown".into(),
    }
}

/// Parse `abridge.wit` text (with the WASI packages of `wit/deps`, which the `component`
/// world names).
fn parse(text: &str, what: &str) -> Parsed {
    let mut r = Resolve::default();
    for dep in ["wasi-io.wit", "wasi-cli.wit"] {
        let p = root().join("wit/deps").join(dep);
        let dep_text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
        r.push_source(dep, &dep_text)
            .unwrap_or_else(|e| panic!("{dep}: {e:#}"));
    }
    let pkg = r
        .push_source("abridge.wit", text)
        .unwrap_or_else(|e| panic!("{what} does not parse: {e:#}"));
    let v = r.packages[pkg]
        .name
        .version
        .clone()
        .unwrap_or_else(|| panic!("{what} declares no version (package abridge:engine@X.Y.Z)"));
    let world = r
        .select_world(&[pkg], Some("engine"))
        .unwrap_or_else(|e| panic!("{what} has no `engine` world: {e:#}"));
    let mut parsed = Parsed {
        version: (v.major, v.minor, v.patch),
        imports: BTreeMap::new(),
        exports: BTreeMap::new(),
        types: BTreeMap::new(),
    };
    let w = &r.worlds[world];
    for (items, out) in [
        (&w.imports, &mut parsed.imports),
        (&w.exports, &mut parsed.exports),
    ] {
        for (key, item) in items {
            let WorldItem::Interface { id, .. } = item else {
                continue;
            };
            let iface = &r.interfaces[*id];
            let name = r.name_world_key(key);
            let short = iface.name.clone().unwrap_or(name);
            for (fname, f) in &iface.functions {
                let params = f
                    .params
                    .iter()
                    .map(|p| shape(&r, &p.ty))
                    .collect::<Vec<_>>()
                    .join(", ");
                out.insert(
                    format!("{short}.{fname}"),
                    format!("({params}) -> {}", opt_shape(&r, &f.result)),
                );
            }
            for (tname, tid) in &iface.types {
                // A type `use`d from another interface is named where it is defined.
                if matches!(r.types[*tid].kind, TypeDefKind::Type(Type::Id(_))) {
                    continue;
                }
                parsed.types.insert(
                    format!("{short}.{tname}"),
                    kind_shape(&r, &r.types[*tid].kind, Some(tname)),
                );
            }
        }
    }
    parsed
}

/// The parts of a record, variant, enum or flags shape (`name: type` or `case(type)`).
fn parts(shape: &str) -> Vec<String> {
    let Some(inner) = shape
        .split_once('{')
        .and_then(|(_, rest)| rest.strip_suffix('}'))
    else {
        return Vec::new();
    };
    // Split at the top level only.
    let (mut out, mut depth, mut cur) = (Vec::new(), 0i32, String::new());
    for c in inner.chars() {
        match c {
            '<' | '{' | '(' => depth += 1,
            '>' | '}' | ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// A named type's change in words: the fields or cases added and removed.
fn type_change(name: &str, old: &str, new: &str) -> String {
    let key = |p: &String| p.split([':', '(']).next().unwrap_or("").trim().to_string();
    let (o, n) = (parts(old), parts(new));
    let okeys: Vec<String> = o.iter().map(key).collect();
    let nkeys: Vec<String> = n.iter().map(key).collect();
    let added: Vec<&String> = nkeys.iter().filter(|k| !okeys.contains(k)).collect();
    let removed: Vec<&String> = okeys.iter().filter(|k| !nkeys.contains(k)).collect();
    let kind = new.split_whitespace().next().unwrap_or("type");
    let mut what = Vec::new();
    if !added.is_empty() {
        what.push(format!(
            "{} added",
            added
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !removed.is_empty() {
        what.push(format!(
            "{} removed",
            removed
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if what.is_empty() {
        what.push("its parts' types changed".into());
    }
    format!("{kind} {name}: {}", what.join("; "))
}

/// What a host written from `old` meets in `new`.
fn classify(old: &Parsed, new: &Parsed) -> Changes {
    let mut c = Changes::default();
    for (f, sig) in &new.imports {
        match old.imports.get(f) {
            None => c.breaking.push(format!(
                "import {f} is new: a host written from the older WIT does not supply it"
            )),
            Some(o) if o != sig => c.breaking.push(format!("import {f} changed its signature")),
            _ => {}
        }
    }
    for f in old.imports.keys().filter(|f| !new.imports.contains_key(*f)) {
        c.compatible.push(format!(
            "import {f} is no longer needed (a host may still supply it)"
        ));
    }
    for (f, sig) in &old.exports {
        match new.exports.get(f) {
            None => c.breaking.push(format!(
                "export {f} is gone: a host written from the older WIT looks it up"
            )),
            Some(n) if n != sig => c.breaking.push(format!("export {f} changed its signature")),
            _ => {}
        }
    }
    for f in new.exports.keys().filter(|f| !old.exports.contains_key(*f)) {
        c.compatible.push(format!(
            "export {f} is new (a host written from the older WIT never calls it)"
        ));
    }
    // The types behind the changed signatures, named.
    if !c.breaking.is_empty() {
        for (t, shape) in &new.types {
            if let Some(o) = old.types.get(t)
                && o != shape
            {
                c.breaking.push(type_change(t, o, shape));
            }
        }
    }
    c
}

fn version_text(v: (u64, u64, u64)) -> String {
    format!("{}.{}.{}", v.0, v.1, v.2)
}

/// Whether `new` is a version that may break hosts of `old` (the major, or the minor while
/// the major is 0, is higher).
fn breaking_bump(old: (u64, u64, u64), new: (u64, u64, u64)) -> bool {
    if old.0 == 0 && new.0 == 0 {
        new.1 > old.1
    } else {
        new.0 > old.0
    }
}

fn report(out: &mut String, title: &str, c: &Changes) {
    out.push_str(title);
    if c.breaking.is_empty() && c.compatible.is_empty() {
        out.push_str(": no change a host sees\n");
        return;
    }
    out.push_str(if c.breaking.is_empty() {
        ": compatible (a host written from the older WIT still instantiates)\n"
    } else {
        ": breaking (a host written from the older WIT fails at instantiation)\n"
    });
    for b in &c.breaking {
        out.push_str(&format!("  breaking: {b}\n"));
    }
    for x in &c.compatible {
        out.push_str(&format!("  compatible: {x}\n"));
    }
}

#[test]
fn the_wit_is_versioned_as_hosts_need_it() {
    let dir = root().join("wit/released");
    let mut released: Vec<(Parsed, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir:?}: {e}"))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "wit"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            let text = std::fs::read_to_string(&p).expect("a released WIT");
            let parsed = parse(&text, &name);
            assert_eq!(
                name,
                format!("abridge@{}.wit", version_text(parsed.version)),
                "a released WIT is named after the version it declares"
            );
            (parsed, name)
        })
        .collect();
    released.sort_by_key(|(p, _)| p.version);
    assert!(!released.is_empty(), "no released WIT in {dir:?}");

    let mut out = String::new();
    for pair in released.windows(2) {
        let ((old, oname), (new, nname)) = (&pair[0], &pair[1]);
        let c = classify(old, new);
        report(
            &mut out,
            &format!(
                "{} -> {} ({oname} -> {nname})",
                version_text(old.version),
                version_text(new.version)
            ),
            &c,
        );
        assert!(
            c.breaking.is_empty() || breaking_bump(old.version, new.version),
            "{nname} breaks hosts written from {oname} without a breaking version (the major, or the minor while the major is 0):\n{out}"
        );
    }

    let text = std::fs::read_to_string(root().join("wit/abridge.wit")).expect("wit/abridge.wit");
    let current = parse(&text, "wit/abridge.wit");
    let (newest, newest_name) = released.last().expect("one at least");
    assert_eq!(
        current.version,
        newest.version,
        "wit/abridge.wit declares abridge:engine@{} but the newest released WIT is {newest_name}: when a version is published, copy wit/abridge.wit to wit/released/abridge@{}.wit",
        version_text(current.version),
        version_text(current.version)
    );
    let c = classify(newest, &current);
    report(
        &mut out,
        &format!(
            "wit/abridge.wit against {newest_name} (the same version, {})",
            version_text(current.version)
        ),
        &c,
    );
    let _ = std::fs::write(root().join("target/wit-changes.txt"), &out);
    println!("{out}");
    assert!(
        c.breaking.is_empty(),
        "wit/abridge.wit breaks hosts written from the published {}: give it a new version (package abridge:engine@0.{}.0 while the major is 0), copy it to wit/released/ under that version, and say what changed in docs/component.md\n{out}",
        version_text(current.version),
        current.version.1 + 1
    );
}
