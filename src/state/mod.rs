//! The node's state store: what shim-agent installed on this node, and why.
//!
//! One JSON document, `<state-dir>/state.json`, in an envelope that carries its format
//! version and a SHA-256 over the document's bytes:
//!
//! ```json
//! {"format":1,"sha256":"<hex of the bytes of state>","state":{...}}
//! ```
//!
//! # Guarantees
//! - Writes go temp file → fsync → rename → fsync of the directory ([`crate::fsutil`]): a
//!   crash leaves the old document or the new one, never a mix.
//! - One agent per node: [`StateStore::open`] takes an exclusive `flock` on
//!   `<state-dir>/lock` for the life of the store; a second opener gets
//!   [`StateError::AlreadyRunning`].
//! - A document that is truncated, not JSON, or whose checksum does not match is moved to
//!   `<state-dir>/quarantine/` with a warning naming it, and the agent starts from an empty
//!   state (it re-adopts what the containerd config says it owns): never a crash loop.
//! - Older formats are upgraded on load ([`upgrade`]); a *newer* format (written by a newer
//!   agent, then downgraded) is refused rather than quarantined, so nothing is lost.
//!
//! # Format history
//! - 1: `shims` (installed shims with the config files they changed).
//! - 2: adds `journal`, the open transaction of the node state machine (docs/design.md §3);
//!   a format-1 document upgrades to format 2 with no open transaction.
//! - 3: adds `retained` (replaced versions kept while containerd tasks use them), `working`
//!   (the Shims a round works on, for crash isolation) and `crashes`; a format-2 document
//!   upgrades with none of them. A format-2 agent refuses a format-3 document (rather than
//!   quarantining what it cannot read).
//! - 4: adds the journal phase `proven` (the functional check passed), and on each shim
//!   record its `shim_version` (what `-v` said) and the `check` container it is proven with;
//!   a format-3 document upgrades with none of them. A format-3 agent refuses a format-4
//!   document (it could not finish a journal at `proven`).
//! - 5: adds on each shim record its `insecure_source`, the registry host that served it
//!   without its certificate being verified, and its `signature`, whose signature was
//!   verified and when it was signed; a format-4 document upgrades with none. A format-4
//!   agent refuses a format-5 document (its records deny unknown fields, and would lose them).

mod model;

pub use model::*;

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::fsutil;

/// The format this build writes.
pub const STATE_FORMAT: u32 = 5;
/// File name of the state document inside the state directory.
pub const STATE_FILE: &str = "state.json";
/// How often, and how long apart, a busy lock is asked again before another agent is
/// taken to hold it (half a second in all).
const LOCK_TRIES: u32 = 25;
const LOCK_RETRY_MILLIS: u64 = 20;
/// File name of the lock file inside the state directory.
pub const LOCK_FILE: &str = "lock";
/// Directory (inside the state directory) that corrupt documents are moved to.
pub const QUARANTINE_DIR: &str = "quarantine";

/// What can go wrong with the state store.
#[derive(Debug, Error)]
pub enum StateError {
    #[error(
        "another shim-agent is already running on this node (lock held on {path}); stop it (systemctl stop shim-agent) or wait for it to finish"
    )]
    AlreadyRunning { path: PathBuf },
    #[error(
        "{path} was written by a newer shim-agent (state format {found}, this build reads up to {STATE_FORMAT}); upgrade shim-agent"
    )]
    NewerFormat { path: PathBuf, found: u32 },
    #[error("state store {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("state store {path}: cannot encode the state: {message}")]
    Encode { path: PathBuf, message: String },
}

impl StateError {
    /// Stable machine-readable reason.
    pub fn reason(&self) -> &'static str {
        match self {
            StateError::AlreadyRunning { .. } => "AlreadyRunning",
            StateError::NewerFormat { .. } => "StateFormatTooNew",
            StateError::Io { .. } => "StateIo",
            StateError::Encode { .. } => "StateEncode",
        }
    }
}

/// The envelope as read: the state's bytes are kept raw so the checksum covers exactly them.
#[derive(Deserialize)]
struct EnvelopeIn<'a> {
    format: u32,
    sha256: String,
    #[serde(borrow)]
    state: &'a RawValue,
}

#[derive(Serialize)]
struct EnvelopeOut<'a> {
    format: u32,
    sha256: String,
    state: &'a RawValue,
}

/// An open, locked state directory.
#[derive(Debug)]
pub struct StateStore {
    dir: PathBuf,
    _lock: File,
}

/// Result of [`StateStore::load`]: the state, and what loading had to do to get it.
#[derive(Debug)]
pub struct Loaded {
    pub state: NodeState,
    /// The format found on disk (0: no document yet).
    pub found_format: u32,
    /// Where a corrupt document was moved, if one was.
    pub quarantined: Option<PathBuf>,
}

impl StateStore {
    /// Open (creating it, mode 0700) the state directory `dir` and take the node lock.
    pub fn open(dir: &Path) -> Result<Self, StateError> {
        let io_err = |e| StateError::Io {
            path: dir.to_path_buf(),
            source: e,
        };
        create_private_dir(dir).map_err(io_err)?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&lock_path)
            .map_err(|e| StateError::Io {
                path: lock_path.clone(),
                source: e,
            })?;
        // A lock held a moment longer than its holder: a process the holder started (the
        // preflight's `-v`, a test's own) keeps a copy of its descriptor between fork and
        // exec. So a busy lock is asked again for a little while before it counts as another
        // agent.
        let mut tries = 0;
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if tries < LOCK_TRIES => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(LOCK_RETRY_MILLIS));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(StateError::AlreadyRunning { path: lock_path });
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(StateError::Io {
                        path: lock_path,
                        source: e,
                    });
                }
            }
        }
        Ok(StateStore {
            dir: dir.to_path_buf(),
            _lock: lock,
        })
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of the state document.
    pub fn state_path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// Load the state. Missing → empty; corrupt → quarantined and empty; older → upgraded.
    pub fn load(&self) -> Result<Loaded, StateError> {
        let path = self.state_path();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Loaded {
                    state: NodeState::default(),
                    found_format: 0,
                    quarantined: None,
                });
            }
            Err(e) => return Err(StateError::Io { path, source: e }),
        };
        match decode(&bytes) {
            Ok((format, state)) => Ok(Loaded {
                state,
                found_format: format,
                quarantined: None,
            }),
            Err(Decode::Newer(found)) => Err(StateError::NewerFormat { path, found }),
            Err(Decode::Corrupt(why)) => {
                let moved = self.quarantine(&path, &why)?;
                Ok(Loaded {
                    state: NodeState::default(),
                    found_format: 0,
                    quarantined: Some(moved),
                })
            }
        }
    }

    /// Write the state atomically in the current format.
    pub fn save(&self, state: &NodeState) -> Result<(), StateError> {
        let path = self.state_path();
        let bytes = encode(state).map_err(|e| StateError::Encode {
            path: path.clone(),
            message: e.to_string(),
        })?;
        fail::fail_point!("state::save", |_| Err(StateError::Io {
            path: path.clone(),
            source: io::Error::other("failpoint state::save"),
        }));
        fsutil::write_atomic(&path, &bytes, Some(fsutil::FileMode::new(0o600)))
            .map_err(|e| StateError::Io { path, source: e })
    }

    fn quarantine(&self, path: &Path, why: &str) -> Result<PathBuf, StateError> {
        let qdir = self.dir.join(QUARANTINE_DIR);
        create_private_dir(&qdir).map_err(|e| StateError::Io {
            path: qdir.clone(),
            source: e,
        })?;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let mut target = qdir.join(format!("{STATE_FILE}.{stamp}"));
        let mut n = 1;
        while target.exists() {
            target = qdir.join(format!("{STATE_FILE}.{stamp}.{n}"));
            n += 1;
        }
        std::fs::rename(path, &target).map_err(|e| StateError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        let _ = fsutil::sync_dir(&self.dir);
        tracing::warn!(
            file = %path.display(),
            moved_to = %target.display(),
            reason = why,
            "state document is corrupt; moved it aside and starting from an empty state"
        );
        Ok(target)
    }
}

fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

enum Decode {
    Corrupt(String),
    Newer(u32),
}

fn checksum(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Serialize a state document in the current format.
pub fn encode(state: &NodeState) -> Result<Vec<u8>, serde_json::Error> {
    let body = serde_json::to_string(state)?;
    let raw = RawValue::from_string(body)?;
    let env = EnvelopeOut {
        format: STATE_FORMAT,
        sha256: checksum(raw.get().as_bytes()),
        state: &raw,
    };
    let mut out = serde_json::to_vec(&env)?;
    out.push(b'\n');
    Ok(out)
}

/// Decode a state document (any supported format) without the store: for read-only views.
pub fn decode_document(bytes: &[u8]) -> Result<NodeState, String> {
    match decode(bytes) {
        Ok((_, state)) => Ok(state),
        Err(Decode::Newer(found)) => Err(format!(
            "state format {found} is newer than this build reads ({STATE_FORMAT})"
        )),
        Err(Decode::Corrupt(why)) => Err(why),
    }
}

fn decode(bytes: &[u8]) -> Result<(u32, NodeState), Decode> {
    let env: EnvelopeIn = serde_json::from_slice(bytes)
        .map_err(|e| Decode::Corrupt(format!("not a state document: {e}")))?;
    if env.format > STATE_FORMAT {
        return Err(Decode::Newer(env.format));
    }
    let sum = checksum(env.state.get().as_bytes());
    if sum != env.sha256 {
        return Err(Decode::Corrupt(format!(
            "checksum mismatch: recorded {}, computed {sum}",
            env.sha256
        )));
    }
    let state = upgrade(env.format, env.state.get()).map_err(Decode::Corrupt)?;
    Ok((env.format, state))
}

/// Bring a document of format `format` up to the current [`NodeState`].
pub fn upgrade(format: u32, state_json: &str) -> Result<NodeState, String> {
    match format {
        1 => {
            let v1: model::NodeStateV1 =
                serde_json::from_str(state_json).map_err(|e| format!("format 1: {e}"))?;
            Ok(NodeState {
                shims: v1.shims,
                ..NodeState::default()
            })
        }
        // formats 3 to 5 only added fields (and a phase), each with a default
        2..=5 => serde_json::from_str(state_json).map_err(|e| format!("format {format}: {e}")),
        other => Err(format!("unknown state format {other}")),
    }
}

#[cfg(test)]
mod tests;
