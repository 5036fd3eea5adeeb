//! The command reference, `docs/reference/commands.md`, generated from the command's own clap definitions: each
//! command's `--help` as the command prints it. A test fails when the checked-in page is not what this generates;
//! `scripts/reference` writes it again.

use clap::CommandFactory;

/// Where the page is kept, from the repository's root.
pub const COMMANDS_PAGE: &str = "docs/reference/commands.md";

const HEAD: &str = "# Command reference\n\n\
Every command's `--help`, as `pipeline` prints it. Generated from the command's definitions by `scripts/reference`; \
a test fails when this page is not what the command says, so do not edit it by hand. The `embed.*` options a job \
sets are in [options.md](options.md).\n";

/// The page: `pipeline --help`, then each command's (and each of their commands', in order), hidden ones left out.
pub fn commands_page() -> String {
    let mut cli = super::Cli::command();
    cli.build();
    let mut page = String::from(HEAD);
    add(&mut page, &mut cli, "pipeline");
    page
}

fn add(page: &mut String, command: &mut clap::Command, path: &str) {
    let help = command.render_long_help().to_string();
    page.push_str(&format!("\n## `{path}`\n\n```text\n{}\n```\n", help.trim_end()));
    let names: Vec<String> = command
        .get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        .map(|c| c.get_name().to_string())
        .collect();
    for name in names {
        if let Some(sub) = command.find_subcommand_mut(&name) {
            add(page, sub, &format!("{path} {name}"));
        }
    }
}

/// The first line (from 1) where `page` and the file `relative` under the repository's root differ, if they do.
pub(super) fn first_difference(relative: &str, page: &str) -> Option<usize> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    let kept = std::fs::read_to_string(path).unwrap_or_default();
    (kept != page).then(|| {
        let same = kept.lines().zip(page.lines()).take_while(|(a, b)| a == b).count();
        same + 1
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page holds every command a user can type (the cluster's commands are in the default build), and is the
    /// one checked in; `PIPELINE_WRITE_REFERENCE=1` (`scripts/reference`) writes it instead.
    #[cfg(feature = "cluster")]
    #[test]
    fn the_command_reference_is_what_the_command_says() {
        let page = commands_page();
        for command in ["## `pipeline run`", "## `pipeline trial`", "## `pipeline scheduler`"] {
            assert!(page.contains(command), "{command}");
        }
        if std::env::var_os("PIPELINE_WRITE_REFERENCE").is_some() {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(COMMANDS_PAGE);
            std::fs::write(path, &page).unwrap();
        }
        if let Some(line) = first_difference(COMMANDS_PAGE, &page) {
            panic!(
                "{COMMANDS_PAGE} is not what the command says from line {line}: run scripts/reference and commit it"
            );
        }
        // A flag added without writing the page again is caught.
        let added = page.replacen("Options:\n", "Options:\n      --new-flag  Something new\n", 1);
        assert!(first_difference(COMMANDS_PAGE, &added).is_some());
    }
}
