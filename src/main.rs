//! The `shim-agent` command line: a thin shell over the library.

#![deny(clippy::string_slice)]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, CommandFactory, Parser, Subcommand};
use shim_agent::cli::{self, image};
use shim_agent::hostroot::HostRoot;
use shim_agent::settings::Settings;
use shim_agent::state::Origin;
use shim_agent::txn::Change;
use shim_agent::txn::real::live_node;
use shim_agent::{api, artifact, cluster, service, settings};

/// shim-agent installs containerd shims on this node and registers their runtime handlers.
///
/// As a daemon it watches `Shim` objects in the cluster; image builders use `install --root`
/// to pre-bake shims into an image; node owners use `status` and the `containerd` tools.
#[derive(Parser, Debug)]
#[command(name = "shim-agent", version, about, long_about)]
struct Cli {
    /// Agent configuration file (drop-ins are read from config.d/ beside it). Give it before
    /// the command: `shim-agent --config FILE status` (`containerd ... --config` names
    /// containerd's file). Default: /etc/shim-agent/config.toml; with `install`, `uninstall`,
    /// `status` or `doctor` on an image root (`--root DIR`), the image's own (the config its
    /// node will run with, whose `[signatures]` policy binds offline installs too).
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
    /// Keep this node matching the static Shims in /etc/shim-agent/shims.d/*.yaml (re-read on
    /// change), repair drift, adopt offline installs. Runs until SIGTERM.
    Run(RunArgs),
    /// Run the coordinator only, with a coordinator identity (group
    /// containerd.x-k8s.io:coordinators): the election, then the finalizers, RuntimeClasses,
    /// Shim status and rollout slots of every Shim, until SIGTERM. Use it where node agents get
    /// no coordinator credentials (e.g. a Deployment with the shim-agent-coordinator
    /// ServiceAccount, in-cluster).
    Coordinate(CoordinateArgs),
    /// Check what installs on this node need (or in an image root, with --root) and say what
    /// to do about each thing that does not hold: containerd's unit, version, config and
    /// registry hosts; its CRI socket and sandbox image; the kubeconfig, the identity it gives
    /// and the API server's clock; free space; proxies. Changes nothing. Exits 1 when something
    /// blocks installs.
    Doctor(DoctorArgs),
    /// Inspect or edit containerd's config directly (no restart, no state).
    #[command(subcommand)]
    Containerd(cli::containerd::ContainerdCmd),
    /// Write the man pages and shell completions (for the packages; see src/cli/docs.rs).
    #[command(hide = true)]
    GenerateDocs {
        #[arg(long, value_name = "DIR")]
        out_dir: PathBuf,
    },
    /// Write the reference pages of the documentation (docs/reference/*.md, committed;
    /// scripts/reference-docs; see src/cli/reference/).
    #[command(hide = true)]
    GenerateReference {
        #[arg(long, value_name = "DIR")]
        out_dir: PathBuf,
    },
}

/// The command line's definition: what `--help`, the man pages and docs/reference/cli.md
/// describe (tests/pure/reference_docs.rs compiles this file to get it).
pub fn command() -> clap::Command {
    Cli::command()
}

#[derive(Args, Debug)]
struct RootArg {
    /// Image root to work in (a mounted node image); every path is taken under it.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// With --root: the root is a live node's (a container's): restart its containerd over
    /// D-Bus (DBUS_SYSTEM_BUS_ADDRESS) and verify through CRI (CONTAINERD_ADDRESS, else the
    /// profile's socket under the root).
    #[arg(long, requires = "root")]
    live: bool,
}

#[derive(Args, Debug)]
struct CoordinateArgs {
    /// The coordinator identity's kubeconfig (default: in-cluster).
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Name in the coordinator election (default: node.name, else the host name).
    #[arg(long, value_name = "NAME")]
    identity: Option<String>,
    /// Serve `/metrics`, `/healthz` and `/readyz` on this TCP address, e.g. `0.0.0.0:8080`
    /// (default: the config file's `metrics.address`; none when empty).
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    root: RootArg,
}

#[derive(Args, Debug)]
struct InstallArgs {
    #[command(flatten)]
    root: RootArg,
    /// YAML file with one or more Shim objects (`-` reads standard input).
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    file: PathBuf,
    /// Platform of the image, as os/arch (default: this machine's, e.g. linux/amd64).
    #[arg(long, value_name = "OS/ARCH")]
    platform: Option<String>,
    /// With --root: the containerd version the image runs (`1.7.27`, `v2.3.4`), which picks a
    /// Shim's build for its containerd release (`platforms[].containerd`); default: asked of
    /// the image's own containerd (`containerd --version`, run inside it).
    #[arg(
        long,
        value_name = "VERSION",
        requires = "root",
        conflicts_with = "live"
    )]
    containerd_version: Option<String>,
    /// With --root: print what the install would do to the image (would install, would
    /// upgrade, would repair, or nothing to do) and change nothing; nothing is fetched.
    #[arg(long, requires = "root", conflicts_with = "live")]
    dry_run: bool,
}

#[derive(Args, Debug)]
struct UninstallArgs {
    #[command(flatten)]
    root: RootArg,
    /// Name of the Shim (metadata.name).
    name: String,
}

#[derive(Args, Debug)]
struct DoctorArgs {
    /// Image root to check (a mounted node image): only its files are read.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
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
    // With the `failpoints` feature, FAILPOINTS="txn::applied=panic;..." arms failpoints
    // (tests kill the agent there); without it this is a no-op.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The agent's config for this command, and whether `--config` named it: that file; else, for
/// a command on an image root, the image's own `/etc/shim-agent/config.toml` (resolved inside
/// the root): the node that boots the image runs with it, and a node policy baked into it (the
/// signatures it requires) must bind `install --root` as it binds the running agent; else the
/// host's.
fn config_path(cli: &Cli) -> anyhow::Result<(PathBuf, bool)> {
    if let Some(p) = &cli.config {
        return Ok((p.clone(), true));
    }
    let image = match &cli.command {
        Command::Install(a) => a.root.root.as_ref(),
        Command::Uninstall(a) => a.root.root.as_ref(),
        Command::Status(a) => a.root.root.as_ref(),
        Command::Doctor(a) => a.root.as_ref(),
        _ => None,
    };
    let Some(dir) = image else {
        return Ok((PathBuf::from(settings::DEFAULT_CONFIG_PATH), false));
    };
    let path = HostRoot::new(dir)
        .and_then(|root| root.resolve(settings::DEFAULT_CONFIG_PATH))
        .with_context(|| {
            format!(
                "--root {}: cannot resolve {} in it",
                dir.display(),
                settings::DEFAULT_CONFIG_PATH
            )
        })?;
    Ok((path, false))
}

fn host_root(arg: &RootArg) -> anyhow::Result<HostRoot> {
    match &arg.root {
        Some(dir) => HostRoot::new(dir).with_context(|| format!("--root {}", dir.display())),
        None => Ok(HostRoot::system()),
    }
}

fn is_live(arg: &RootArg) -> bool {
    arg.root.is_none() || arg.live
}

fn print_report(r: &shim_agent::txn::Report) {
    for n in &r.installed {
        println!("installed {n}: containerd serves its handler");
    }
    for n in &r.removed {
        println!("uninstalled {n}");
    }
    for n in &r.unchanged {
        println!("{n}: nothing to do");
    }
    let phases: Vec<String> = r
        .phases
        .iter()
        .map(|(p, d)| format!("{p:?} {:.0} ms", d.as_secs_f64() * 1000.0))
        .collect();
    if !phases.is_empty() {
        println!("phases: {}", phases.join(", "));
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Command::GenerateDocs { out_dir } = &cli.command {
        // From the CLI alone, before any config is read: package builds run it.
        cli::docs::generate(command(), out_dir)?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::GenerateReference { out_dir } = &cli.command {
        for path in cli::reference::generate(command(), out_dir)? {
            println!("{}", path.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let (config_path, explicit) = config_path(&cli)?;
    let settings = settings::load(&config_path, explicit)?;
    let level = cli.log_level.clone().unwrap_or(settings.log.level.clone());
    let command = match cli.command {
        Command::Run(args) => {
            let root = host_root(&args.root)?;
            let node = cluster::connect::node_name(&settings).ok();
            let log = service::logging::init(&level, node.as_deref());
            let source = service::ConfigSource {
                path: config_path,
                explicit,
                log_level: cli.log_level,
            };
            return service::run(root, source, settings, log).map(|()| ExitCode::SUCCESS);
        }
        other => other,
    };
    service::logging::init(&level, None);
    match command {
        Command::Crd => print!("{}", api::manifests::crd_yaml()?),
        Command::Manifests => print!("{}", api::manifests::manifests_yaml()?),
        Command::Containerd(cmd) => cli::containerd::run(cmd, &HostRoot::system())?,
        Command::GenerateDocs { .. } | Command::GenerateReference { .. } => {} // done above
        Command::Install(args) => cmd_install(&settings, args)?,
        Command::Uninstall(args) => cmd_uninstall(&settings, args)?,
        Command::Coordinate(args) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?
            .block_on(cli::coordinate::run(
                &settings,
                args.kubeconfig,
                args.identity,
                args.listen,
            ))?,
        // (run returned above)
        Command::Run(_) => {}
        Command::Doctor(args) => {
            let root = match &args.root {
                Some(dir) => {
                    HostRoot::new(dir).with_context(|| format!("--root {}", dir.display()))?
                }
                None => HostRoot::system(),
            };
            let facts = runtime()?.block_on(shim_agent::doctor::gather::gather(&root, &settings));
            let report = shim_agent::doctor::Report::new(&facts);
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.to_text());
            }
            if report.blocking {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Status(args) => {
            let root = host_root(&args.root)?;
            let state = cli::status::read_state(&root, &settings)?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&state)?);
            } else {
                print!("{}", cli::status::format_status_table(&state));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn cmd_install(settings: &Settings, args: InstallArgs) -> anyhow::Result<()> {
    let root = host_root(&args.root)?;
    let (text, source) = if args.file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("cannot read the Shims from standard input")?;
        (text, "<stdin>".to_string())
    } else {
        let text = std::fs::read_to_string(&args.file)
            .with_context(|| format!("cannot read {}", args.file.display()))?;
        (text, args.file.display().to_string())
    };
    let shims = api::load::parse_shims(&text, &source)?;
    if args.dry_run {
        print_install_plan(&image::plan_offline(&root, settings, &shims)?);
        return Ok(());
    }
    let platform = match &args.platform {
        Some(p) => {
            let (os, arch) = p
                .split_once('/')
                .with_context(|| format!("--platform {p:?}: expected os/arch, e.g. linux/arm64"))?;
            artifact::Platform::new(os, arch)
        }
        None => artifact::node_platform(),
    };
    let rt = runtime()?;
    if is_live(&args.root) {
        let changes = shims
            .into_iter()
            .map(|s| Change::Install(Box::new(s)))
            .collect();
        let report = rt.block_on(async {
            let node = live_node(&root, settings, Origin::Cli).await?;
            anyhow::Ok(node.apply(changes).await?)
        })?;
        print_report(&report);
        return Ok(());
    }
    let opts = image::InstallOptions {
        platform,
        containerd_version: args
            .containerd_version
            .clone()
            .or_else(|| image::image_containerd_version(&root)),
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
    };
    for shim in &shims {
        let outcome = rt
            .block_on(image::install_offline(&root, settings, shim, &opts))
            .with_context(|| {
                format!(
                    "install of Shim {:?} failed; {} is unchanged",
                    shim.name(),
                    root.path().display()
                )
            })?;
        match outcome {
            image::InstallOutcome::Installed {
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
            image::InstallOutcome::Unchanged => {
                println!("{}: already installed, nothing to do", shim.name())
            }
        }
    }
    Ok(())
}

/// `install --root --dry-run`: one line per Shim, worded as the install's own lines.
fn print_install_plan(plan: &image::InstallPlan) {
    use shim_agent::txn::Work;
    if let Some(id) = &plan.recovers {
        println!("would first roll back the unfinished transaction {id}");
    }
    for (name, work) in &plan.shims {
        match work {
            Work::Unchanged | Work::Absent => println!("{name}: already installed, nothing to do"),
            Work::Install => println!("would install {name}"),
            Work::Upgrade => println!("would upgrade {name}"),
            Work::Repair => println!("would repair {name}: its binary or its handler is missing"),
            Work::Uninstall => println!("would uninstall {name}"),
        }
    }
}

fn cmd_uninstall(settings: &Settings, args: UninstallArgs) -> anyhow::Result<()> {
    let root = host_root(&args.root)?;
    if is_live(&args.root) {
        let change = vec![Change::Uninstall(args.name.clone())];
        let report = runtime()?.block_on(async {
            let node = live_node(&root, settings, Origin::Cli).await?;
            anyhow::Ok(node.apply(change).await?)
        })?;
        if report.removed.is_empty() {
            anyhow::bail!("no Shim named {:?} is installed on this node", args.name);
        }
        print_report(&report);
        return Ok(());
    }
    let out = runtime()?.block_on(image::uninstall_offline(&root, settings, &args.name))?;
    println!("uninstalled {}", args.name);
    for f in out.restored {
        println!("  {f}: restored to its bytes from before the install");
    }
    for f in out.changed_since {
        println!("  {f}: changed by someone else since the install; only the handler was removed");
    }
    Ok(())
}
