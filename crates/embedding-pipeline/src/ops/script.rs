//! Splitting a job file into statements, each with the line and column it starts on, and parsing them
//! all before any runs. Splitting uses sqlparser's tokenizer, so semicolons inside strings of any kind
//! (`'a;b'`, `E'a\'b;c'`, `$$…$$`), quoted names and comments (nested ones too) never split.

use std::collections::{BTreeMap, BTreeSet};

use datafusion::common::config::Dialect;
use datafusion::execution::session_state::SessionState;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use crate::Error;

/// A statement and where it came from (`job.sql`, `<stdin>`, `-c #2`), for messages.
#[derive(Debug, Clone)]
pub struct JobStatement {
    pub source: String,
    pub stmt: Statement,
}

impl JobStatement {
    /// The statements of a job's text, each named by `source` (a file name, `-c #1`) in messages.
    pub fn all_of(source: &str, text: &str) -> std::result::Result<Vec<Self>, String> {
        Ok(split_statements(text)?.into_iter().map(|stmt| Self { source: source.to_string(), stmt }).collect())
    }
}

/// The statements of a job's text with every `${NAME}` replaced by its value in `vars`, each named by `source`
/// (a file name, `-c #1`, `<sql>`) in messages. A variable the job uses and `vars` lacks is refused, naming
/// its line; a text of no statements is refused. Returns the statements and the variables given and never
/// used (to warn about).
pub fn job_statements(
    source: &str,
    text: &str,
    vars: &BTreeMap<String, String>,
) -> crate::Result<(Vec<JobStatement>, Vec<String>)> {
    let mut used = BTreeSet::new();
    let text = substitute(text, vars, source, &mut used)?;
    let statements = JobStatement::all_of(source, &text).map_err(|e| Error::Refused(format!("{source}: {e}")))?;
    if statements.is_empty() {
        return Err(Error::Refused(format!("{source} holds no SQL statements")));
    }
    let unused = vars.keys().filter(|k| !used.contains(*k)).cloned().collect();
    Ok((statements, unused))
}

/// `text` with every `${NAME}` (NAME: a letter or `_`, then letters, digits, `_`) replaced by its value.
/// Other uses of `$` (`$1`, `$$…$$`) are left as they are.
pub fn substitute(
    text: &str,
    vars: &BTreeMap<String, String>,
    source: &str,
    used: &mut BTreeSet<String>,
) -> crate::Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let name = after.find('}').map(|end| &after[..end]).filter(|n| is_var_name(n));
        let Some(name) = name else {
            out.push_str("${");
            rest = after;
            continue;
        };
        let Some(value) = vars.get(name) else {
            let line = text[..text.len() - rest.len() + at].matches('\n').count() + 1;
            return Err(Error::Refused(format!(
                "{source} line {line}: ${{{name}}} has no value; give it with --var {name}=… (in Python: vars={{\"{name}\": …}})"
            )));
        };
        used.insert(name.to_string());
        out.push_str(value);
        rest = &after[name.len() + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Whether `s` can name a `${NAME}` variable: a letter or `_`, then letters, digits or `_`.
pub fn is_var_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `s` can name a setting given beside a job (`--set key=value`, a program's `sets`): a namespace and a
/// key (`embed.batch_tokens`), of letters, digits, `_` and `.`.
pub fn is_setting_name(s: &str) -> bool {
    s.contains('.') && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

/// Refuse a setting given beside the job (`--set key=value`, a program's `sets`) that the job also `SET`s:
/// which one should win is not for the pipeline to guess.
pub fn check_sets_against_job(sets: &[(String, String)], statements: &[JobStatement]) -> crate::Result<()> {
    for (key, _) in sets {
        if let Some(s) = statements.iter().find(|s| sets_key(&s.stmt.sql, key)) {
            return Err(Error::Refused(format!(
                "--set {key} is given, and {} line {} sets {key} too; remove one of them (a job that should take \
                 either can use ${{NAME}} and --var)",
                s.source, s.stmt.line
            )));
        }
    }
    Ok(())
}

/// Whether `sql` is `SET key …`, any case.
fn sets_key(sql: &str, key: &str) -> bool {
    set_key(sql).is_some_and(|(name, _)| name.eq_ignore_ascii_case(key))
}

/// One statement of a job file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// 1-based position among the file's statements.
    pub index: usize,
    /// 1-based line of the statement's first non-blank, non-comment character.
    pub line: usize,
    /// 1-based column (in characters) of that character.
    pub column: usize,
    /// The statement's text, without the closing semicolon.
    pub sql: String,
}

impl Statement {
    /// `message` (a parser's error about this statement's text) with each `Line: L, Column: C` it names moved
    /// to where the statement stands in the file. Statements are parsed as they are, not padded to their place
    /// with line breaks, which made a job of N statements cost N² to parse (20,000 took 43 s).
    pub fn relocate(&self, message: &str) -> String {
        const LINE: &str = "Line: ";
        const COLUMN: &str = ", Column: ";
        let mut out = String::with_capacity(message.len());
        let mut rest = message;
        while let Some(at) = rest.find(LINE) {
            out.push_str(&rest[..at + LINE.len()]);
            rest = &rest[at + LINE.len()..];
            let digits = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
            let n = digits(rest);
            let Ok(line) = rest[..n].parse::<usize>() else { continue };
            let after = &rest[n..];
            let Some(col_text) = after.strip_prefix(COLUMN) else {
                out.push_str(&(line + self.line - 1).to_string());
                rest = after;
                continue;
            };
            let m = digits(col_text);
            let column = col_text[..m].parse::<usize>().unwrap_or(0);
            let column = if line == 1 { column + self.column - 1 } else { column };
            out.push_str(&format!("{}{COLUMN}{column}", line + self.line - 1));
            rest = &col_text[m..];
        }
        out.push_str(rest);
        out
    }
}

/// The most bytes a job's text may hold: SQL statements, not data (a job file of `/dev/zero` was read until the
/// process was killed for memory).
pub const MAX_JOB_BYTES: u64 = 16 * 1024 * 1024;

/// The text of a job read from `reader`, refused when it is over [`MAX_JOB_BYTES`] or not UTF-8. `source`
/// names it in the message.
pub fn read_job(reader: impl std::io::Read, source: &str) -> Result<String, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    reader.take(MAX_JOB_BYTES + 1).read_to_end(&mut bytes).map_err(|e| format!("cannot read the job {source}: {e}"))?;
    if bytes.len() as u64 > MAX_JOB_BYTES {
        return Err(format!(
            "the job {source} is over {} MiB, which no job of SQL statements is; a corpus is read by CREATE EXTERNAL \
             TABLE … LOCATION, not given as the job",
            MAX_JOB_BYTES / (1024 * 1024)
        ));
    }
    String::from_utf8(bytes)
        .map_err(|e| format!("the job {source} is not UTF-8 text (byte {})", e.utf8_error().valid_up_to()))
}

/// Split SQL text into statements. Comments stay in a statement's text but never split it; statements
/// made only of comments and blanks are dropped. An unterminated string or comment is an error that
/// names its line and column.
pub fn split_statements(text: &str) -> Result<Vec<Statement>, String> {
    let tokens = Tokenizer::new(&GenericDialect {}, text).tokenize_with_location().map_err(|e| e.to_string())?;
    let lines = LineStarts::new(text);
    let mut out = Vec::new();
    let mut begin = None;
    let finish = |begin: Option<(u64, u64)>, end: usize, out: &mut Vec<Statement>| {
        if let Some((line, column)) = begin {
            let at = lines.offset(line, column);
            out.push(Statement {
                index: out.len() + 1,
                line: line as usize,
                column: column as usize,
                sql: text[at..end].trim_end().to_string(),
            });
        }
    };
    for token in &tokens {
        match &token.token {
            Token::Whitespace(_) => {}
            Token::SemiColon => {
                let end = lines.offset(token.span.start.line, token.span.start.column);
                finish(begin.take(), end, &mut out);
            }
            _ => {
                begin.get_or_insert((token.span.start.line, token.span.start.column));
            }
        }
    }
    finish(begin, text.len(), &mut out);
    Ok(out)
}

/// Whether `text` ends a statement: its last token, outside strings and comments, is a `;`. Text with an
/// unterminated string or comment does not.
pub fn ends_statement(text: &str) -> bool {
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, text).tokenize() else { return false };
    tokens.iter().rev().find(|t| !matches!(t, Token::Whitespace(_))).is_some_and(|t| matches!(t, Token::SemiColon))
}

/// Parse every statement, without planning or running any, so that a syntax error anywhere in a job is
/// reported before its first statement runs. `SET datafusion.…` statements are applied to a copy of
/// `state` as they come, so a job that changes `datafusion.sql_parser.dialect` is parsed as it will run.
/// The error names the statement, and the parser's line and column are the file's.
pub fn parse_all(state: &SessionState, statements: &[Statement]) -> Result<(), (usize, String)> {
    let mut dialect: Dialect = state.config_options().sql_parser.dialect;
    for (i, stmt) in statements.iter().enumerate() {
        state.sql_to_statement(&stmt.sql, &dialect).map_err(|e| (i, stmt.relocate(&e.strip_backtrace())))?;
        if let Some(value) = set_value(&stmt.sql, "datafusion.sql_parser.dialect")
            && let Ok(d) = value.parse::<Dialect>()
        {
            dialect = d;
        }
    }
    Ok(())
}

/// The value of `SET key = value` (or `SET key TO value`, `SET key=value`) when `sql` sets `key`, unquoted.
fn set_value(sql: &str, key: &str) -> Option<String> {
    let (name, rest) = set_key(sql)?;
    if !name.eq_ignore_ascii_case(key) {
        return None;
    }
    let rest = rest.trim();
    let value = match rest.strip_prefix('=') {
        Some(v) => v,
        None => rest.get(..2).filter(|w| w.eq_ignore_ascii_case("to")).map(|_| &rest[2..])?,
    };
    Some(value.trim().trim_matches(['\'', '"']).to_string())
}

/// The key a `SET key …` statement sets, and what follows it (`SET key = v`, `SET key TO v`, `SET key=v`,
/// any case); None for any other statement.
pub fn set_key(sql: &str) -> Option<(&str, &str)> {
    let sql = sql.trim_start();
    let rest = sql.get(..3).filter(|w| w.eq_ignore_ascii_case("set")).map(|_| &sql[3..])?;
    if !rest.starts_with(char::is_whitespace) {
        return None;
    }
    let rest = rest.trim_start();
    let end = rest.find(|c: char| c.is_whitespace() || c == '=').unwrap_or(rest.len());
    Some((&rest[..end], &rest[end..]))
}

/// Byte offset of each line's start, to turn the tokenizer's (line, column in characters) into offsets.
struct LineStarts<'a> {
    text: &'a str,
    starts: Vec<usize>,
}

impl<'a> LineStarts<'a> {
    fn new(text: &'a str) -> Self {
        let starts = std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)).collect();
        Self { text, starts }
    }

    fn offset(&self, line: u64, column: u64) -> usize {
        let start = self.starts.get(line.saturating_sub(1) as usize).copied().unwrap_or(self.text.len());
        let rest = &self.text[start..];
        rest.char_indices().nth(column.saturating_sub(1) as usize).map_or(self.text.len(), |(i, _)| start + i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    fn split(text: &str) -> Vec<Statement> {
        split_statements(text).unwrap()
    }

    #[test]
    fn variables_are_filled_and_other_dollars_left_alone() {
        let mut used = BTreeSet::new();
        let v: BTreeMap<String, String> = [("CORPUS", "data/a.jsonl"), ("OUT", "out/a.lance"), ("EXTRA", "x")]
            .map(|(k, v)| (k.into(), v.into()))
            .into();
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
        assert_eq!(
            err,
            "job.sql line 2: ${CORPUS} has no value; give it with --var CORPUS=… (in Python: vars={\"CORPUS\": …})"
        );
    }

    #[test]
    fn a_set_key_is_matched_in_any_case_and_layout() {
        assert!(
            sets_key("set EMBED.Device='cuda'", "embed.device") && sets_key("SET\n embed.device TO x", "embed.device")
        );
        assert!(!sets_key("SELECT 1", "embed.device") && !sets_key("SET embed.device_x = 1", "embed.device"));
    }

    #[test]
    fn splits_with_line_numbers() {
        let text = "-- a job\nSET embed.model = 'm;x';\n\nSELECT 1;\n/* multi\nline; */ SELECT\n 'it''s;';";
        let s = split(text);
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].index, s[0].line, s[0].column, s[0].sql.as_str()), (1, 2, 1, "SET embed.model = 'm;x'"));
        assert_eq!((s[1].line, s[1].sql.as_str()), (4, "SELECT 1"));
        assert_eq!((s[2].line, s[2].column), (6, 10));
        assert!(s[2].sql.ends_with("'it''s;'"));
    }

    #[test]
    fn escapes_nested_comments_and_non_ascii_do_not_split() {
        let s = split("SELECT E'a\\'b;c';\n/* outer /* inner; */ still; */ SELECT 'é;' AS \"x;y\";\nSELECT 3");
        assert_eq!(s.len(), 3, "{s:?}");
        assert_eq!(s[0].sql, "SELECT E'a\\'b;c'");
        assert_eq!((s[1].line, s[1].column, s[1].sql.as_str()), (2, 33, "SELECT 'é;' AS \"x;y\""));
        assert_eq!((s[2].line, s[2].sql.as_str()), (3, "SELECT 3"));
    }

    #[test]
    fn trailing_statement_without_semicolon_and_comment_only_tail() {
        let s = split("SELECT 1;\nSELECT 2\n");
        assert_eq!(s.len(), 2);
        assert_eq!(s[1].sql, "SELECT 2");
        assert_eq!(split("SELECT 1; -- done\n").len(), 1);
        assert!(split("  \n-- nothing\n").is_empty());
    }

    #[test]
    fn a_statement_ends_at_a_semicolon_outside_strings_and_comments() {
        assert!(ends_statement("SELECT 1;") && ends_statement("SELECT 1; -- done\n"));
        assert!(!ends_statement("SELECT 'a;") && !ends_statement("SELECT 1 /* ; */") && !ends_statement("SELECT 1"));
        assert!(!ends_statement("SELECT 1;\nSELECT 2"));
    }

    #[test]
    fn unterminated_string_names_its_place() {
        let err = split_statements("SELECT 1;\nSELECT 'oops;\n").unwrap_err();
        assert!(err.contains("Line: 2"), "{err}");
    }

    #[test]
    fn parse_errors_carry_the_files_line_and_the_statement() {
        let text = "SELECT 1;\n\nSET embed.batch_tokens = 4096;\nSELECT 2;\n  SELEC 3 FROM t;\n";
        let statements = split(text);
        let state = SessionContext::new().state();
        let (i, err) = parse_all(&state, &statements).unwrap_err();
        assert_eq!(i, 3);
        assert!(err.contains("Line: 5, Column: 3"), "{err}");
    }

    #[test]
    fn a_job_over_the_limit_or_not_text_is_refused_without_reading_it_all() {
        let endless = std::io::repeat(0);
        let err = read_job(endless, "/dev/zero").unwrap_err();
        assert!(err.contains("/dev/zero is over 16 MiB"), "{err}");
        let err = read_job(&b"SELECT 1;\xff"[..], "job.sql").unwrap_err();
        assert!(err.contains("job.sql is not UTF-8 text (byte 9)"), "{err}");
        assert_eq!(read_job(&b"SELECT 1;"[..], "job.sql").unwrap(), "SELECT 1;");
    }

    #[test]
    fn a_message_names_the_files_line_and_column() {
        let s = &split("SELECT 1;\n\n   SELECT\n  2;")[1];
        assert_eq!(s.relocate("x at Line: 1, Column: 4 y"), "x at Line: 3, Column: 7 y");
        assert_eq!(s.relocate("at Line: 2, Column: 3; Line: 1"), "at Line: 4, Column: 3; Line: 3");
        assert_eq!(s.relocate("no place, Line: x"), "no place, Line: x");
    }

    /// Splitting and parsing grow with the job, not its square (10,000 statements took 15.6 s, 20,000 took 43 s):
    /// ten times the statements take about ten times as long, not a hundred.
    #[test]
    fn a_long_job_splits_and_parses_in_linear_time() {
        let state = SessionContext::new().state();
        let time = |n: usize| {
            let text = "SELECT 1;\n".repeat(n);
            let started = std::time::Instant::now();
            let statements = split(&text);
            parse_all(&state, &statements).unwrap();
            assert_eq!(statements.len(), n);
            started.elapsed().as_secs_f64()
        };
        time(500); // warm
        let (small, large) = (time(2_000), time(20_000));
        assert!(large / small < 40.0, "2,000 statements {small:.3} s, 20,000 {large:.3} s");
    }

    #[test]
    fn a_dialect_set_in_the_job_parses_what_follows() {
        let statements = split("SET datafusion.sql_parser.dialect = 'MySQL';\nSELECT `a` FROM t;");
        let state = SessionContext::new().state();
        assert!(parse_all(&state, &statements).is_ok());
        assert_eq!(
            set_value("set datafusion.sql_parser.dialect TO 'x'", "datafusion.sql_parser.dialect").unwrap(),
            "x"
        );
    }
}
