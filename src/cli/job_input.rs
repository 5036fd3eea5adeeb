//! Where the statements of `pipeline run` and `pipeline sql` come from: job files, `-` (a job on standard
//! input) and `-c 'SQL'`, in the order the command line gives them; `${NAME}` variables filled from
//! `--var NAME=value`, so that one job file serves several corpora; and `--set key=value` options.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::{Context, anyhow, bail};

pub use embedding_pipeline::ops::script::JobStatement;
pub use embedding_pipeline::ops::script::check_sets_against_job;
use embedding_pipeline::ops::script::{is_var_name, job_statements};

/// One place statements come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A job file.
    File(PathBuf),
    /// A job read from standard input (`-`).
    Stdin,
    /// Statements given with `-c`.
    Command(String),
}

impl Input {
    /// A job argument: `-` is standard input, anything else a file.
    pub fn from_arg(arg: PathBuf) -> Self {
        if arg.as_os_str() == "-" { Self::Stdin } else { Self::File(arg) }
    }
}

/// The statements of `inputs`, in order, with `${NAME}` replaced by `vars`. A variable the job uses and
/// `vars` lacks is an error naming the place; a variable given and never used is returned, to warn about.
pub fn read_statements(
    inputs: &[Input],
    vars: &BTreeMap<String, String>,
) -> anyhow::Result<(Vec<JobStatement>, Vec<String>)> {
    let mut out = Vec::new();
    let mut used = BTreeSet::new();
    let (mut commands, mut stdin_read) = (0, false);
    for input in inputs {
        let (source, text) = match input {
            Input::File(path) => {
                let file =
                    std::fs::File::open(path).with_context(|| format!("cannot read job file {}", path.display()))?;
                let source = path.display().to_string();
                let text = embedding_pipeline::ops::script::read_job(file, &source).map_err(|e| anyhow!(e))?;
                (source, text)
            }
            Input::Stdin => {
                if stdin_read {
                    bail!("`-` is given twice; standard input holds one job");
                }
                stdin_read = true;
                let text =
                    embedding_pipeline::ops::script::read_job(std::io::stdin(), "<stdin>").map_err(|e| anyhow!(e))?;
                ("<stdin>".to_string(), text)
            }
            Input::Command(sql) => {
                commands += 1;
                (format!("-c #{commands}"), sql.clone())
            }
        };
        let (statements, unused) = job_statements(&source, &text, vars)?;
        used.extend(vars.keys().filter(|k| !unused.contains(k)).cloned());
        out.extend(statements);
    }
    let unused = vars.keys().filter(|k| !used.contains(*k)).cloned().collect();
    Ok((out, unused))
}

/// `--var NAME=value` arguments as a map; a malformed one or a name given twice is an error.
pub fn parse_vars(items: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    let mut vars = BTreeMap::new();
    for item in items {
        let (name, value) = item.split_once('=').ok_or_else(|| anyhow!("--var {item}: write it as NAME=value"))?;
        if !is_var_name(name) {
            bail!("--var {item}: `{name}` is not a variable name (a letter or _, then letters, digits or _)");
        }
        if vars.insert(name.to_string(), value.to_string()).is_some() {
            bail!("--var {name} is given twice");
        }
    }
    Ok(vars)
}

/// `--set key=value` arguments, in order; a malformed one is an error.
pub fn parse_sets(items: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    items
        .iter()
        .map(|item| {
            let (key, value) = item
                .split_once('=')
                .filter(|(k, _)| embedding_pipeline::ops::script::is_setting_name(k))
                .ok_or_else(|| anyhow!("--set {item}: write it as key=value, e.g. --set embed.batch_tokens=8192"))?;
            Ok((key.trim().to_string(), value.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(items: &[&str]) -> BTreeMap<String, String> {
        parse_vars(&items.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn bad_vars_and_sets_are_refused() {
        assert!(parse_vars(&["NOEQUALS".into()]).is_err());
        assert!(parse_vars(&["1X=a".into()]).is_err());
        assert!(parse_vars(&["X=a".into(), "X=b".into()]).is_err());
        assert_eq!(vars(&["X=a=b"])["X"], "a=b");
        assert!(parse_sets(&["batch_tokens".into()]).is_err());
        assert!(parse_sets(&["batch_tokens=3".into()]).is_err(), "a key names its namespace");
        assert_eq!(parse_sets(&["embed.device=cuda:1".into()]).unwrap(), [("embed.device".into(), "cuda:1".into())]);
    }

    #[test]
    fn commands_are_labelled_and_a_set_the_job_repeats_is_refused() {
        let inputs =
            [Input::Command("SET embed.batch_tokens = 4096; SELECT 1".into()), Input::Command("SELECT 2".into())];
        let (statements, unused) = read_statements(&inputs, &vars(&["A=1"])).unwrap();
        let labels: Vec<_> = statements.iter().map(|s| s.source.as_str()).collect();
        assert_eq!(labels, ["-c #1", "-c #1", "-c #2"]);
        assert_eq!(unused, ["A"]);
        let sets = parse_sets(&["embed.batch_tokens=8192".into()]).unwrap();
        let err = check_sets_against_job(&sets, &statements).unwrap_err().to_string();
        assert!(err.contains("-c #1 line 1 sets embed.batch_tokens"), "{err}");
        assert!(read_statements(&[Input::Command("-- nothing".into())], &BTreeMap::new()).is_err());
    }
}
