//! Every finding the doctor can make, from facts: a healthy node, then one thing broken at a
//! time, each row naming the check and the level it must get.

use super::*;

fn healthy() -> Facts {
    Facts {
        target: Target::Node { name: "n1".into() },
        profile: ProfileFacts {
            name: "containerd".into(),
            config: "/etc/containerd/config.toml".into(),
            unit: "containerd.service".into(),
            socket: "/run/containerd/containerd.sock".into(),
            unsupported: None,
        },
        config: Ok(ConfigFacts {
            files: vec!["/etc/containerd/config.toml".into()],
            schema_version: 2,
            registry_config_path: Some("/etc/containerd/certs.d".into()),
            ..ConfigFacts::default()
        }),
        hosts_dirs: vec![HostsDir {
            dir: "/etc/containerd/certs.d".into(),
            exists: true,
            registries: vec![HostsFile {
                registry: "docker.io".into(),
                problem: None,
            }],
        }],
        unit: Some(Ok(UnitFacts {
            load_state: "loaded".into(),
            active_state: "active".into(),
            sub_state: "running".into(),
        })),
        version: Ok("1.6.20~ds1".into()),
        cri: Some(Ok(CriFacts {
            runtime_ready: true,
            runtime_detail: String::new(),
        })),
        sandbox_image: Some(SandboxImage::Present("registry.k8s.io/pause:3.6".into())),
        credentials: Some(Credentials::Ready(
            "kubeconfig /etc/kubernetes/kubelet.conf".into(),
        )),
        api: Some(Ok(ApiFacts {
            server_version: "v1.36.2".into(),
            identity: Ok(Identity {
                username: "system:node:n1".into(),
                groups: vec!["system:nodes".into()],
            }),
            skew_secs: Some(0.4),
        })),
        space: vec![
            SpaceFacts {
                what: "state",
                path: "/var/lib/shim-agent".into(),
                free: Ok(10 << 30),
            },
            SpaceFacts {
                what: "install",
                path: "/opt/shim-agent/shims".into(),
                free: Ok(10 << 30),
            },
        ],
        proxies: vec![ProxySource {
            source: "shim-agent.service".into(),
            vars: Ok(vec![]),
        }],
        lease_duration_secs: 15,
        signatures: Ok(SignatureFacts {
            require: false,
            identities: 0,
            keys: 0,
            trusted_root: None,
            without_signed_time: false,
        }),
    }
}

/// The level `judge` gives `id` (the worst, when several findings share it).
fn level_of(f: &Facts, id: &str) -> Level {
    judge(f)
        .into_iter()
        .filter(|x| x.check == id)
        .map(|x| x.level)
        .max()
        .unwrap_or_else(|| panic!("no finding {id}"))
}

#[test]
fn a_healthy_node_blocks_nothing_and_every_check_is_there() {
    let findings = judge(&healthy());
    for id in [
        check::PROFILE,
        check::CONFIG,
        check::UNIT,
        check::VERSION,
        check::REGISTRY_HOSTS,
        check::CRI,
        check::SANDBOX_IMAGE,
        check::CREDENTIALS,
        check::API_SERVER,
        check::IDENTITY,
        check::CLOCK_SKEW,
        check::DISK_STATE,
        check::DISK_INSTALL,
        check::PROXY,
        check::SIGNATURE_POLICY,
    ] {
        let f = findings
            .iter()
            .find(|f| f.check == id)
            .unwrap_or_else(|| panic!("no {id}"));
        assert!(f.level <= Level::Info, "{f:?}");
        assert!(f.remedy.is_none(), "{f:?}");
    }
}

type Break = fn(&mut Facts);

/// One thing broken: what, how, the check that must find it and its level.
const ROWS: &[(&str, Break, &str, Level)] = &[
    (
        "unsupported system",
        |f| f.profile.unsupported = Some("Talos".into()),
        check::PROFILE,
        Level::Fail,
    ),
    (
        "config unreadable",
        |f| f.config = Err("not valid TOML".into()),
        check::CONFIG,
        Level::Fail,
    ),
    (
        "unit missing",
        |f| {
            f.unit = Some(Ok(UnitFacts {
                load_state: "not-found".into(),
                ..UnitFacts::default()
            }))
        },
        check::UNIT,
        Level::Fail,
    ),
    (
        "unit stopped",
        |f| {
            f.unit = Some(Ok(UnitFacts {
                load_state: "loaded".into(),
                active_state: "failed".into(),
                sub_state: "failed".into(),
            }))
        },
        check::UNIT,
        Level::Fail,
    ),
    (
        "no systemd",
        |f| f.unit = Some(Err("no bus".into())),
        check::UNIT,
        Level::Fail,
    ),
    (
        "old containerd",
        |f| f.version = Ok("1.5.18".into()),
        check::VERSION,
        Level::Warn,
    ),
    (
        "odd version",
        |f| f.version = Ok("banana".into()),
        check::VERSION,
        Level::Warn,
    ),
    (
        "legacy mirrors",
        |f| {
            if let Ok(c) = &mut f.config {
                c.legacy_mirrors = vec!["docker.io".into()];
            }
        },
        check::REGISTRY_HOSTS,
        Level::Warn,
    ),
    (
        "broken hosts.toml",
        |f| f.hosts_dirs[0].registries[0].problem = Some("not valid TOML".into()),
        check::REGISTRY_HOSTS,
        Level::Warn,
    ),
    (
        "CRI down",
        |f| f.cri = Some(Err("connection refused".into())),
        check::CRI,
        Level::Fail,
    ),
    (
        "runtime not ready",
        |f| {
            f.cri = Some(Ok(CriFacts {
                runtime_ready: false,
                runtime_detail: "x".into(),
            }))
        },
        check::CRI,
        Level::Fail,
    ),
    (
        "no sandbox image",
        |f| f.sandbox_image = Some(SandboxImage::Absent("pause".into())),
        check::SANDBOX_IMAGE,
        Level::Warn,
    ),
    (
        "kubeconfig not ready",
        |f| f.credentials = Some(Credentials::Waiting("no cert".into())),
        check::CREDENTIALS,
        Level::Warn,
    ),
    (
        "API server down",
        |f| f.api = Some(Err("connection refused".into())),
        check::API_SERVER,
        Level::Fail,
    ),
    (
        "another node's identity",
        |f| set_user(f, "system:node:n2"),
        check::IDENTITY,
        Level::Fail,
    ),
    (
        "a dedicated identity of another node",
        |f| set_user(f, "containerd.x-k8s.io:node:n2"),
        check::IDENTITY,
        Level::Fail,
    ),
    (
        "an admin identity",
        |f| set_user(f, "kubernetes-admin"),
        check::IDENTITY,
        Level::Warn,
    ),
    (
        "skew of 4 s",
        |f| set_skew(f, Some(-4.0)),
        check::CLOCK_SKEW,
        Level::Warn,
    ),
    (
        "skew of 30 s",
        |f| set_skew(f, Some(30.0)),
        check::CLOCK_SKEW,
        Level::Fail,
    ),
    (
        "no Date header",
        |f| set_skew(f, None),
        check::CLOCK_SKEW,
        Level::Warn,
    ),
    (
        "full state disk",
        |f| f.space[0].free = Ok(10 << 20),
        check::DISK_STATE,
        Level::Fail,
    ),
    (
        "low install disk",
        |f| f.space[1].free = Ok(500 << 20),
        check::DISK_INSTALL,
        Level::Warn,
    ),
];

#[test]
fn each_broken_precondition_gets_its_level_and_a_remedy() {
    for (what, brk, id, want) in ROWS {
        let mut f = healthy();
        brk(&mut f);
        assert_eq!(level_of(&f, id), *want, "{what}");
        let report = super::super::Report::new(&f);
        assert_eq!(report.blocking, *want == Level::Fail, "{what}");
        let finding = report
            .findings
            .iter()
            .find(|x| x.check == *id && x.level == *want)
            .unwrap();
        if *want == Level::Fail {
            assert!(finding.remedy.is_some(), "{what}: no remedy in {finding:?}");
        }
        // nothing else changed level
        for other in judge(&f).iter().filter(|x| x.check != *id) {
            assert!(other.level <= Level::Skip, "{what} moved {other:?}");
        }
    }
}

fn set_user(f: &mut Facts, user: &str) {
    if let Some(Ok(api)) = &mut f.api {
        api.identity = Ok(Identity {
            username: user.into(),
            groups: vec![],
        });
    }
}

fn set_skew(f: &mut Facts, s: Option<f64>) {
    if let Some(Ok(api)) = &mut f.api {
        api.skew_secs = s;
    }
}

#[test]
fn what_containerd_cannot_answer_is_skipped_not_blamed_twice() {
    let mut f = healthy();
    f.cri = Some(Err("refused".into()));
    f.sandbox_image = None;
    f.version = Err("refused".into());
    assert_eq!(level_of(&f, check::CRI), Level::Fail);
    assert_eq!(level_of(&f, check::VERSION), Level::Skip);
    assert_eq!(level_of(&f, check::SANDBOX_IMAGE), Level::Skip);
}

#[test]
fn an_image_root_is_judged_on_its_files_only() {
    let mut f = healthy();
    f.target = Target::Image {
        root: "/img".into(),
    };
    f.unit = None;
    f.cri = None;
    f.sandbox_image = None;
    f.credentials = None;
    f.api = None;
    f.proxies = vec![];
    f.version = Err("`containerd --version` could not be run in the image".into());
    for id in [
        check::UNIT,
        check::CRI,
        check::SANDBOX_IMAGE,
        check::CREDENTIALS,
        check::PROXY,
    ] {
        assert_eq!(level_of(&f, id), Level::Skip, "{id}");
    }
    assert_eq!(level_of(&f, check::VERSION), Level::Warn);
    assert!(!super::super::Report::new(&f).blocking);
}

#[test]
fn the_text_report_says_what_blocks_and_what_to_do() {
    let mut f = healthy();
    f.cri = Some(Err("connection refused".into()));
    let text = super::super::Report::new(&f).to_text();
    assert!(text.starts_with("shim-agent doctor: node n1\n"), "{text}");
    assert!(text.contains("FAIL  cri.socket"), "{text}");
    assert!(text.contains("-> is containerd running"), "{text}");
    assert!(
        text.ends_with("1 problem(s) block installs; 0 warning(s)\n"),
        "{text}"
    );
}

#[test]
fn the_signature_policy_is_told_and_one_that_cannot_load_blocks_installs() {
    let mut f = healthy();
    let summary = |f: &Facts| {
        judge(f)
            .into_iter()
            .find(|x| x.check == check::SIGNATURE_POLICY)
            .map(|x| (x.level, x.summary))
            .unwrap()
    };
    let (level, said) = summary(&f);
    assert_eq!(level, Level::Info);
    assert!(said.contains("no node signature policy"), "{said}");
    f.signatures = Ok(SignatureFacts {
        require: true,
        identities: 1,
        keys: 2,
        trusted_root: None,
        without_signed_time: false,
    });
    let (level, said) = summary(&f);
    assert_eq!(level, Level::Ok);
    assert!(
        said.contains("1 identities and 2 keys")
            && said.contains("public-good")
            && said.ends_with("refused"),
        "{said}"
    );
    f.signatures = Err("/etc/shim-agent/keys/a.pub: bad PEM".into());
    assert_eq!(summary(&f).0, Level::Fail);
    assert!(crate::doctor::Report::new(&f).blocking);
}
