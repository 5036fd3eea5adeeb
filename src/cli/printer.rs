//! Everything the command prints goes through a [`Printer`]: results and reports on standard output, warnings and
//! errors on standard error, and `pipeline run`'s notes on either, as its `--format` says. The one file of the
//! command, with the binary's `main`, where printing is allowed (the workspace's clippy lints).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::fmt::Arguments;

/// A line on standard output: `out!(printer, "…", args)`.
macro_rules! out {
    ($printer:expr, $($arg:tt)*) => { $printer.out(format_args!($($arg)*)) };
}

/// Text on standard output as it is, without a line end added: `out_text!(printer, "…", args)`.
macro_rules! out_text {
    ($printer:expr, $($arg:tt)*) => { $printer.out_text(format_args!($($arg)*)) };
}

/// A line on standard error: `err!(printer, "…", args)`.
macro_rules! err {
    ($printer:expr, $($arg:tt)*) => { $printer.err(format_args!($($arg)*)) };
}

/// A note of `pipeline run` (a write's line, the summary): `note!(printer, "…", args)`. See [`Printer::note`].
macro_rules! note {
    ($printer:expr, $($arg:tt)*) => { $printer.note(format_args!($($arg)*)) };
}

pub(crate) use {err, note, out, out_text};

/// Where the command's text goes. A small value, handed to each command and copied freely.
#[derive(Debug, Clone, Copy, Default)]
pub struct Printer {
    /// `--quiet`: results, warnings and errors only; no progress, notes or summaries (each command asks
    /// [`Printer::quiet`] before saying them).
    quiet: bool,
    /// Notes on standard error: under a machine-read `--format`, which keeps standard output for results.
    notes_to_stderr: bool,
}

impl Printer {
    pub fn new(quiet: bool) -> Self {
        Self { quiet, notes_to_stderr: false }
    }

    /// This printer with its notes on standard error (`on`) or standard output.
    pub fn notes_on_stderr(self, on: bool) -> Self {
        Self { notes_to_stderr: on, ..self }
    }

    /// Whether `--quiet` was given.
    pub fn quiet(&self) -> bool {
        self.quiet
    }

    /// A line on standard output. A closed standard output ends the program quietly (the binary's panic hook).
    pub fn out(&self, args: Arguments) {
        println!("{args}");
    }

    /// Text on standard output, its line ends its own.
    pub fn out_text(&self, args: Arguments) {
        print!("{args}");
    }

    /// A line on standard error.
    pub fn err(&self, args: Arguments) {
        eprintln!("{args}");
    }

    /// A note line: on standard output under `--format table`, on standard error under the machine-read formats.
    pub fn note(&self, args: Arguments) {
        if self.notes_to_stderr { self.err(args) } else { self.out(args) }
    }

    /// `error: …`, the error and its causes in plain words, as the command ends with it.
    pub fn error(&self, e: &anyhow::Error) {
        eprintln!("error: {}", embedding_pipeline::error::chain_text(e.as_ref()));
    }

    /// Standard output for a writer of results (`pipeline run`'s query results).
    pub fn stdout(&self) -> ClosedPipeExit<std::io::Stdout> {
        ClosedPipeExit(std::io::stdout())
    }
}

/// Standard output that ends the program when its reader has gone (`pipeline run … | head`), as `cat` or
/// `grep` end, with the exit code a shell reports for SIGPIPE (141), instead of failing the statement: for
/// writers that return the error (`println!` panics instead, which the binary's panic hook turns into the same
/// exit). A write into Lance stopped this way keeps its commits, as after any kill.
/// NOTE: SIGPIPE itself stays ignored (Rust's default): restoring its default action would also end the
/// program on a reset object-store connection.
pub struct ClosedPipeExit<W>(pub W);

impl ClosedPipeExit<()> {
    /// End the program if `e` says the reader has gone.
    pub fn check(e: &std::io::Error) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Self::exit();
        }
    }

    /// End the program as a reader's leaving ends it, with the code a shell gives SIGPIPE.
    pub fn exit() -> ! {
        // SAFETY: _exit ends the process at once; nothing after it runs. Not exit: its handlers would tear
        // down ONNX Runtime under a running call.
        unsafe { libc::_exit(141) }
    }
}

impl<W: std::io::Write> std::io::Write for ClosedPipeExit<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf).inspect_err(ClosedPipeExit::check)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush().inspect_err(ClosedPipeExit::check)
    }
}
