//! Logs: to journald with structured fields when systemd connected stderr to the journal
//! (`JOURNAL_STREAM` names stderr), as plain text on stderr otherwise. The level can be
//! changed while running (`systemctl reload`).
//!
//! In the journal every event's fields are upcased (`shim` → `SHIM`, `message_id` →
//! `MESSAGE_ID`), and every entry carries `NODE`, so `journalctl -u shim-agent
//! MESSAGE_ID=f25dc2e5a9f448b398a3268b67842133` lists every rollback
//! ([`crate::telemetry::message_id`]).

use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry, reload};

/// Changes the log level of the running process.
pub struct LogHandle {
    filter: Option<reload::Handle<EnvFilter, Registry>>,
}

fn filter(level: &str) -> (EnvFilter, Option<String>) {
    match EnvFilter::try_new(level) {
        Ok(f) => (f, None),
        Err(e) => (
            EnvFilter::new("info"),
            Some(format!(
                "log.level {level:?} is not a level or filter ({e}); using info"
            )),
        ),
    }
}

impl LogHandle {
    /// Use `level` from now on.
    pub fn set_level(&self, level: &str) {
        let (f, warning) = filter(level);
        if let Some(h) = &self.filter
            && let Err(e) = h.reload(f)
        {
            tracing::warn!("cannot change the log level: {e}");
        }
        if let Some(w) = warning {
            tracing::warn!("{w}");
        }
    }
}

/// Whether stderr is the journal stream systemd gave this process (the check systemd
/// documents for `JOURNAL_STREAM`: its device and inode are stderr's).
pub fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let stderr = std::io::stderr();
    let Ok(fd) = stderr.as_fd().try_clone_to_owned() else {
        return false;
    };
    let Ok(meta) = std::fs::File::from(fd).metadata() else {
        return false;
    };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// Install the process's logger. `node` goes into every journal entry as `NODE`.
pub fn init(level: &str, node: Option<&str>) -> LogHandle {
    let (f, warning) = filter(level);
    let (f, handle) = reload::Layer::new(f);
    let journald = if stderr_is_journal() {
        match tracing_journald::layer() {
            Ok(l) => Some(
                l.with_field_prefix(None)
                    .with_syslog_identifier("shim-agent".into())
                    .with_custom_fields(node.map(|n| ("NODE", n.to_string()))),
            ),
            Err(e) => {
                eprintln!("cannot log to journald ({e}); logging to stderr");
                None
            }
        }
    } else {
        None
    };
    let plain = journald.is_none().then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_target(false)
            .boxed()
    });
    let installed = tracing_subscriber::registry()
        .with(f)
        .with(journald)
        .with(plain)
        .try_init()
        .is_ok();
    if let Some(w) = warning {
        tracing::warn!("{w}");
    }
    LogHandle {
        filter: installed.then_some(handle),
    }
}
