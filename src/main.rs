//! The `pipeline` command: its arguments, dispatch and printing ([`cli`]) over the `embedding_pipeline` library.

use std::process::ExitCode;

mod cli;

use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// mimalloc, not the system allocator: the tokenizer allocates a few small strings and vectors per word, and on the
/// write path malloc and free took about a fifth of the time (`perf record`, issue 52). With it a run on 2 cores was
/// about 17% faster. Its options as the binary sets them: [`hand_freed_memory_back`].
/// docs/concepts/ordering-and-batches.md, *Feeding the model*.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `purge_delay` option (`mi_option_purge_delay` in its C header; the Rust bindings name no constant for
/// it). `mimalloc_options_are_where_the_binary_sets_them` checks the number against the bundled mimalloc.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Milliseconds before mimalloc hands freed pages back to the system; its own default is 1,000.
const PURGE_DELAY_MS: std::ffi::c_long = 10;

fn main() -> ExitCode {
    limit_malloc_arenas();
    hand_freed_memory_back();
    leave_centroids_out_of_index_statistics();
    end_quietly_on_a_closed_stdout();
    let (cli, inputs) = cli::parse();
    // -v / -q first, then RUST_LOG, then warnings only.
    let filter = match cli.log_filter() {
        Some(level) => tracing_subscriber::EnvFilter::new(level),
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| embedding_pipeline::QUIET_LOGS.into()),
    };
    let printed = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .with_filter(filter);
    let logs = tracing_subscriber::registry().with(printed);
    #[cfg(feature = "cluster")]
    let logs = logs.with(embedding_pipeline::cluster::executor_id_layer());
    logs.init();
    let printer = cli::printer::Printer::new(cli.quiet);
    match cli::run(cli, inputs, printer) {
        Ok(status) => status.into(),
        Err(e) => cli::ExitStatus::Failure.with_error(printer, e).into(),
    }
}

/// One malloc arena per two cores (at least two), unless MALLOC_ARENA_MAX says otherwise. glibc gives
/// threads that allocate arenas of their own (up to eight per core), and the pipeline's many threads
/// (tokio's blocking pool, the tokenizer's) left freed memory scattered over them, so peak RSS grew with
/// the corpus although nothing accumulates: on 2 cores, 733 MiB at 5,000 documents against 643 at 1,000;
/// with two arenas, 497 and 520. (Not measured on larger machines, hence the scaling with cores.)
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets an allocator parameter; it is called before any other thread exists.
        unsafe {
            let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
            libc::mallopt(libc::M_ARENA_MAX, (cores / 2).max(2) as i32);
        }
    }
}

/// Freed memory back to the system within 10 ms, in small pages, unless MIMALLOC_PURGE_DELAY or
/// MIMALLOC_ALLOW_THP say otherwise. A run frees some 4 GB a second (the tokenizer's small strings, each call's
/// columns) and holds under 200 MiB live, but mimalloc kept freed pages for a second and asked for transparent huge
/// pages on its arenas, which the kernel fills to 2 MiB and pieces together again after each purge: resident memory
/// rose to three or four times the live heap and jumped by 300 MiB at random through a run. Without both, on 2
/// cores (near-free model, alternated runs): peak RSS 815 / 834 MiB → 526 / 521 at 1,000,000 documents, 734 / 677 /
/// 726 → 486 / 464 / 491 at 100,000, wall time within the runs' spread. docs/concepts/ordering-and-batches.md,
/// *Feeding the model*.
fn hand_freed_memory_back() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: PR_SET_THP_DISABLE sets a flag on this process and reads no memory.
        unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    }
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one of mimalloc's options; it reads options atomically.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
}

/// Lance 14 reads every IVF centroid into an index's statistics, which `index` and `inspect` ask for and use none
/// of, and warns once per process that this default will change: a warning users cannot act on, on every later
/// `inspect`. Its documented setting leaves them out and silences it, unless the user has set it.
fn leave_centroids_out_of_index_statistics() {
    const SETTING: &str = "LANCE_INCLUDE_VECTOR_CENTROIDS";
    if std::env::var_os(SETTING).is_none() {
        // SAFETY: called first in main, before any other thread exists.
        unsafe { std::env::set_var(SETTING, "false") };
    }
}

/// Every command's output into a reader that has gone (`pipeline inspect … | head -3`) ends the program as
/// `cat` ends, with the code a shell gives SIGPIPE (141), instead of the panic `println!` raises on a closed
/// stdout. SIGPIPE itself stays ignored, as Rust leaves it: its default action would also end a run on a reset
/// object-store connection. (`pipeline run`'s results go through `cli::printer::ClosedPipeExit`, which sees the error.)
fn end_quietly_on_a_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload.downcast_ref::<String>().map(String::as_str);
        let message = message.or_else(|| payload.downcast_ref::<&str>().copied()).unwrap_or_default();
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            cli::printer::ClosedPipeExit::exit();
        }
        default(info);
    }));
}

#[cfg(test)]
mod tests {
    /// The option number the binary sets is the bundled mimalloc's `purge_delay`: its default reads 1,000 ms
    /// (mimalloc 3's; an option renumbered by an update would read otherwise), and it takes the binary's value.
    #[test]
    fn mimalloc_options_are_where_the_binary_sets_them() {
        // SAFETY: reads and sets one of mimalloc's options.
        unsafe {
            if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
                assert_eq!(libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY), 1000);
            }
            super::hand_freed_memory_back();
            if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
                assert_eq!(libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY), super::PURGE_DELAY_MS);
            }
        }
    }
}
