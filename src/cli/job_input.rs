//! Where the statements of `pipeline run` and `pipeline sql` come from: job files, `-` (a job on standard
//! input) and `-c 'SQL'`, in the order the command line gives them; `${NAME}` variables filled from
//! `--var NAME=value`, so that one job file serves several corpora; and `--set key=value` options.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::{Context, anyhow, bail};

pub use crate::ops::script::JobStatement;
use crate::ops::script::{set_key, split_statements};

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
                let text = crate::ops::script::read_job(file, &source).map_err(|e| anyhow!(e))?;
                (source, text)
            }
            Input::Stdin => {
                if stdin_read {
                    bail!("`-` is given twice; standard input holds one job");
                }
                stdin_read = true;
                let text = crate::ops::script::read_job(std::io::stdin(), "<stdin>").map_err(|e| anyhow!(e))?;
                ("<stdin>".to_string(), text)
            }
            Input::Command(sql) => {
                commands += 1;
                (format!("-c #{commands}"), sql.clone())
            }
        };
        let text = substitute(&text, vars, &source, &mut used)?;
        let statements = split_statements(&text).map_err(|e| anyhow!("{source}: {e}"))?;
        if statements.is_empty() {
            bail!("{source} holds no SQL statements");
        }
        out.extend(statements.into_iter().map(|stmt| JobStatement { source: source.clone(), stmt }));
    }
    let unused = vars.keys().filter(|k| !used.contains(*k)).cloned().collect();
    Ok((out, unused))
}

/// `text` with every `${NAME}` (NAME: a letter or `_`, then letters, digits, `_`) replaced by its value.
/// Other uses of `$` (`$1`, `$$…$$`) are left as they are.
fn substitute(
    text: &str,
    vars: &BTreeMap<String, String>,
    source: &str,
    used: &mut BTreeSet<String>,
) -> anyhow::Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let name = after.find('}').map(|end| &after[..end]).filter(|n| is_name(n));
        let Some(name) = name else {
            out.push_str("${");
            rest = after;
            continue;
        };
        let Some(value) = vars.get(name) else {
            let line = text[..text.len() - rest.len() + at].matches('\n').count() + 1;
            bail!("{source} line {line}: ${{{name}}} has no value; give it with --var {name}=…");
        };
        used.insert(name.to_string());
        out.push_str(value);
        rest = &after[name.len() + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `--var NAME=value` arguments as a map; a malformed one or a name given twice is an error.
pub fn parse_vars(items: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    let mut vars = BTreeMap::new();
    for item in items {
        let (name, value) = item.split_once('=').ok_or_else(|| anyhow!("--var {item}: write it as NAME=value"))?;
        if !is_name(name) {
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
                .filter(|(k, _)| {
                    k.contains('.') && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
                })
                .ok_or_else(|| anyhow!("--set {item}: write it as key=value, e.g. --set embed.batch_tokens=8192"))?;
            Ok((key.trim().to_string(), value.to_string()))
        })
        .collect()
}

/// Refuse a `--set` key that the job also `SET`s: which one should win is not for the pipeline to guess.
pub fn check_sets_against_job(sets: &[(String, String)], statements: &[JobStatement]) -> anyhow::Result<()> {
    for (key, _) in sets {
        if let Some(s) = statements.iter().find(|s| sets_key(&s.stmt.sql, key)) {
            bail!(
                "--set {key} is given, and {} line {} sets {key} too; remove one of them (a job that should take \
                 either can use ${{NAME}} and --var)",
                s.source,
                s.stmt.line
            );
        }
    }
    Ok(())
}

/// Whether `sql` is `SET key …`, any case.
fn sets_key(sql: &str, key: &str) -> bool {
    set_key(sql).is_some_and(|(name, _)| name.eq_ignore_ascii_case(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(items: &[&str]) -> BTreeMap<String, String> {
        parse_vars(&items.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn variables_are_filled_and_other_dollars_left_alone() {
        let mut used = BTreeSet::new();
        let v = vars(&["CORPUS=data/a.jsonl", "OUT=out/a.lance", "EXTRA=x"]);
        let text = "CREATE EXTERNAL TABLE d STORED AS JSON LOCATION '${CORPUS}';\nSELECT $1, $$a$$, '${not a name}';\n\
                    COPY (SELECT 1) TO '${OUT}' STORED AS LANCE;";
        let got = substitute(text, &v, "job.sql", &mut used).unwrap();
        assert!(got.contains("LOCATION 'data/a.jsonl'") && got.contains("TO 'out/a.lance'"), "{got}");
        assert!(got.contains("SELECT $1, $$a$$, '${not a name}'"), "{got}");
        assert_eq!(used.into_iter().collect::<Vec<_>>(), ["CORPUS", "OUT"]);
    }

    #[test]
    fn a_missing_variable_names_its_line() {
        let err = substitute("SELECT 1;\nSELECT '${CORPUS}';", &BTreeMap::new(), "job.sql", &mut BTreeSet::new())
            .unwrap_err()
            .to_string();
        assert_eq!(err, "job.sql line 2: ${CORPUS} has no value; give it with --var CORPUS=…");
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
        assert!(
            sets_key("set EMBED.Device='cuda'", "embed.device") && sets_key("SET\n embed.device TO x", "embed.device")
        );
        assert!(!sets_key("SELECT 1", "embed.device") && !sets_key("SET embed.device_x = 1", "embed.device"));
    }
}
