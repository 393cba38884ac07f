//! The `tensortune` command line.
//!
//! One variant of [`Command`] per subcommand, each carrying the argument struct defined next
//! to its code in `tensortune::cli::<area>` and dispatching to one function there.

use std::io::{self, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tensortune::cli::{self, CliError};

/// mimalloc: lowering and the search allocate many small expression nodes, and glibc's malloc
/// took about half of the search's time (see `benches/search.rs`). Built with `override`, it
/// also serves LLVM's and XGBoost's allocations (see `Cargo.toml`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Search-based schedule tuning for tensor programs.
#[derive(Debug, Parser)]
#[command(name = "tensortune", version, about, propagate_version = true)]
#[command(
    after_help = "Examples:\n  tensortune tune --workload matmul:M=512,N=512,K=512 --trials 64 --db tune.db\n  tensortune records --db tune.db"
)]
struct Cli {
    #[command(flatten)]
    log: LogArgs,
    #[command(subcommand)]
    command: Command,
}

/// What the library's log lines show; given before or after the subcommand.
#[derive(Debug, clap::Args)]
struct LogArgs {
    /// More log lines: -v info, -vv debug, -vvv trace. Without -v or -q, `RUST_LOG` decides
    /// (`env_logger` syntax); unset, warnings and progress are shown.
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Errors only: no warnings and no progress lines (a progress bar on a terminal is
    /// `tune --quiet`).
    #[arg(short = 'q', global = true, conflicts_with = "verbose")]
    log_quiet: bool,
}

/// Installs the logger: warnings as `warning: ...`, progress lines as they are, other levels
/// with their level and module, all on stderr.
fn init_logger(args: &LogArgs) {
    use std::io::Write as _;
    let filter = match (args.log_quiet, args.verbose) {
        (true, _) => Some("error".to_string()),
        (false, 0) => None,
        (false, 1) => Some("info".to_string()),
        (false, 2) => Some("debug".to_string()),
        (false, _) => Some("trace".to_string()),
    };
    let default = format!("warn,{}=info", tensortune::tune::PROGRESS_LOG_TARGET);
    let mut builder = match filter {
        Some(f) => {
            let mut b = env_logger::Builder::new();
            b.parse_filters(&f);
            b
        }
        None => {
            env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default))
        }
    };
    builder.format(|buf, record| match (record.level(), record.target()) {
        (_, tensortune::tune::PROGRESS_LOG_TARGET) => writeln!(buf, "{}", record.args()),
        (log::Level::Error, _) => writeln!(buf, "error: {}", record.args()),
        (log::Level::Warn, _) => writeln!(buf, "warning: {}", record.args()),
        (level, target) => writeln!(
            buf,
            "[{} {target}] {}",
            level.as_str().to_lowercase(),
            record.args()
        ),
    });
    // Only fails if a logger is already installed, which nothing here does.
    let _ = builder.try_init();
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Summarize a records database: trials, errors and best latency per workload and target.
    Records(cli::records::RecordsArgs),
    /// Show the fastest record of a workload.
    Best(cli::records::BestArgs),
    /// Write every record of a database as JSON lines.
    Export(cli::records::ExportArgs),
    /// Add the records of a JSON-lines file to a database.
    Import(cli::records::ImportArgs),
    /// Merge databases into one, without duplicates.
    Merge(cli::records::MergeArgs),
    /// List the op library: each op's keys and input order.
    Workloads(cli::inspect::WorkloadsArgs),
    /// Print the best schedule of a workload as a trace and as its loop nest.
    Show(cli::inspect::ShowArgs),
    /// Draw a workload's tuning curve (best GFLOP/s against trials, a line per run) as SVG.
    Plot(cli::plot::PlotArgs),
    /// Write one self-contained HTML page: workloads table, tuning curves, best loop nests.
    Report(cli::report::ReportArgs),
    /// The learned cost model on a records database: held-out evaluation, training.
    Model(cli::model::ModelArgs),
    /// Tune workloads on the host CPU or an NVIDIA GPU into a records database.
    Tune(cli::tune::TuneArgs),
    /// Write a plan: the tasks of a set of workloads with weights and trials, for
    /// `tune --plan FILE --shard I/N` on many workers.
    Plan(cli::plan::PlanArgs),
    /// Measure this machine's f32 FMA peak, memory bandwidth and parallel-loop overhead.
    Probe(cli::probe::ProbeArgs),
    /// Tune every layer of an ONNX model under one budget into a records database.
    TuneModel(cli::network::TuneModelArgs),
    /// Run an ONNX model with its tuned kernels: outputs, end-to-end and per-layer time.
    RunModel(cli::network::RunModelArgs),
    /// Compile a workload's default schedule, run it, and print latency and GFLOP/s.
    Run(cli::run::RunArgs),
    /// Print the loop IR, LLVM IR or assembly of a workload's default schedule.
    Codegen(cli::codegen::CodegenArgs),
    /// The GPU measurement worker the CUDA backend starts (`tensortune::gpu`): requests on
    /// stdin, replies on stdout. Not for interactive use.
    #[command(hide = true)]
    CudaWorker {
        /// Run programs in the lockstep interpreter instead of on a GPU.
        #[arg(long)]
        simulate: bool,
        /// The CUDA device ordinal.
        #[arg(long, default_value_t = 0)]
        device: u32,
    },
    /// Print a shell completion script for bash, zsh, fish, elvish or powershell.
    #[command(
        after_help = "Examples:\n  tensortune completions bash > ~/.local/share/bash-completion/completions/tensortune\n  tensortune completions zsh > ~/.zfunc/_tensortune\n  tensortune completions fish > ~/.config/fish/completions/tensortune.fish"
    )]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

fn run(command: Command) -> Result<(), CliError> {
    // A mistyped LLVM option would otherwise be found only when the first candidate compiles,
    // and then recorded as that candidate's failure.
    if std::env::var_os("TENSORTUNE_LLVM_ARGS").is_some() {
        tensortune::codegen::llvm::check_llvm_options()
            .map_err(|e| CliError::Usage(e.to_string()))?;
    }
    // The fault plan is a test hook; a malformed one would silently test nothing.
    tensortune::measure::check_fault_plan().map_err(CliError::Usage)?;
    tensortune_records::check_busy_timeout_env().map_err(CliError::Usage)?;
    let stdout = io::stdout();
    let mut out = Tracked {
        inner: stdout.lock(),
        failed: None,
    };
    let result = run_on(command, &mut out);
    // A write to stdout that failed (`> /dev/full`, a full disk) is the environment's
    // failure, whichever command met it: say so, with exit status 2, not as an internal error.
    let flushed = out.flush();
    match (out.failed.take(), result) {
        (Some(e), Err(CliError::Internal(_)) | Ok(())) => {
            Err(CliError::Usage(format!("<stdout>: {e}")))
        }
        (None, Ok(())) => flushed.map_err(|e| CliError::Usage(format!("<stdout>: {e}"))),
        (_, r) => r,
    }
}

/// Standard output that remembers its first write error.
struct Tracked<W: Write> {
    inner: W,
    failed: Option<io::Error>,
}

impl<W: Write> Write for Tracked<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf).inspect_err(|e| self.note(e))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush().inspect_err(|e| self.note(e))
    }
}

impl<W: Write> Tracked<W> {
    fn note(&mut self, e: &io::Error) {
        if self.failed.is_none() {
            self.failed = Some(io::Error::new(e.kind(), e.to_string()));
        }
    }
}

fn run_on(command: Command, out: &mut Tracked<io::StdoutLock<'_>>) -> Result<(), CliError> {
    let mut out = out;
    match command {
        Command::Records(args) => cli::records::records(&args, &mut out),
        Command::Best(args) => cli::records::best(&args, &mut out),
        Command::Export(args) => cli::records::export(&args, &mut out),
        Command::Import(args) => cli::records::import(&args, &mut out, &mut io::stderr()),
        Command::Merge(args) => cli::records::merge(&args, &mut out, &mut io::stderr()),
        Command::Tune(args) => cli::tune::tune(&args, &mut out),
        Command::Plan(args) => cli::plan::plan(&args, &mut out),
        Command::Model(args) => match &args.command {
            cli::model::ModelCommand::Eval(a) => cli::model::eval(a, &mut out),
            cli::model::ModelCommand::Train(a) => cli::model::train(a, &mut out),
        },
        Command::Workloads(args) => cli::inspect::workloads(&args, &mut out),
        Command::Show(args) => cli::inspect::show(&args, &mut out),
        Command::Plot(args) => cli::plot::plot(&args, &mut out),
        Command::Report(args) => cli::report::report(&args, &mut out),
        Command::Run(args) => cli::run::run(&args, &mut out),
        Command::TuneModel(args) => cli::network::tune_model(&args, &mut out),
        Command::RunModel(args) => cli::network::run_model(&args, &mut out),
        Command::Probe(args) => cli::probe::probe(&args, &mut out),
        Command::Codegen(args) => cli::codegen::codegen(&args, &mut out),
        Command::CudaWorker { simulate, device } => {
            // Answered in `main` before this; here only to keep the match exhaustive.
            match tensortune::gpu::worker_main(simulate, device) {
                c if c == ExitCode::SUCCESS => Ok(()),
                _ => Err(CliError::Internal("the GPU worker failed".into())),
            }
        }
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut buf = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "tensortune", &mut buf);
            out.write_all(&buf)
                .map_err(|e| CliError::Internal(e.to_string()))
        }
    }
}

/// `eprintln!` that cannot panic: where stderr cannot be written (a full disk under
/// `2>>log`, a closed descriptor) the message is lost but the exit status still says what
/// happened; `eprintln!` would panic, and the panic's own message would fail the same way.
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(io::stderr(), $($arg)*);
    }};
}

fn main() -> ExitCode {
    // Like other Unix tools, end quietly when the reader of stdout goes away (`| head`).
    // SAFETY: setting a signal disposition to the default before any thread starts.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // A bug must still end as one line and an internal-error status, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let text = info.to_string();
        say!(
            "tensortune: internal error: {}",
            tensortune::schedules::text::single_line(&text)
        );
    }));
    // Usage errors from clap: the error's own line and the hint, exit status 2 (clap's full
    // rendering adds a usage block); help and version print as clap does.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                e.exit();
            }
            let text = e.render().to_string();
            let first = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("error");
            // An invalid value names what would have been accepted on the same line, since the
            // rest of clap's rendering (where it says so) is dropped.
            let valid = match e.get(clap::error::ContextKind::ValidValue) {
                Some(clap::error::ContextValue::Strings(v)) if !v.is_empty() => {
                    format!(" (possible values: {})", v.join(", "))
                }
                _ => String::new(),
            };
            say!("tensortune: {}{valid}", first.trim_start_matches("error: "));
            say!("For more information, try '--help'.");
            return ExitCode::from(2);
        }
    };
    init_logger(&cli.log);
    // The GPU worker speaks its protocol on stdout and reports its own exit status; none of
    // the command line's checks or error printing applies to it.
    if let Command::CudaWorker { simulate, device } = cli.command {
        return tensortune::gpu::worker_main(simulate, device);
    }
    // Rayon starts its pool on first use and panics if it cannot (a small `ulimit -v` or
    // `-u`): start it here, and say so if it cannot start (it is started once or never).
    if let Err(e) = rayon::ThreadPoolBuilder::new().build_global() {
        say!("tensortune: cannot start the worker threads ({e}): raise the process's memory or thread limit");
        return ExitCode::from(2);
    }
    match std::panic::catch_unwind(|| run(cli.command)) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            let _ = io::stdout().flush();
            // One line whatever the message quotes (a key or spec with a line break in it).
            let text = e.to_string();
            say!(
                "tensortune: {}",
                tensortune::schedules::text::single_line(&text)
            );
            ExitCode::from(e.exit_code())
        }
        Err(_) => ExitCode::from(1),
    }
}
