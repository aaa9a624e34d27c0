//! What laying settings over the `-c` file needs from their one definition, generated from it:
//! a struct of settings is declared inside `declare_settings!`, which writes the struct as
//! it is (its clap and serde derives make each field a flag and a YAML key of the same name)
//! and implements [`Settings`] from its fields: the YAML keys, and the field-by-field merge
//! in which every setting the caller gave replaces the file's. A new option is one field.
//!
//! Which settings the caller gave is [`Given`]: on the command line, clap's value source says
//! so (a default never hides the file's value); for the Python package's keywords, a setting
//! holding a value was given (unset keywords are not passed).

use clap::ArgMatches;
use clap::parser::ValueSource;

/// A struct of settings (see the module's documentation): the struct as written, and its
/// [`Settings`]. Fields are `pub`, each of a type that is a [`Setting`].
macro_rules! declare_settings {
    (
        $(#[$attr:meta])*
        pub struct $name:ident {
            $(
                $(#[$field_attr:meta])*
                pub $field:ident: $ty:ty
            ),* $(,)?
        }
    ) => {
        $(#[$attr])*
        pub struct $name {
            $(
                $(#[$field_attr])*
                pub $field: $ty,
            )*
        }

        impl $crate::settings::Settings for $name {
            const KEYS: &'static [&'static str] = &[$(stringify!($field)),*];

            fn lay_over(self, file: Self, given: &$crate::settings::Given) -> Self {
                use $crate::settings::Setting;
                Self {
                    $(
                        $field: if given.gives(stringify!($field), self.$field.is_set()) {
                            self.$field
                        } else {
                            file.$field
                        },
                    )*
                }
            }

            fn has(&self, key: &str) -> bool {
                use $crate::settings::Setting;
                match key {
                    $(stringify!($field) => self.$field.is_set(),)*
                    _ => false,
                }
            }
        }
    };
}
pub(crate) use declare_settings;

/// A struct of settings declared with `declare_settings!`.
pub trait Settings: Sized {
    /// Its YAML keys: the fields' names, which are also clap's ids of the flags (the flags'
    /// names with `_` for `-`).
    const KEYS: &'static [&'static str];

    /// `self` (what the caller gave) laid over `file`: each setting `given` names is `self`'s,
    /// the others the file's.
    fn lay_over(self, file: Self, given: &Given) -> Self;

    /// Whether the setting `key` holds a value (is not left to its default).
    fn has(&self, key: &str) -> bool;
}

/// A field of a settings struct: whether it holds a value.
pub trait Setting {
    /// `Some`, a non-empty list, `true`.
    fn is_set(&self) -> bool;
}

impl<T> Setting for Option<T> {
    fn is_set(&self) -> bool {
        self.is_some()
    }
}

impl<T> Setting for Vec<T> {
    fn is_set(&self) -> bool {
        !self.is_empty()
    }
}

impl Setting for bool {
    fn is_set(&self) -> bool {
        *self
    }
}

/// Which settings the caller gave, so that they replace the `-c` file's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Given {
    /// Those typed on the command line (clap's value source), by id, which is the YAML key.
    CommandLine(Vec<String>),
    /// Those holding a value: keywords, of which only the ones set are passed.
    Set,
}

impl Given {
    /// The settings `matches` (one command's) took from the command line, leaving out the
    /// `global` flags, which are the whole command's (`--log-format`), not a setting's.
    pub fn command_line(matches: &ArgMatches, globals: &[&str]) -> Given {
        Given::CommandLine(
            matches
                .ids()
                .map(|id| id.as_str())
                .filter(|id| {
                    matches.value_source(id) == Some(ValueSource::CommandLine)
                        && !globals.contains(id)
                })
                .map(str::to_string)
                .collect(),
        )
    }

    /// Whether the setting `key`, which holds a value when `set`, was given.
    pub fn gives(&self, key: &str, set: bool) -> bool {
        match self {
            Given::CommandLine(ids) => ids.iter().any(|id| id == key),
            Given::Set => set,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Options, ReplicateOptions, StreamOptions};
    use clap::{Args, Command};

    /// The keys of `T` that are no flag: clap's ids are the field names, so a flag's value
    /// source names its YAML key.
    fn keys_without_a_flag<T: Args + Settings>() -> Vec<&'static str> {
        let cmd = T::augment_args(Command::new("t"));
        let ids: Vec<&str> = cmd.get_arguments().map(|a| a.get_id().as_str()).collect();
        for id in &ids {
            assert!(T::KEYS.contains(id), "the flag id {id} is not a key");
        }
        T::KEYS
            .iter()
            .copied()
            .filter(|k| !ids.contains(k))
            .collect()
    }

    #[test]
    fn every_flag_id_is_its_yaml_key() {
        // The file's log format has the global --log-format as its flag.
        assert_eq!(keys_without_a_flag::<Options>(), ["log_format"]);
        assert!(keys_without_a_flag::<StreamOptions>().is_empty());
        assert!(keys_without_a_flag::<ReplicateOptions>().is_empty());
    }

    #[test]
    fn given_on_the_command_line_or_set() {
        let cmd = Command::new("t")
            .arg(clap::Arg::new("slot").long("slot"))
            .arg(
                clap::Arg::new("drop")
                    .long("drop")
                    .action(clap::ArgAction::SetTrue),
            )
            .arg(clap::Arg::new("log_format").long("log-format").global(true));
        let m = cmd.get_matches_from(["t", "--slot", "s", "--log-format", "json"]);
        let given = Given::command_line(&m, &["log_format"]);
        assert_eq!(given, Given::CommandLine(vec!["slot".into()]));
        assert!(given.gives("slot", false));
        assert!(!given.gives("drop", true), "a default is not given");
        assert!(Given::Set.gives("slot", true) && !Given::Set.gives("slot", false));
    }
}
