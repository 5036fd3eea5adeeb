//! `pipeline sql [FILE]…`: an interactive SQL shell over a campaign's session, as datafusion-cli's, with line
//! editing and a history kept in the install home. A statement runs when a line ends it with `;`; its result
//! prints as `pipeline run` prints it, and an error is shown without leaving the shell. ctrl-C at the prompt
//! clears the statement being typed; during a write it commits what is embedded and stops the statement;
//! ctrl-D or `\q` leaves. The history is saved as each statement is entered, so a SIGTERM at the prompt (which
//! ends the shell at once, exit code 143) or a kill loses none of it. When standard input is not a terminal,
//! its statements run in order and the first error ends the shell with a non-zero exit.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;

use anyhow::anyhow;
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

use super::ExitStatus;
use super::args::{JobArgs, Output, Runtime};
use super::job_input::{Input, JobStatement};
use super::printer::{Printer, err, out};
use super::run::{CommandSettings, JobDisplay, job};
use super::signals::{StopSays, at_prompt, remember_terminal, stop_on_signals};
use embedding_pipeline::ops::run::{job_session, run_labelled};
use embedding_pipeline::ops::script::{ends_statement, split_statements};
use embedding_pipeline::process::interrupt::StopToken;
use embedding_pipeline::session::EmbedSession;

const PROMPT: &str = "pipeline> ";
const MORE: &str = "       -> ";

/// `pipeline sql`'s arguments.
#[derive(Debug, clap::Args)]
pub struct SqlArgs {
    /// Job files to run first (e.g. the CREATE statements of a campaign).
    #[arg(value_name = "FILE")]
    files: Vec<PathBuf>,
    #[command(flatten)]
    settings: JobArgs,
    #[command(flatten)]
    output: Output,
    #[command(flatten)]
    runtime: Runtime,
}

/// Run the job files' statements, then read statements from the terminal (or standard input) until the end.
pub async fn run(args: SqlArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    let SqlArgs { files, settings, output, runtime } = args;
    runtime.apply();
    let inputs: Vec<_> = files.into_iter().map(Input::from_arg).collect();
    let stop = StopToken::new();
    let (setup, settings) =
        job(&inputs, settings, output, false, embedding_pipeline::ops::WorkPlanChoice::Beside, stop.clone(), printer)?;
    // ctrl-C during any write (the set-up's too) commits what is embedded and stops that statement.
    stop_on_signals(StopSays::Committing, printer, stop);
    let session = job_session(&settings.job).await?;
    let mut json_sources = Vec::new();
    for s in &setup {
        run_labelled(&session, s, &settings.job.plans, &mut json_sources, &JobDisplay::new(&settings)).await?;
    }
    if !std::io::stdin().is_terminal() {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        for stmt in split_statements(&text).map_err(|e| anyhow!("<stdin>: {e}"))? {
            let s = JobStatement { source: "<stdin>".into(), stmt };
            run_labelled(&session, &s, &settings.job.plans, &mut json_sources, &JobDisplay::new(&settings)).await?;
        }
        return Ok(ExitStatus::Success);
    }
    interactive(&session, &settings, &mut json_sources).await?;
    Ok(ExitStatus::Success)
}

async fn interactive(
    session: &EmbedSession,
    settings: &CommandSettings,
    json_sources: &mut Vec<String>,
) -> anyhow::Result<()> {
    remember_terminal();
    let mut editor = DefaultEditor::new()?;
    let history = history_file();
    if let Some(file) = &history {
        let _ = editor.load_history(file);
        if let Some(dir) = file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
    }
    let printer = settings.printer;
    if !printer.quiet() {
        out!(printer, "pipeline sql: statements end with `;`, \\q or ctrl-D leaves");
    }
    let mut buffer = String::new();
    loop {
        at_prompt(true);
        let read = editor.readline(if buffer.is_empty() { PROMPT } else { MORE });
        at_prompt(false);
        let line = match read {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => {
                buffer.clear();
                continue;
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        if buffer.is_empty() && matches!(line.trim(), "\\q" | "quit" | "exit") {
            break;
        }
        if buffer.is_empty() && line.trim().is_empty() {
            continue;
        }
        buffer.push_str(&line);
        buffer.push('\n');
        if !ends_statement(&buffer) {
            continue;
        }
        let _ = editor.add_history_entry(buffer.trim_end());
        if let Some(file) = &history {
            let _ = editor.save_history(file);
        }
        let text = std::mem::take(&mut buffer);
        match split_statements(&text) {
            Err(e) => err!(printer, "error: {e}"),
            Ok(statements) => {
                for stmt in statements {
                    let s = JobStatement { source: String::new(), stmt };
                    // A ctrl-C that came after the last statement ended is not for this one.
                    session.stop().clear();
                    let result =
                        run_labelled(session, &s, &settings.job.plans, json_sources, &JobDisplay::new(settings)).await;
                    let stopped = session.stop().requested();
                    session.stop().clear();
                    if let Err(e) = result {
                        err!(printer, "error: {}", e.chain_text());
                        break;
                    }
                    if stopped {
                        break;
                    }
                }
            }
        }
    }
    Ok(())
}

/// `sql_history` in the install home (`$EMBED_PIPELINE_HOME`, by default `~/.local/share/embedding-pipeline`).
fn history_file() -> Option<PathBuf> {
    embedding_pipeline::model::runtime::install_home().map(|home| home.join("sql_history"))
}
