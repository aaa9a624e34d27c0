//! Records which commit the binary was built from, for `sluice --version` and bug reports.
//!
//! The commit comes from `SLUICE_BUILD_COMMIT` when set (packagers building from a tarball
//! can pass it), else from `git` when this crate sits in the sluice repository's own work tree,
//! else it is "unknown". Nothing here touches the network. The script reruns when the checked
//! out commit moves (HEAD, the branch's ref, packed refs), not on every edit.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn rerun_if_exists(dir: &Path, path: &str) {
    let p = dir.join(path);
    // A path that does not exist would make cargo rerun the script on every build.
    if p.exists() {
        println!("cargo:rerun-if-changed={}", p.display());
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=SLUICE_BUILD_COMMIT");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    // The workspace root: crates/sluice-cli/../..
    let root = manifest
        .parent()
        .and_then(Path::parent)
        .unwrap_or(&manifest)
        .to_path_buf();
    let mut commit = std::env::var("SLUICE_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty());
    let mut date = None;
    // Only this repository's own history counts: a source tarball unpacked inside some other
    // git work tree must not report that tree's commit.
    let ours = git(&root, &["rev-parse", "--show-toplevel"])
        .and_then(|top| std::fs::canonicalize(top).ok())
        .zip(std::fs::canonicalize(&root).ok())
        .is_some_and(|(top, root)| top == root);
    if ours {
        for path in ["HEAD", "packed-refs"] {
            if let Some(p) = git(&root, &["rev-parse", "--git-path", path]) {
                rerun_if_exists(&root, &p);
            }
        }
        if let Some(branch) = git(&root, &["symbolic-ref", "-q", "HEAD"])
            && let Some(p) = git(&root, &["rev-parse", "--git-path", &branch])
        {
            rerun_if_exists(&root, &p);
        }
        if commit.is_none() {
            commit = git(&root, &["rev-parse", "HEAD"]);
            date = git(&root, &["show", "-s", "--format=%cs", "HEAD"]);
        }
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc_version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|v| !v.is_empty());
    println!(
        "cargo:rustc-env=SLUICE_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
    println!(
        "cargo:rustc-env=SLUICE_COMMIT_DATE={}",
        date.as_deref().unwrap_or("")
    );
    println!(
        "cargo:rustc-env=SLUICE_RUSTC={}",
        rustc_version
            .as_deref()
            .unwrap_or("rustc (unknown version)")
    );
    println!(
        "cargo:rustc-env=SLUICE_TARGET={}",
        std::env::var("TARGET").unwrap_or_default()
    );
    println!(
        "cargo:rustc-env=SLUICE_PROFILE={}",
        std::env::var("PROFILE").unwrap_or_default()
    );
}
