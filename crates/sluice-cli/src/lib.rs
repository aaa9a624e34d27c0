//! What the `sluice` command and the Python package share: every export setting in one
//! definition ([`args::Options`]: each field a flag, a YAML key and, in Python, a keyword
//! argument; [`settings`] derives the merge over the `-c` file from it), the rules that turn
//! settings into the engine's job ([`config::job`]), and which adapter serves which URL
//! ([`registry`]). The binary (`main.rs`) adds the command line's own concerns: logging,
//! progress display, exit codes, `doctor`, completions, man page.

// Its doc comments are clap's help text, read in a terminal (`<to>/_sluice/…`,
// `redis://[user:password@]…`), not rustdoc markup.
#[allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]
pub mod args;
pub mod config;
mod file;
mod formats;
#[cfg(test)]
mod python_keywords;
pub mod registry;
pub mod settings;
pub mod size;
