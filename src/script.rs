//! Splitting a job file into statements, each with the line it starts on, so that an error can name
//! the statement. Semicolons inside quotes and comments do not split.

/// One statement of a job file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// 1-based position among the file's statements.
    pub index: usize,
    /// 1-based line of the statement's first non-blank, non-comment character.
    pub line: usize,
    /// The statement's text, without the closing semicolon.
    pub sql: String,
}

/// Split SQL text into statements. Comments (`--`, `/* */`) stay in the text but never split it;
/// statements made only of comments and blanks are dropped.
pub fn split_statements(text: &str) -> Vec<Statement> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    // Byte offset and line of the current statement's first character, once one has been seen.
    let mut begin: Option<(usize, usize)> = None;
    let mut line = 1usize;
    let mut i = 0;
    let finish = |begin: Option<(usize, usize)>, end: usize, out: &mut Vec<Statement>| {
        if let Some((at, l)) = begin {
            out.push(Statement { index: out.len() + 1, line: l, sql: text[at..end].trim().to_string() });
        }
    };
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'\n' => line += 1,
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < bytes.len() && !(bytes[i] == b'*' && bytes.get(i + 1) == Some(&b'/')) {
                    line += (bytes[i] == b'\n') as usize;
                    i += 1;
                }
                i += 2;
                continue;
            }
            b'\'' | b'"' => {
                begin.get_or_insert((i, line));
                i += 1;
                while i < bytes.len() {
                    if bytes[i] == c {
                        // A doubled quote is an escaped quote.
                        if bytes.get(i + 1) == Some(&c) {
                            i += 2;
                            continue;
                        }
                        break;
                    }
                    line += (bytes[i] == b'\n') as usize;
                    i += 1;
                }
            }
            b';' => finish(begin.take(), i, &mut out),
            c if !c.is_ascii_whitespace() => {
                begin.get_or_insert((i, line));
            }
            _ => {}
        }
        i += 1;
    }
    finish(begin, text.len(), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_with_line_numbers() {
        let text = "-- a job\nSET embed.model = 'm;x';\n\nSELECT 1;\n/* multi\nline; */ SELECT\n 'it''s;';";
        let s = split_statements(text);
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].index, s[0].line, s[0].sql.as_str()), (1, 2, "SET embed.model = 'm;x'"));
        assert_eq!((s[1].line, s[1].sql.as_str()), (4, "SELECT 1"));
        assert_eq!(s[2].line, 6);
        assert!(s[2].sql.ends_with("'it''s;'"));
    }

    #[test]
    fn trailing_statement_without_semicolon_and_comment_only_tail() {
        let s = split_statements("SELECT 1;\nSELECT 2\n");
        assert_eq!(s.len(), 2);
        assert_eq!(s[1].sql, "SELECT 2");
        assert_eq!(split_statements("SELECT 1; -- done\n").len(), 1);
        assert!(split_statements("  \n-- nothing\n").is_empty());
    }
}
