//! Finding the line a JSON lines source fails on. Arrow's JSON reader says what is wrong but not where
//! ("EOF while parsing an object at line 1 column 20" counts lines within its buffer, not the file), so
//! when a statement fails with a JSON error, the job's JSON sources are read again line by line.

use std::io::BufRead;
use std::path::{Path, PathBuf};

/// The first line of `location` (a file or a folder of JSON lines files) that is not valid UTF-8, not one JSON
/// object, or, when `error` is Arrow's "whilst decoding field 'F': expected T got V", whose field F is not a T:
/// its file, 1-based line number, and what is wrong with it.
pub fn first_bad_line(location: &str, error: &str) -> Option<(PathBuf, usize, String)> {
    let wanted = field_type(error);
    let path = Path::new(location.strip_prefix("file://").unwrap_or(location));
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension().and_then(|e| e.to_str()).is_some_and(|e| ["json", "jsonl", "ndjson"].contains(&e))
            })
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_path_buf()]
    };
    files.into_iter().find_map(|f| bad_line_in(&f, wanted.as_ref()).map(|(n, why)| (f, n, why)))
}

/// The JSON types a value may have.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    String,
    Number,
    Bool,
    List,
    Object,
}

impl Kind {
    fn of(v: &serde_json::Value) -> Option<Self> {
        use serde_json::Value::*;
        match v {
            Null => None,
            Bool(_) => Some(Self::Bool),
            Number(_) => Some(Self::Number),
            String(_) => Some(Self::String),
            Array(_) => Some(Self::List),
            Object(_) => Some(Self::Object),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::String => "a string",
            Self::Number => "a number",
            Self::Bool => "true or false",
            Self::List => "a list",
            Self::Object => "an object",
        }
    }
}

/// The field and type that Arrow's JSON decoder expected, from its message.
fn field_type(error: &str) -> Option<(String, Kind)> {
    let rest = &error[error.find("whilst decoding field '")? + "whilst decoding field '".len()..];
    let field = &rest[..rest.find('\'')?];
    let rest = &rest[rest.find("expected ")? + "expected ".len()..];
    let kind = match rest.split_whitespace().next()? {
        "string" => Kind::String,
        "bool" | "boolean" => Kind::Bool,
        "list" | "[" => Kind::List,
        "{" | "struct" | "object" => Kind::Object,
        _ => Kind::Number,
    };
    Some((field.to_string(), kind))
}

fn bad_line_in(file: &Path, wanted: Option<&(String, Kind)>) -> Option<(usize, String)> {
    let reader = std::io::BufReader::new(std::fs::File::open(file).ok()?);
    for (i, line) in reader.split(b'\n').enumerate() {
        let line = line.ok()?;
        let text = match std::str::from_utf8(&line) {
            Ok(t) => t,
            Err(e) => return Some((i + 1, format!("not valid UTF-8 (at byte {})", e.valid_up_to() + 1))),
        };
        if text.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(v) if v.is_object() => {
                if let Some((field, kind)) = wanted
                    && let Some(got) = v.get(field.as_str()).and_then(Kind::of)
                    && got != *kind
                {
                    return Some((
                        i + 1,
                        format!("field '{field}' is {}, where {} was expected", got.name(), kind.name()),
                    ));
                }
            }
            Ok(_) => return Some((i + 1, "not a JSON object".into())),
            Err(e) => return Some((i + 1, format!("not valid JSON: {e}"))),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::first_bad_line;

    #[test]
    fn names_the_file_and_line_of_bad_json_and_bad_utf8() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("a.jsonl");
        std::fs::write(&f, "{\"id\": 1}\n\n{\"id\": 2\n{\"id\": 3}\n").unwrap();
        let (file, line, why) = first_bad_line(&f.display().to_string(), "").unwrap();
        assert_eq!((file, line), (f.clone(), 3));
        assert!(why.starts_with("not valid JSON"), "{why}");
        std::fs::write(&f, b"{\"id\": 1}\n{\"id\": \"\xff\"}\n").unwrap();
        assert_eq!(first_bad_line(&format!("{}/", tmp.path().display()), "").unwrap().1, 2);
        std::fs::write(&f, "{\"id\": 1}\n[1]\n").unwrap();
        assert_eq!(first_bad_line(&f.display().to_string(), "").unwrap().2, "not a JSON object");
        std::fs::write(&f, "{\"id\": 1}\n").unwrap();
        assert!(first_bad_line(&f.display().to_string(), "").is_none());
    }

    /// A value of another type late in a file (Arrow says what, not where) is found by its field.
    #[test]
    fn names_the_line_whose_field_has_another_type() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("a.jsonl");
        let mut lines: Vec<String> = (0..5000).map(|i| format!("{{\"id\": \"{i}\", \"text\": \"t{i}\"}}")).collect();
        lines[4321] = r#"{"id": "4321", "text": 12345}"#.to_string();
        lines[10] = r#"{"id": "10", "text": null}"#.to_string();
        std::fs::write(&f, lines.join("\n")).unwrap();
        let error = "Arrow error: Json error: whilst decoding field 'text': expected string got 12345";
        let (file, line, why) = first_bad_line(&f.display().to_string(), error).unwrap();
        assert_eq!((file, line), (f.clone(), 4322));
        assert_eq!(why, "field 'text' is a number, where a string was expected");
        assert!(first_bad_line(&f.display().to_string(), "").is_none(), "valid JSON, whatever its types");
    }
}
