//! [`ArtifactError`]: everything that can go wrong between a `fetchStrategy` and an
//! installed shim binary, each with a stable machine-readable [`reason`](ArtifactError::reason).
//!
//! Messages say what was wrong, where (URL, reference, archive entry) and what to do. An
//! `io::Error` cause is kept as `#[source]` and not repeated in the message.

use std::io;
use std::path::PathBuf;

/// An error while resolving, fetching, verifying, unpacking or placing a shim artifact.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// The fetch spec names a strategy this agent does not know.
    #[error(
        "unknown fetch strategy {strategy:?}: this agent supports \"anonymousHttp\" and \"oci\"; fix spec.fetchStrategy.type or upgrade the agent"
    )]
    UnknownStrategy { strategy: String },

    /// The fetch spec is malformed (missing section, bad digest, bad reference...).
    #[error("invalid fetch spec: {detail}")]
    InvalidSpec { detail: String },

    /// No sha256 was given and unverified artifacts are not allowed.
    #[error(
        "no sha256 for {location}: set the artifact's sha256 (or pin the OCI reference by digest), or allow unverified artifacts in the agent's config"
    )]
    MissingDigest { location: String },

    /// No platform entry matches the node and there is no default location.
    #[error(
        "no artifact for this node's platform {os}/{arch}: the spec offers [{available}]; add a platforms entry for {os}/{arch} or a default location"
    )]
    NoPlatformMatch {
        os: String,
        arch: String,
        available: String,
    },

    /// The spec has builds for the node's platform, but none whose `containerd` range
    /// includes the containerd the node runs.
    #[error(
        "no build for containerd {version} on {platform}: the spec's builds for {platform} are for containerd [{offered}]; add a fetchStrategy.platforms entry for {platform} whose containerd range includes {version} (or one without a range)"
    )]
    NoBuildForContainerd {
        version: String,
        platform: String,
        offered: String,
    },

    /// Every build for the node's platform declares a `containerd` range, and the node's
    /// containerd version is not known.
    #[error(
        "cannot choose a build for {platform}: each is for a range of containerd releases [{offered}], and the agent could not ask containerd its version (CRI Version); check that containerd is running and its socket is reachable, give the version with --containerd-version for an offline install (install --root), or add a platforms entry without a containerd range"
    )]
    ContainerdVersionUnknown { platform: String, offered: String },

    /// The HTTP client cannot be built (e.g. `fetch.ca-file` holds no certificate).
    #[error("cannot set up the HTTP client: {detail}")]
    HttpClient { detail: String },

    /// An https:// location on a node with no CA certificate to verify it with.
    #[error(
        "{url}: https needs CA certificates, and this node has none: no system bundle (install the ca-certificates package) and no fetch.ca-file in the agent's config; file:// and http:// locations work without"
    )]
    NoCaCertificates { url: String },

    /// An `oci` pull on a node without a system CA bundle: the OCI client library cannot
    /// start without one (whatever `fetch.ca-file` or the registry's `ca` add).
    #[error(
        "{url}: oci pulls need the node's CA bundle (install the ca-certificates package, with a private registry's CA added to it); the OCI client cannot start without one"
    )]
    NoCaCertificatesForOci { url: String },

    /// The location's scheme is not http, https or file.
    #[error("unsupported location {location:?}: use an http://, https:// or file:// URL")]
    UnsupportedScheme { location: String },

    /// The server answered with a non-success status.
    #[error("GET {url} returned HTTP {status} after {attempts} attempt(s){hint}")]
    HttpStatus {
        url: String,
        status: u16,
        attempts: u32,
        hint: &'static str,
    },

    /// Connecting or reading timed out.
    #[error(
        "timed out fetching {url} after {attempts} attempt(s) ({detail}); check the node's network path to the server"
    )]
    Timeout {
        url: String,
        attempts: u32,
        detail: String,
    },

    /// The connection could not be established.
    #[error(
        "cannot connect to {url} after {attempts} attempt(s) ({detail}); check the URL and that the server is reachable from the node"
    )]
    Connect {
        url: String,
        attempts: u32,
        detail: String,
    },

    /// The transfer broke off (connection reset, body error).
    #[error("download of {url} failed after {attempts} attempt(s): {detail}")]
    Transfer {
        url: String,
        attempts: u32,
        detail: String,
    },

    /// The proxy the agent's environment names for `url` refused to forward it: a CONNECT
    /// it answered with anything but 200, or HTTP 407 (`proxy`: its host and port, never
    /// its login).
    #[error(
        "{url}: the proxy {proxy} refused to forward the request{status}: check the proxy's address and login in the agent's environment (HTTPS_PROXY/HTTP_PROXY in its unit's drop-in), or add the host to NO_PROXY"
    )]
    ProxyRefused {
        url: String,
        proxy: String,
        /// " (HTTP 407)" when the proxy answered a status, else empty.
        status: String,
    },

    /// A signature was required and is missing, or does not verify (its own reasons).
    #[error(transparent)]
    Signature(#[from] crate::signature::SignatureError),

    /// A `file://` location could not be read.
    #[error("cannot read local artifact {}", path.display())]
    LocalFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// The OCI registry refused or failed a request.
    #[error("OCI pull of {reference} failed after {attempts} attempt(s): {detail}")]
    Oci {
        reference: String,
        attempts: u32,
        detail: String,
        transient: bool,
    },

    /// The node's registry credentials could not be had (a credential provider failed or
    /// timed out, a `config.json` that cannot be read); never the secret.
    #[error("registry credentials for {registry}: {detail}")]
    Credentials { registry: String, detail: String },

    /// A registry refused the node's credentials for it (from `from`).
    #[error("{registry} refused the credentials from {from}: {detail}")]
    CredentialsRefused {
        registry: String,
        from: String,
        detail: String,
    },

    /// The node's registry hosts configuration (containerd's `config_path`) cannot be used.
    #[error("containerd's registry hosts configuration: {detail}")]
    RegistryHosts { detail: String },

    /// The downloaded bytes do not have the expected sha256.
    #[error(
        "sha256 mismatch for {location}: expected {expected}, got {actual}; the artifact changed or the sha256 in the spec is wrong — nothing was installed"
    )]
    DigestMismatch {
        location: String,
        expected: String,
        actual: String,
    },

    /// The download exceeded the size cap.
    #[error(
        "{location} is larger than the download limit of {limit} bytes; raise the limit in the agent's config if this is expected"
    )]
    DownloadTooLarge { location: String, limit: u64 },

    /// The download is not a tar (plain, or compressed with gzip, zstd or xz) nor an ELF
    /// binary, or its compressed stream does not hold a tar.
    #[error(
        "{location} is not a tar, tar.gz, tar.zst, tar.xz or ELF file ({found}); check that the location points at the artifact itself"
    )]
    NotAnArchive { location: String, found: String },

    /// The archive ended early.
    #[error(
        "archive {location} is truncated ({detail}); the download was cut short or the file is incomplete"
    )]
    TruncatedArchive { location: String, detail: String },

    /// The archive is malformed (bad gzip, zstd or xz data, bad tar header).
    #[error("archive {location} is corrupt: {detail}")]
    CorruptArchive { location: String, detail: String },

    /// An entry broke one of the extraction rules.
    #[error(
        "unsafe entry {entry:?} in {location}: {rule}; the artifact was rejected and nothing was installed"
    )]
    UnsafeArchiveEntry {
        location: String,
        entry: String,
        rule: String,
    },

    /// Unpacking would exceed a size or entry-count cap (archive bomb).
    #[error(
        "archive {location} is too large at entry {entry:?}: {detail}; the artifact was rejected"
    )]
    ArchiveTooLarge {
        location: String,
        entry: String,
        detail: String,
    },

    /// No `containerd-shim-*-v*` file (or no file named by `runtime.binary`).
    #[error(
        "no shim binary {wanted} in the artifact; it holds: [{found}]; set runtime.binary to one of these"
    )]
    NoShimBinary { wanted: String, found: String },

    /// More than one candidate for the shim binary.
    #[error(
        "several shim binaries in the artifact: [{candidates}]; set runtime.binary to pick one"
    )]
    AmbiguousShimBinary { candidates: String },

    /// The shim binary is not an executable ELF file.
    #[error("{} is not an executable ELF file: {detail}", path.display())]
    NotExecutable { path: PathBuf, detail: String },

    /// The shim binary is built for another architecture.
    #[error(
        "{} is built for {found}, but this node is {expected}; use the artifact for {expected} (spec.fetchStrategy.platforms)",
        path.display()
    )]
    WrongArchitecture {
        path: PathBuf,
        found: String,
        expected: String,
    },

    /// The shim's interpreter or a shared library it needs does not resolve on the node.
    #[error(
        "{} cannot run on this node: {} not found (searched its RUNPATH, /etc/ld.so.cache and the default library directories); install them on the node or use a statically linked build",
        path.display(),
        missing.join(", ")
    )]
    MissingLibraries { path: PathBuf, missing: Vec<String> },

    /// A filesystem operation failed.
    #[error("failed to {op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl ArtifactError {
    /// Stable machine-readable reason: a Shim condition's `reason` and a metric label.
    pub fn reason(&self) -> &'static str {
        use ArtifactError::*;
        match self {
            UnknownStrategy { .. } => "UnknownFetchStrategy",
            InvalidSpec { .. } => "InvalidFetchSpec",
            MissingDigest { .. } => "MissingDigest",
            NoPlatformMatch { .. } => "NoPlatformMatch",
            NoBuildForContainerd { .. } => "NoBuildForContainerd",
            ContainerdVersionUnknown { .. } => "ContainerdVersionUnknown",
            UnsupportedScheme { .. } => "UnsupportedScheme",
            HttpClient { .. } => "HttpClientUnavailable",
            NoCaCertificates { .. } => "NoCaCertificates",
            HttpStatus { .. } => "HttpStatus",
            Timeout { .. } => "Timeout",
            Connect { .. } => "ConnectFailed",
            Transfer { .. } => "TransferFailed",
            ProxyRefused { .. } => "ProxyRefused",
            Signature(e) => e.reason(),
            LocalFile { .. } => "LocalFileUnreadable",
            Oci { .. } => "OciPullFailed",
            RegistryHosts { .. } => "RegistryHostsInvalid",
            NoCaCertificatesForOci { .. } => "NoCaCertificates",
            Credentials { .. } => "RegistryCredentialsFailed",
            CredentialsRefused { .. } => "RegistryCredentialsRefused",
            DigestMismatch { .. } => "DigestMismatch",
            DownloadTooLarge { .. } => "DownloadTooLarge",
            NotAnArchive { .. } => "NotAnArchive",
            TruncatedArchive { .. } => "TruncatedArchive",
            CorruptArchive { .. } => "CorruptArchive",
            UnsafeArchiveEntry { .. } => "UnsafeArchiveEntry",
            ArchiveTooLarge { .. } => "ArchiveTooLarge",
            NoShimBinary { .. } => "NoShimBinary",
            AmbiguousShimBinary { .. } => "AmbiguousShimBinary",
            NotExecutable { .. } => "NotExecutable",
            WrongArchitecture { .. } => "WrongArchitecture",
            MissingLibraries { .. } => "MissingLibraries",
            Io { .. } => "IoError",
        }
    }

    /// True for failures worth retrying: timeouts, connection failures, broken transfers,
    /// HTTP 408/429/5xx and registry server errors. Never for 4xx, digest mismatches or
    /// bad archives: those give the same answer every time.
    pub fn is_transient(&self) -> bool {
        match self {
            ArtifactError::Timeout { .. }
            | ArtifactError::Connect { .. }
            | ArtifactError::Transfer { .. } => true,
            ArtifactError::HttpStatus { status, .. } => is_transient_status(*status),
            ArtifactError::Oci { transient, .. } => *transient,
            _ => false,
        }
    }

    /// Record how many attempts were made (for the retry loop's final error).
    pub(crate) fn with_attempts(mut self, n: u32) -> Self {
        use ArtifactError::*;
        match &mut self {
            HttpStatus { attempts, .. }
            | Timeout { attempts, .. }
            | Connect { attempts, .. }
            | Transfer { attempts, .. }
            | Oci { attempts, .. } => *attempts = n,
            _ => {}
        }
        self
    }

    /// An I/O error on `path` while doing `op` (e.g. "create directory").
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        ArtifactError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// HTTP statuses that may succeed on a retry.
pub(crate) fn is_transient_status(status: u16) -> bool {
    status == 408 || status == 429 || (500..=599).contains(&status)
}

/// A short hint for an HTTP status, appended to the message; `proxied`: the agent's
/// environment names a proxy (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`), which may be the one
/// refusing (tinyproxy answers a bad login with 401, not 407).
pub(crate) fn status_hint(status: u16, proxied: bool) -> &'static str {
    match status {
        407 => {
            "; the proxy refused the credentials in HTTP_PROXY/HTTPS_PROXY: fix them in the agent's environment (its unit's drop-in)"
        }
        401 | 403 if proxied => {
            "; the server, or the proxy in HTTP_PROXY/HTTPS_PROXY, refused access: check the proxy's credentials in the agent's environment, and the server's in fetch.http-credentials-file"
        }
        401 | 403 => {
            "; the server refused access: give the node's credentials for it in fetch.http-credentials-file, or use a public URL"
        }
        404 | 410 => "; check the location in spec.fetchStrategy",
        s if is_transient_status(s) => "; the server is failing, it will be tried again later",
        _ => "",
    }
}
