//! What the `sluice` command and the Python package share: every export setting in one
//! definition ([`args::Options`]: each field a flag, a YAML key and, in Python, a keyword
//! argument), the rules that turn settings into the engine's job ([`config::job`]), and which
//! adapter serves which URL ([`registry`]). The binary (`main.rs`) adds the command line's
//! own concerns: logging, progress display, exit codes, `doctor`, completions, man page.

pub mod args;
pub mod config;
pub mod registry;
