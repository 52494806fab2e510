//! Builds the guest component for wasm32-wasip2 so `cargo build`, `cargo run` and
//! `cargo test` need no manual step, and hands its path to the crate (it is embedded with
//! `include_bytes!`). Set `ABRIDGE_GUEST_WASM=/path/to/guest.wasm` to embed a prebuilt one.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest
        .parent()
        .and_then(Path::parent)
        .expect("host/engine/ sits two levels below the workspace root")
        .to_path_buf();
    for p in [
        "guest/src",
        "guest/Cargo.toml",
        "wit",
        "Cargo.lock",
        "rust-toolchain.toml",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    println!("cargo:rerun-if-env-changed=ABRIDGE_GUEST_WASM");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dest = out.join("abridge_guest.wasm");

    if let Ok(prebuilt) = env::var("ABRIDGE_GUEST_WASM") {
        copy(Path::new(&prebuilt), &dest);
        return;
    }

    // A separate target directory: the outer build holds the lock on the main one.
    let target_dir = match env::var_os("CARGO_TARGET_DIR") {
        Some(d) => PathBuf::from(d).join("guest"),
        None => root.join("target").join("guest"),
    };
    ensure_wasm_target();
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args([
            "build",
            "-p",
            "abridge-guest",
            "--target",
            "wasm32-wasip2",
            "--profile",
            "guest-release",
        ])
        .arg("--target-dir")
        .arg(&target_dir);
    // Settings meant for the host build (clippy's wrapper, host RUSTFLAGS, coverage
    // instrumentation) must not leak into the guest build.
    for var in [
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("could not run cargo to build the guest: {e}"));
    if !status.success() {
        panic!(
            "building the guest component failed (see the errors above); the \
             {TARGET} target is present, so this is an error in the guest's own code"
        );
    }
    copy(
        &target_dir.join("wasm32-wasip2/guest-release/abridge_guest.wasm"),
        &dest,
    );
}

const TARGET: &str = "wasm32-wasip2";

/// rustup installs a toolchain file's `targets` only when it installs the toolchain itself,
/// so a machine that already had 1.95.0 lacks `wasm32-wasip2`. Add it here (announced), or
/// stop with the exact command to run.
fn ensure_wasm_target() {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let has_target = |root: &Path| root.join("lib/rustlib").join(TARGET).join("lib").is_dir();
    if sysroot.as_deref().is_some_and(has_target) {
        return;
    }
    // The toolchain cargo is running under (rustup's proxy sets RUSTUP_TOOLCHAIN).
    let toolchain = env::var("RUSTUP_TOOLCHAIN").ok();
    let manual = match &toolchain {
        Some(t) => format!("rustup target add {TARGET} --toolchain {t}"),
        None => format!("rustup target add {TARGET}"),
    };
    let mut add = Command::new("rustup");
    add.args(["target", "add", TARGET]);
    if let Some(t) = &toolchain {
        add.args(["--toolchain", t]);
    }
    println!(
        "cargo:warning=the {TARGET} target is missing from this toolchain; running `{manual}` \
         (the guest component is built for it)"
    );
    match add.status() {
        Ok(s) if s.success() && sysroot.as_deref().is_none_or(has_target) => {}
        Ok(s) => panic!(
            "`{manual}` failed ({s}). The guest component needs the {TARGET} target: run \
             `{manual}` yourself (it needs network access to the Rust distribution server), \
             or build the guest elsewhere and set ABRIDGE_GUEST_WASM=/path/to/abridge_guest.wasm"
        ),
        Err(e) => panic!(
            "the {TARGET} target is missing and rustup could not be run ({e}). Install the \
             target for this Rust toolchain (with rustup: `{manual}`; with a distribution's \
             Rust: its rust-std package for {TARGET}), or set \
             ABRIDGE_GUEST_WASM=/path/to/abridge_guest.wasm to embed a prebuilt component"
        ),
    }
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("copying {} to {}: {e}", from.display(), to.display()));
    // The component's SHA-256, for `abridge --version` (computed once, here, not at every
    // start).
    use sha2::Digest;
    let bytes = std::fs::read(to).unwrap_or_else(|e| panic!("reading {}: {e}", to.display()));
    let sum: String = sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    println!("cargo:rustc-env=ABRIDGE_COMPONENT_SHA256={sum}");
}
