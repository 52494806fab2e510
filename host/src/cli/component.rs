//! `abridge component`: write the exact component this binary embeds and its WIT package, for
//! a host author who runs the engine somewhere else (jco, another component-model runtime).

use std::path::PathBuf;

use anyhow::{Context, anyhow};
use clap::Args;

use super::{Exit, Failure};
use abridge_app::engine::{EMBEDDED_COMPONENT, WIT_FILES};

#[derive(Args, Debug)]
pub struct ComponentArgs {
    /// The directory to write `abridge_guest.wasm` and its WIT (`wit/abridge.wit`, and the
    /// WASI interfaces it imports in `wit/deps/`) into (created if missing; existing files of
    /// those names are replaced)
    #[arg(long)]
    out: PathBuf,
    /// Print what was written as one JSON object
    #[arg(long)]
    json: bool,
}

pub async fn component_cmd(a: ComponentArgs) -> Result<(), Failure> {
    let io = |e: anyhow::Error| Failure::new(Exit::Input, e);
    let wasm = a.out.join("abridge_guest.wasm");
    let wit = a.out.join("wit").join("abridge.wit");
    std::fs::create_dir_all(a.out.join("wit").join("deps"))
        .with_context(|| format!("cannot create {}; pass a writable --out", a.out.display()))
        .map_err(io)?;
    std::fs::write(&wasm, EMBEDDED_COMPONENT)
        .with_context(|| format!("cannot write {}", wasm.display()))
        .map_err(io)?;
    for (name, text) in WIT_FILES {
        let path = a.out.join("wit").join(name);
        std::fs::write(&path, text)
            .with_context(|| format!("cannot write {}", path.display()))
            .map_err(io)?;
    }
    let rt = super::commands::runtime()?;
    let imports = rt.import_names();
    let exports = abridge_app::engine::export_names(&rt);
    let sha = abridge_app::engine::embedded_sha256();
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "wasm": wasm, "wit": wit, "bytes": EMBEDDED_COMPONENT.len(), "sha256": sha,
                "imports": imports, "exports": exports,
            })
        );
    } else {
        println!(
            "{} ({} bytes, sha256 {sha})",
            wasm.display(),
            EMBEDDED_COMPONENT.len()
        );
        println!("{}", wit.display());
        println!("imports (a host implements these):");
        for i in &imports {
            println!("  {i}");
        }
        println!("exports (a host calls these):");
        for e in &exports {
            println!("  {e}");
        }
    }
    if imports.is_empty() {
        return Err(Failure::new(
            Exit::Internal,
            anyhow!("the embedded component lists no imports; the build is broken"),
        ));
    }
    Ok(())
}
