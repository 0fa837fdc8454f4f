//! The Shim fields' refusal cases shared by the node's client-side check (tests/pure/api.rs)
//! and the real API server (tests/kube/api.rs): one list, each case with the message it must
//! be refused with. The API server checks a schema bound (`maxLength`, `maxItems`) before the
//! CEL rules and skips them then ("some validation rules were not checked"), so four cases
//! carry its own message there ([`Judge::ApiServer`]); the node has no schema bounds and gives
//! the rule's ([`Judge::Node`]). Each case starts from the caller's good Shim (`with` replaces
//! one part of it).
#![allow(dead_code)]

/// Who judges the Shim: the messages differ for values past a schema bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judge {
    Node,
    ApiServer,
}

/// A good Shim with `from` replaced by `to` (the caller's).
pub type With<'a> = &'a dyn Fn(&str, &str) -> String;

/// `fetchStrategy.platforms` instead of `anonHttp`, each entry's YAML in flow style.
pub fn with_platforms(with: With, entries: &[&str]) -> String {
    let list: String = entries.iter().map(|e| format!("      - {e}\n")).collect();
    with(
        "    anonHttp:\n      location: https://example.com/shim.tar.gz\n      sha256: 3f5a2f1b2e9e0f4ad7d3c8a57b3b1f65f9d2b0b6a1f0c2e4d6b8a0c2e4f6a8b0\n",
        &format!("    platforms:\n{list}"),
    )
}

/// A `platforms` entry for linux/`arch` with this `containerd` range (YAML), or none.
pub fn build(arch: &str, containerd: Option<&str>) -> String {
    let range = containerd.map_or(String::new(), |r| format!(", containerd: {r}"));
    format!("{{os: linux, arch: {arch}, location: \"https://x/{arch}.tgz\"{range}}}")
}

/// `check.container` set to this YAML flow mapping.
pub fn with_check(with: With, container: &str) -> String {
    with(
        "  rolloutStrategy:",
        &format!("  check:\n    container: {container}\n  rolloutStrategy:"),
    )
}

pub const RANGE: &str = "platforms[].containerd must be a containerd version range of at most 128 characters: comparators separated by commas, each an operator (>=, >, <=, <, =) and a version MAJOR[.MINOR[.PATCH]]";
pub const DUPLICATE: &str =
    "fetchStrategy.platforms must not list two entries with the same os, arch and containerd";
pub const IMAGE: &str =
    "check.container.image must be an image reference of 1 to 4096 characters, without whitespace";
pub const COMMAND: &str =
    "check.container.command must list 1 to 64 items, each of 1 to 4096 characters";
pub const ARGS: &str =
    "check.container.args must list at most 64 items, each of at most 4096 characters";
pub const EXIT_CODE: &str = "check.container.success.exitCode must be from 0 to 255";
pub const OUTPUT: &str =
    "check.container.success.outputContains must be 1 to 4096 characters when set";
pub const TIMEOUT: &str = "check.container.timeoutSeconds must be from 1 to 600";

/// A good check container with `field` replaced by `value` (flow-style YAML).
pub fn check_with(field: &str, value: &str) -> String {
    let mut fields = vec![
        (
            "image",
            "docker.io/library/shim-agent-wasm-hello:v1".to_string(),
        ),
        ("command", "[/hello.wasm]".to_string()),
        ("timeoutSeconds", "60".to_string()),
    ];
    match fields.iter_mut().find(|(f, _)| *f == field) {
        Some(f) => f.1 = value.to_string(),
        None => fields.push((field, value.to_string())),
    }
    let body: Vec<String> = fields.iter().map(|(f, v)| format!("{f}: {v}")).collect();
    format!("{{{}}}", body.join(", "))
}

/// Every refusal of the containerd ranges and the check container: (what, the Shim, the
/// message `judge` gives).
pub fn new_field_refusals(with: With, judge: Judge) -> Vec<(String, String, &'static str)> {
    let mut cases = Vec::new();
    for bad in [
        "\"2.3\"",
        "\"<\"",
        "\"~2.3\"",
        "\"<2.3,\"",
        "\"<2.3.4.5\"",
        "\"<v2.3\"",
        "\"<2.x\"",
        "\"== 2.3\"",
        "\"<2.3 >1.6\"",
        "\"<1234567890\"",
        "\"\"",
    ] {
        let yaml = with_platforms(with, &[&build("amd64", Some(bad))]);
        cases.push((format!("containerd {bad}"), yaml, RANGE));
    }
    for (what, a, b) in [
        ("the same range", Some("\"<2.3\""), Some("\"<2.3\"")),
        ("no range twice", None, None),
    ] {
        let yaml = with_platforms(
            with,
            &[&build("amd64", a), &build("arm64", a), &build("amd64", b)],
        );
        cases.push((format!("duplicate entries, {what}"), yaml, DUPLICATE));
    }
    let long = format!("\"<{}\"", "1.".repeat(70));
    let yaml = with_platforms(with, &[&build("amd64", Some(&long))]);
    let too_long = bound(judge, RANGE, RANGE_TOO_LONG);
    cases.push(("containerd of 142 characters".into(), yaml, too_long));
    let long_image = format!("\"{}\"", "a".repeat(4097));
    let many = format!("[{}]", vec!["x"; 65].join(", "));
    for (field, value, message) in [
        ("image", "\"\"", IMAGE),
        ("image", "\"hello wasm:v1\"", IMAGE),
        ("image", "\"hello:v1\\t\"", IMAGE),
        (
            "image",
            long_image.as_str(),
            bound(judge, IMAGE, IMAGE_TOO_LONG),
        ),
        ("command", "[]", COMMAND),
        ("command", "[/hello.wasm, \"\"]", COMMAND),
        (
            "command",
            many.as_str(),
            bound(judge, COMMAND, COMMAND_TOO_MANY),
        ),
        ("args", many.as_str(), bound(judge, ARGS, ARGS_TOO_MANY)),
        ("success", "{exitCode: 300}", EXIT_CODE),
        ("success", "{exitCode: -1}", EXIT_CODE),
        ("success", "{outputContains: \"\"}", OUTPUT),
        ("timeoutSeconds", "0", TIMEOUT),
        ("timeoutSeconds", "601", TIMEOUT),
    ] {
        let yaml = with_check(with, &check_with(field, value));
        cases.push((format!("check {field}: {value:.40}"), yaml, message));
    }
    cases.extend(signature_refusals(with));
    cases
}

/// `signature` set to this YAML flow mapping.
pub fn with_signature(with: With, signature: &str) -> String {
    with(
        "  rolloutStrategy:",
        &format!("  signature: {signature}\n  rolloutStrategy:"),
    )
}

pub const ONE_MATERIAL: &str = "signature needs exactly one of bundle, or signature (with certificate for a keyless signature)";
pub const CERT_WITH_SIG: &str =
    "signature.certificate goes with signature.signature (a bundle carries its own)";
pub const A_SIGNER: &str =
    "signature needs at least one trusted signer: identities (keyless) or keys";
pub const ONE_IDENTITY: &str = "an identity needs exactly one of identity or identityRegExp";
pub const IN_ARTIFACT: &str = "with from: artifact, signature, certificate and bundle must be relative paths inside the artifact";
pub const URLS: &str =
    "with from: url, signature, certificate and bundle must be http://, https:// or file:/// URLs";
pub const SIGNED_FILE: &str = "signature.signedFile must be a relative path inside the artifact, without '.' or '..' segments";
pub const KEYS: &str = "signature.keys must each be a PEM public key (-----BEGIN PUBLIC KEY-----)";
pub const OCI_NO_MATERIAL: &str = "with from: oci, the signature is found attached to the artifact in its registry: signature, certificate, bundle and signedFile are not allowed";
pub const OCI_ARTIFACT: &str =
    "signature.from: oci needs fetchStrategy.type oci with a reference pinned by digest";

/// The good Shim's `anonHttp` artifact as an `oci` one at `reference`.
pub fn with_oci(with: With, reference: &str) -> String {
    with(
        "    type: anonymousHttp\n    anonHttp:\n      location: https://example.com/shim.tar.gz\n      sha256: 3f5a2f1b2e9e0f4ad7d3c8a57b3b1f65f9d2b0b6a1f0c2e4d6b8a0c2e4f6a8b0\n",
        &format!("    type: oci\n    oci:\n      reference: \"{reference}\"\n"),
    )
}

/// Every refusal of `signature`: (what, the Shim, the message).
fn signature_refusals(with: With) -> Vec<(String, String, &'static str)> {
    let id = "identities: [{identity: \"https://ci/x\", issuer: \"https://issuer\"}]";
    let artifact = |rest: &str| format!("{{from: artifact, {rest}, {id}}}");
    let cases: Vec<(&str, String, &'static str)> = vec![
        ("bundle and signature", artifact("bundle: b, signature: s"), ONE_MATERIAL),
        ("no material", format!("{{from: artifact, {id}}}"), ONE_MATERIAL),
        ("a certificate with a bundle", artifact("bundle: b, certificate: c"), CERT_WITH_SIG),
        ("no signer", "{from: artifact, bundle: b}".into(), A_SIGNER),
        ("empty identities", "{from: artifact, bundle: b, identities: []}".into(), A_SIGNER),
        (
            "an identity and its pattern",
            "{from: artifact, bundle: b, identities: [{identity: a, identityRegExp: a, issuer: i}]}".into(),
            ONE_IDENTITY,
        ),
        (
            "an identity with neither",
            "{from: artifact, bundle: b, identities: [{issuer: i}]}".into(),
            ONE_IDENTITY,
        ),
        ("a path out of the artifact", artifact("signature: ../s.sig"), IN_ARTIFACT),
        ("an absolute path", artifact("bundle: /etc/b"), IN_ARTIFACT),
        ("a URL with from: artifact", artifact("bundle: \"https://x/b\""), IN_ARTIFACT),
        ("not a URL", format!("{{from: url, bundle: \"ftp://x/b\", {id}}}"), URLS),
        ("a path with from: url", format!("{{from: url, signature: s.sig, {id}}}"), URLS),
        ("signedFile out of the artifact", artifact("bundle: b, signedFile: a/../../b"), SIGNED_FILE),
        ("signedFile with a dot segment", artifact("bundle: b, signedFile: ./b"), SIGNED_FILE),
        (
            "a key that is not PEM",
            "{from: artifact, bundle: b, keys: [\"ssh-ed25519 AAAA\"]}".into(),
            KEYS,
        ),
    ];
    let mut out: Vec<(String, String, &'static str)> = cases
        .into_iter()
        .map(|(what, body, message)| {
            (
                format!("signature: {what}"),
                with_signature(with, &body),
                message,
            )
        })
        .collect();
    // from: oci: the material is the registry's, the artifact a pinned oci one
    let pinned = format!("registry.test/shims/demo@sha256:{}", "a".repeat(64));
    let oci = |yaml: String| with_oci(&move |f: &str, t: &str| yaml.replacen(f, t, 1), &pinned);
    for (what, rest) in [
        ("a bundle", "bundle: b, "),
        (
            "a signature and certificate",
            "signature: s, certificate: c, ",
        ),
        ("a signed file", "signedFile: shim, "),
    ] {
        let yaml = oci(with_signature(with, &format!("{{from: oci, {rest}{id}}}")));
        out.push((
            format!("signature: from oci with {what}"),
            yaml,
            OCI_NO_MATERIAL,
        ));
    }
    let from_oci = format!("{{from: oci, {id}}}");
    out.push((
        "signature: from oci of an anonymousHttp artifact".into(),
        with_signature(with, &from_oci),
        OCI_ARTIFACT,
    ));
    let tagged = with_signature(with, &from_oci);
    let tagged = with_oci(
        &move |f: &str, t: &str| tagged.replacen(f, t, 1),
        "registry.test/shims/demo:v1",
    );
    out.push(("signature: from oci of a tag".into(), tagged, OCI_ARTIFACT));
    out
}

/// The rule's message on the node, the API server's own past a schema bound.
fn bound(judge: Judge, rule: &'static str, schema: &'static str) -> &'static str {
    match judge {
        Judge::Node => rule,
        Judge::ApiServer => schema,
    }
}

/// What the API server says when a value breaks the schema's own bound.
pub const RANGE_TOO_LONG: &str =
    "spec.fetchStrategy.platforms[0].containerd: Too long: may not be more than 128 bytes";
pub const IMAGE_TOO_LONG: &str =
    "spec.check.container.image: Too long: may not be more than 4096 bytes";
pub const COMMAND_TOO_MANY: &str =
    "spec.check.container.command: Too many: 65: must have at most 64 items";
pub const ARGS_TOO_MANY: &str =
    "spec.check.container.args: Too many: 65: must have at most 64 items";
