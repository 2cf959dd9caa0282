//! `docs/cli.md`, generated from the command's own clap definitions so it
//! cannot drift from them: `scripts/cli-docs.sh` writes it, and a test
//! fails when the file is stale.

use clap::CommandFactory;

const INTRO: &str = "\
# `nk` command reference

Generated from the command's own definitions by `scripts/cli-docs.sh` (a
test fails when this file is stale): change the doc comments in
`crates/cli/src`, then run the script. `nk COMMAND --help` prints the same.

## Conventions

- **Cluster paths** are absolute (`/jobs/in.csv`). Commands that take
  several paths also take wildcard patterns, matched against the
  namespace one component at a time: `*`, `?`, `[abc]`, `[!abc]` (`[*]`
  for a literal `*`). Quote them (`'/logs/*.gz'`) so the shell leaves them
  alone. `*` and `?` do not match a leading `.`; a pattern that matches
  nothing is `NotFound` (`nk rm -f` ignores it).
- **Local paths**: `put` and `get` take them as they are; `cp` names them
  `file:PATH` (`nk:/path`, or a plain `/path`, is a cluster path), and
  refuses a relative path without `file:`. `-` is stdin or stdout.
- **Copies** (`put`, `get`, `cp`) are whole or absent at their
  destination: a cluster File is written under a hidden name beside it
  (`.NAME.nk-copying-...`) and renamed into place, a local file likewise.
  An existing destination file is replaced only with `-f`, atomically. A
  destination that is an existing container or directory is copied into
  (each source keeps its name); one written with a trailing `/` must be
  one. Containers need `-r`. A copy into a Table makes KeyValues.
- **Errors** print one line on stderr, `nk: Code: message`, where Code is
  the cluster's error code (`NotFound`, `AlreadyExists`, `NotEmpty`,
  `TypeMismatch`, `InvalidPath`, `NoSpace`, `Unavailable`,
  `Unauthenticated`, ...; the README's *Errors* table lists them all), or
  `Io` for a local file that could not be read or written. A command given
  `--json` prints `{\"error\":{\"code\":...,\"message\":...}}` instead.
- **Exit status**: 0 on success, 1 on an error, 2 for a command line `nk`
  cannot read (`nk: InvalidArgument: ...`). `nk test` exits 0 when its
  check holds, 1 when not, 2 when it cannot tell.
- **Sizes** (flags, `nk policy set move_rate`, the config file) take the
  same forms: `512MiB`, `1.5GiB`, `64KB`, `4096`.
- **Colour**: only on a terminal, and never with `NO_COLOR` set.
";

/// The whole of `docs/cli.md`.
pub fn markdown() -> String {
    let mut cmd = crate::Cli::command();
    cmd.build();
    let mut out = String::from(INTRO);
    out.push_str("\n## Commands\n\n");
    let mut all = Vec::new();
    collect(&cmd, &mut all);
    for (name, _) in all.iter().skip(1) {
        out.push_str(&format!("- [`{name}`](#{})\n", anchor(name)));
    }
    for (name, help) in &all {
        out.push_str(&format!(
            "\n## `{name}`\n\n```text\n{}\n```\n",
            help.trim_end()
        ));
    }
    out
}

/// Every command and subcommand, depth first, with its long help.
fn collect(cmd: &clap::Command, out: &mut Vec<(String, String)>) {
    let name = cmd
        .get_bin_name()
        .map(str::to_string)
        .unwrap_or_else(|| cmd.get_name().to_string());
    let help = cmd.clone().render_long_help().to_string();
    out.push((name, help));
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        collect(sub, out);
    }
}

/// GitHub's anchor for a heading `` `nk kv put` ``.
fn anchor(name: &str) -> String {
    name.chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_definitions_are_consistent() {
        crate::Cli::command().debug_assert();
    }

    /// `docs/cli.md` is what the definitions generate; with NK_UPDATE_DOCS
    /// set (`scripts/cli-docs.sh`), this writes it instead.
    #[test]
    fn docs_cli_md_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/cli.md");
        let want = markdown();
        if std::env::var_os("NK_UPDATE_DOCS").is_some() {
            std::fs::write(&path, &want).unwrap();
            return;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "docs/cli.md is stale: run scripts/cli-docs.sh (it regenerates it from the clap definitions)"
        );
    }

    #[test]
    fn every_command_and_argument_is_described() {
        let mut cmd = crate::Cli::command();
        cmd.build();
        fn check(cmd: &clap::Command, missing: &mut Vec<String>) {
            if cmd.get_about().is_none() && cmd.get_name() != "nk" {
                missing.push(format!("command {}", cmd.get_name()));
            }
            for a in cmd.get_arguments() {
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    missing.push(format!("{} {}", cmd.get_name(), a.get_id()));
                }
            }
            for s in cmd.get_subcommands() {
                check(s, missing);
            }
        }
        let mut missing = Vec::new();
        check(&cmd, &mut missing);
        assert!(missing.is_empty(), "undescribed: {missing:?}");
    }

    #[test]
    fn anchors_are_githubs() {
        assert_eq!(anchor("nk kv put"), "nk-kv-put");
        assert_eq!(anchor("nk"), "nk");
    }
}
