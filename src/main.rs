//! The `shim-agent` command line: a thin shell over the library.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use shim_agent::hostroot::HostRoot;
use shim_agent::{api, artifact, cmd_containerd, install, settings};

/// shim-agent installs containerd shims on this node and registers their runtime handlers.
///
/// As a daemon it watches `Shim` objects in the cluster; image builders use `install --root`
/// to pre-bake shims into an image; node owners use `status` and the `containerd` tools.
#[derive(Parser, Debug)]
#[command(name = "shim-agent", version, about, long_about)]
struct Cli {
    /// Agent configuration file (drop-ins are read from config.d/ beside it). Give it before
    /// the command: `shim-agent --config FILE status` (`containerd ... --config` names
    /// containerd's file).
    #[arg(long, value_name = "PATH", env = "SHIM_AGENT_CONFIG")]
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
    /// Install the Shims of a YAML file into an image root (offline; no restart, no cluster).
    ///
    /// Fetches and verifies the artifact, places the shim under
    /// /opt/shim-agent/shims/<name>/<sha256>/, registers the handler in the image's
    /// containerd config and records it as pending-verification: the agent verifies and
    /// adopts it on the node's first boot. On any error the root is left as it was.
    Install(InstallArgs),
    /// Undo an install: remove the handler (restoring the config bytes), the binary and the record.
    Uninstall(UninstallArgs),
    /// List the shims installed on this node (or in an image root).
    Status(StatusArgs),
    /// Inspect or edit containerd's config directly (no restart, no state).
    #[command(subcommand)]
    Containerd(cmd_containerd::ContainerdCmd),
}

#[derive(Args, Debug)]
struct RootArg {
    /// Image root to work in (a mounted node image); every path is taken under it.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct InstallArgs {
    #[command(flatten)]
    root: RootArg,
    /// YAML file with one or more Shim objects.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    file: PathBuf,
    /// Platform of the image, as os/arch (default: this machine's, e.g. linux/amd64).
    #[arg(long, value_name = "OS/ARCH")]
    platform: Option<String>,
}

#[derive(Args, Debug)]
struct UninstallArgs {
    #[command(flatten)]
    root: RootArg,
    /// Name of the Shim (metadata.name).
    name: String,
}

#[derive(Args, Debug)]
struct StatusArgs {
    #[command(flatten)]
    root: RootArg,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
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

fn host_root(arg: &RootArg) -> anyhow::Result<HostRoot> {
    match &arg.root {
        Some(dir) => HostRoot::new(dir).with_context(|| format!("--root {}", dir.display())),
        None => Ok(HostRoot::system()),
    }
}

fn live_node_not_yet(root: &HostRoot, what: &str) -> anyhow::Result<()> {
    if root.is_system() {
        anyhow::bail!(
            "`{what}` on a live node (restart containerd, verify, roll back) is not available in this build; use --root DIR for an image root"
        );
    }
    Ok(())
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let (config_path, explicit) = match &cli.config {
        Some(p) => (p.clone(), true),
        None => (PathBuf::from(settings::DEFAULT_CONFIG_PATH), false),
    };
    let settings = settings::load(&config_path, explicit)?;
    init_logging(cli.log_level.as_deref().unwrap_or(&settings.log.level));
    match cli.command {
        Command::Crd => print!("{}", api::manifests::crd_yaml()?),
        Command::Manifests => print!("{}", api::manifests::manifests_yaml()?),
        Command::Containerd(cmd) => cmd_containerd::run(cmd, &HostRoot::system())?,
        Command::Install(args) => {
            let root = host_root(&args.root)?;
            live_node_not_yet(&root, "install")?;
            let text = std::fs::read_to_string(&args.file)
                .with_context(|| format!("cannot read {}", args.file.display()))?;
            let shims = api::load::parse_shims(&text, &args.file.display().to_string())?;
            let platform = match &args.platform {
                Some(p) => {
                    let (os, arch) = p.split_once('/').with_context(|| {
                        format!("--platform {p:?}: expected os/arch, e.g. linux/arm64")
                    })?;
                    artifact::Platform::new(os, arch)
                }
                None => artifact::node_platform(),
            };
            let opts = install::InstallOptions {
                platform,
                progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            for shim in &shims {
                match rt
                    .block_on(install::install_offline(&root, &settings, shim, &opts))
                    .with_context(|| {
                        format!(
                            "install of Shim {:?} failed; {} is unchanged",
                            shim.name(),
                            root.path().display()
                        )
                    })? {
                    install::InstallOutcome::Installed {
                        binary,
                        config_files,
                        upgraded,
                    } => println!(
                        "{} {}: handler {} -> {}; config {}; pending verification on first boot",
                        if upgraded { "upgraded" } else { "installed" },
                        shim.name(),
                        shim.handler(),
                        binary,
                        config_files.join(", ")
                    ),
                    install::InstallOutcome::Unchanged => {
                        println!("{}: already installed, nothing to do", shim.name())
                    }
                }
            }
        }
        Command::Uninstall(args) => {
            let root = host_root(&args.root)?;
            live_node_not_yet(&root, "uninstall")?;
            let out = install::uninstall_offline(&root, &settings, &args.name)?;
            println!("uninstalled {}", args.name);
            for f in out.restored {
                println!("  {f}: restored to its bytes from before the install");
            }
            for f in out.changed_since {
                println!(
                    "  {f}: changed by someone else since the install; only the handler was removed"
                );
            }
        }
        Command::Status(args) => {
            let root = host_root(&args.root)?;
            let state = install::read_state(&root, &settings)?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&state)?);
            } else {
                print!("{}", install::format_status_table(&state));
            }
        }
    }
    Ok(())
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}
