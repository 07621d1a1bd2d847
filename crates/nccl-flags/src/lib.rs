//! The one flag parser of xtask and the bench: each command declares its
//! flags in a table ([`Flag`]), and [`parse`] reads its arguments against
//! it; the command then reads typed values from [`Parsed`]. `--help` is
//! answered before any parsing, by the command's own text (xtask's
//! `COMMANDS`, the bench's `USAGE`).
//!
//! A flag is a switch (`--quick`) or takes the next argument as its value
//! (`--out DIR`); given twice, the last one counts. What a table does not
//! name is an error, unless the subcommand takes trailing arguments
//! ([`Trailing::Rest`]: `launch`'s program and its arguments), in which
//! case parsing stops there and the rest is handed over untouched.

use std::str::FromStr;

/// A refusal, in words that name the flag.
pub type Result<T> = std::result::Result<T, String>;

/// One flag: its spellings (the first is the name the subcommand asks
/// for) and whether it takes a value.
pub struct Flag {
    /// `["-n", "--nproc"]`: every spelling; the first is the key.
    pub names: &'static [&'static str],
    /// Whether the next argument is this flag's value.
    pub takes_value: bool,
}

/// A flag that takes the next argument as its value.
pub const fn value(names: &'static [&'static str]) -> Flag {
    Flag {
        names,
        takes_value: true,
    }
}

/// A flag that stands alone.
pub const fn switch(names: &'static [&'static str]) -> Flag {
    Flag {
        names,
        takes_value: false,
    }
}

/// What a subcommand does with an argument its table does not name.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Trailing {
    /// It is an error.
    None,
    /// It and everything after it are handed over (after a `--`, the
    /// arguments that follow it).
    Rest,
}

/// The flags given, by key, and the trailing arguments.
pub struct Parsed<'a> {
    command: &'static str,
    given: Vec<(&'static str, Option<&'a str>)>,
    /// The arguments after the flags ([`Trailing::Rest`] only).
    pub rest: Vec<&'a str>,
}

/// Reads `args` (what follows the subcommand `command`) against `flags`.
pub fn parse<'a>(
    command: &'static str,
    flags: &'static [Flag],
    trailing: Trailing,
    args: &[&'a str],
) -> Result<Parsed<'a>> {
    let mut parsed = Parsed {
        command,
        given: Vec::new(),
        rest: Vec::new(),
    };
    let mut it = args.iter().copied();
    while let Some(arg) = it.next() {
        let Some(flag) = flags.iter().find(|f| f.names.contains(&arg)) else {
            if trailing == Trailing::None {
                return Err(format!("unknown {command} argument {arg:?}"));
            }
            if arg != "--" {
                parsed.rest.push(arg);
            }
            parsed.rest.extend(it);
            break;
        };
        let value = if flag.takes_value {
            Some(it.next().ok_or_else(|| format!("{arg} needs a value"))?)
        } else {
            None
        };
        parsed.given.push((flag.names[0], value));
    }
    Ok(parsed)
}

impl<'a> Parsed<'a> {
    /// Whether the switch `key` was given.
    pub fn has(&self, key: &str) -> bool {
        self.given.iter().any(|(k, _)| *k == key)
    }

    /// The value of `key`, the last one when given twice.
    pub fn value(&self, key: &str) -> Option<&'a str> {
        self.given
            .iter()
            .rev()
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| *v)
    }

    /// The value of `key` parsed as a `T`; an error says that `key` takes
    /// `what`.
    pub fn parsed<T: FromStr>(&self, key: &str, what: &str) -> Result<Option<T>> {
        self.value(key)
            .map(|v| v.trim().parse().map_err(|_| format!("{key} takes {what}")))
            .transpose()
    }

    /// The comma-separated list of `key`, each item checked against
    /// `known` when it is given (an error names the unknown item and the
    /// known ones, calling them `what`).
    pub fn list(
        &self,
        key: &str,
        known: Option<&[&str]>,
        what: &str,
    ) -> Result<Option<Vec<String>>> {
        let Some(value) = self.value(key) else {
            return Ok(None);
        };
        let items: Vec<String> = value
            .split(',')
            .map(str::trim)
            .filter(|i| !i.is_empty())
            .map(str::to_string)
            .collect();
        if items.is_empty() {
            return Err(format!("{key} takes a comma-separated list of {what}s"));
        }
        if let Some(known) = known
            && let Some(bad) = items.iter().find(|i| !known.contains(&i.as_str()))
        {
            return Err(format!(
                "unknown {what} {bad:?} for {} {key}; {what}s: {}",
                self.command,
                known.join(", ")
            ));
        }
        Ok(Some(items))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: &[Flag] = &[
        value(&["-n", "--nproc"]),
        switch(&["--quick"]),
        value(&["--out"]),
    ];

    #[test]
    fn reads_values_switches_and_aliases_and_refuses_the_unknown() {
        let p = parse(
            "t",
            FLAGS,
            Trailing::None,
            &["--nproc", "2", "--quick", "-n", "3"],
        )
        .expect("parse");
        assert_eq!(p.value("-n"), Some("3"));
        assert!(p.has("--quick"));
        assert_eq!(p.parsed::<usize>("-n", "a number").expect("n"), Some(3));
        assert!(p.value("--out").is_none());
        assert!(parse("t", FLAGS, Trailing::None, &["--bogus"]).is_err());
        assert!(parse("t", FLAGS, Trailing::None, &["--out"]).is_err());
        let bad = parse("t", FLAGS, Trailing::None, &["--out", "x"]).expect("parse");
        assert!(bad.parsed::<u64>("--out", "seconds").is_err());
    }

    #[test]
    fn lists_are_checked_and_the_rest_is_handed_over() {
        let p = parse("t", FLAGS, Trailing::None, &["--out", "a, b"]).expect("parse");
        assert_eq!(
            p.list("--out", None, "item").expect("list"),
            Some(vec!["a".to_string(), "b".to_string()])
        );
        assert!(p.list("--out", Some(&["a"]), "item").is_err());
        let p = parse("t", FLAGS, Trailing::Rest, &["-n", "2", "prog", "-n", "x"]).expect("parse");
        assert_eq!(p.rest, ["prog", "-n", "x"]);
        let p = parse("t", FLAGS, Trailing::Rest, &["--quick", "--", "--out"]).expect("parse");
        assert_eq!(p.rest, ["--out"]);
    }
}
