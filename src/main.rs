//! The `shim-agent` command line: a thin shell over the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use shim_agent::settings;

/// shim-agent installs containerd shims on this node and registers their runtime handlers.
///
/// As a daemon it watches `Shim` objects in the cluster; image builders use `install --root`
/// to pre-bake shims into an image; node owners use `status` and the `containerd` tools.
#[derive(Parser, Debug)]
#[command(name = "shim-agent", version, about, long_about)]
struct Cli {
    /// Agent configuration file (drop-ins are read from config.d/ beside it).
    #[arg(long, global = true, value_name = "PATH", env = "SHIM_AGENT_CONFIG")]
    config: Option<PathBuf>,

    /// Log level or tracing filter (overrides the config's log.level), e.g. debug.
    #[arg(long, global = true, value_name = "LEVEL")]
    log_level: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the Shim CustomResourceDefinition as YAML (kubectl apply -f -).
    Crd,
    /// Print everything a cluster needs: the CRD, the shim-agent-system namespace and RBAC.
    Manifests,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let (config_path, explicit) = match &cli.config {
        Some(p) => (p.clone(), true),
        None => (PathBuf::from(settings::DEFAULT_CONFIG_PATH), false),
    };
    let settings = settings::load(&config_path, explicit)?;
    init_logging(cli.log_level.as_deref().unwrap_or(&settings.log.level));
    match cli.command {
        Command::Crd => print!("{}", shim_agent::api::manifests::crd_yaml()?),
        Command::Manifests => print!("{}", shim_agent::api::manifests::manifests_yaml()?),
    }
    Ok(())
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
