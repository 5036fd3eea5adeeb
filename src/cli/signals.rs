//! ctrl-C and SIGTERM: the first asks the running command to stop as it can (a write commits what it has), a
//! second exits at once; at `pipeline sql`'s prompt, where nothing runs, a SIGTERM ends the shell.

use embedding_pipeline::process::interrupt::StopToken;

use super::printer::{Printer, err};

/// Whether `pipeline sql` waits at its prompt, where a SIGTERM ends it at once (nothing is running, and its
/// history is saved).
static AT_PROMPT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn at_prompt(on: bool) {
    AT_PROMPT.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The terminal's settings before the line editor changed them, restored when a SIGTERM ends the shell at its
/// prompt (the editor cannot: it is waiting for a key).
static TERMINAL: std::sync::OnceLock<libc::termios> = std::sync::OnceLock::new();

pub fn remember_terminal() {
    // SAFETY: a zeroed termios is a valid value to pass; tcgetattr fills it for standard input.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    if unsafe { libc::tcgetattr(0, &mut t) } == 0 {
        let _ = TERMINAL.set(t);
    }
}

/// What the first ctrl-C says it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSays {
    /// A write: it commits the rows already embedded, then stops.
    Committing,
    /// A command that writes nothing on the way (`pipeline verify`): it stops and saves nothing.
    NothingToCommit,
}

/// A second signal this soon after the first is the same stop delivered twice.
const SAME_STOP: std::time::Duration = std::time::Duration::from_secs(1);

/// First ctrl-C or SIGTERM: ask the work `stop` travels with (the command's session) to commit what it has and stop.
/// Second, a second or more after the first: exit at once. A SIGTERM at `pipeline sql`'s prompt, where nothing
/// runs, exits at once.
///
/// The signals are watched on a thread of their own, so that a second one is answered even while the
/// main runtime is busy or shutting down. Returns once they are watched (or that failed and was said), so that
/// a signal sent after anything the command prints is never met by the default action.
pub fn stop_on_signals(says: StopSays, printer: Printer, stop: StopToken) {
    let (ready, watching) = std::sync::mpsc::channel::<()>();
    let watcher = move || -> std::io::Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            let (mut int, mut term) = (signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?);
            let _ = ready.send(());
            // When the stop now asked for was first asked: a second signal within SAME_STOP of it is the same stop
            // delivered twice (`timeout -s INT` signals the process and its group), not a second ctrl-C.
            let mut asked: Option<std::time::Instant> = None;
            // NOTE: a `for` over an endless range, not `loop`, so that the block's `Ok(())` still types it.
            for _ in 0u64.. {
                let terminated = tokio::select! {
                    _ = int.recv() => false,
                    _ = term.recv() => true,
                };
                if terminated && AT_PROMPT.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Some(t) = TERMINAL.get() {
                        // SAFETY: settings tcgetattr gave, back onto standard input.
                        unsafe { libc::tcsetattr(0, libc::TCSANOW, t) };
                    }
                    err!(printer, "\nterminated at the prompt");
                    // SAFETY: _exit ends the process; nothing after it runs. 143: 128 + SIGTERM, as a shell says.
                    unsafe { libc::_exit(143) }
                }
                // The first since the last stop was honoured (pipeline sql clears it after each statement).
                if !stop.requested() {
                    match says {
                        StopSays::Committing => err!(
                            printer,
                            "stopping: committing the rows already embedded (press ctrl-C again to exit at once)"
                        ),
                        StopSays::NothingToCommit => err!(printer, "stopping (press ctrl-C again to exit at once)"),
                    }
                    stop.request();
                    asked = Some(std::time::Instant::now());
                } else if asked.is_some_and(|t| t.elapsed() < SAME_STOP) {
                    continue;
                } else {
                    match says {
                        StopSays::Committing => err!(
                            printer,
                            "exiting at once; rows since the last commit are lost and will be embedded on the next run"
                        ),
                        StopSays::NothingToCommit => err!(printer, "exiting at once"),
                    }
                    // NOTE: _exit, not exit: exit's handlers would tear down ONNX Runtime under a running call.
                    // SAFETY: _exit ends the process; nothing after it runs.
                    unsafe { libc::_exit(130) }
                }
            }
            Ok(())
        })
    };
    let spawned = std::thread::Builder::new().name("signals".into()).spawn(move || {
        if let Err(e) = watcher() {
            err!(printer, "warning: cannot watch for ctrl-C ({e}); ctrl-C will stop the command at once");
        }
    });
    if spawned.is_ok() {
        // Err: the watcher failed and said so (its sender dropped).
        let _ = watching.recv_timeout(std::time::Duration::from_secs(5));
    }
}
