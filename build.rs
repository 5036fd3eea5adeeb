//! The commit the command is built from, for `pipeline --version` (`PIPELINE_COMMIT`: `git rev-parse --short=12
//! HEAD`, or `unknown` outside a git checkout, e.g. from a source archive). It runs again when the checkout's HEAD
//! moves, not on every source change.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=PIPELINE_COMMIT={commit}");
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        for moved in ["HEAD", "refs/heads", "packed-refs"] {
            println!("cargo:rerun-if-changed={dir}/{moved}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
