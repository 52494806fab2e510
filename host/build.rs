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
        .expect("host/ sits in the workspace root")
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
            "building the guest component failed (see the errors above). If the target is \
             missing, install it with `rustup target add wasm32-wasip2` (rust-toolchain.toml \
             asks rustup to do this by itself)."
        );
    }
    copy(
        &target_dir.join("wasm32-wasip2/guest-release/abridge_guest.wasm"),
        &dest,
    );
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("copying {} to {}: {e}", from.display(), to.display()));
}
