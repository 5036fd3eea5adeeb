//! Splitting a job file into statements, each with the line and column it starts on, and parsing them
//! all before any runs. Splitting uses sqlparser's tokenizer, so semicolons inside strings of any kind
//! (`'a;b'`, `E'a\'b;c'`, `$$…$$`), quoted names and comments (nested ones too) never split.

use datafusion::common::config::Dialect;
use datafusion::execution::session_state::SessionState;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

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
    /// The statement's text placed where it stands in the file (preceded by as many line breaks and
    /// spaces), so that the line and column a parser error names are the file's, not the statement's.
    pub fn positioned_sql(&self) -> String {
        let mut sql = "\n".repeat(self.line - 1);
        sql.push_str(&" ".repeat(self.column - 1));
        sql.push_str(&self.sql);
        sql
    }
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
        state.sql_to_statement(&stmt.positioned_sql(), &dialect).map_err(|e| (i, e.strip_backtrace()))?;
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
