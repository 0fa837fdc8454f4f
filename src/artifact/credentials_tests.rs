use super::*;

#[test]
fn a_docker_config_gives_the_registrys_credentials_in_either_form() {
    let cfg = r#"{"auths": {
        "https://index.docker.io/v1/": {"auth": "aHViOmh1Yi1wYXNz"},
        "registry.example:5000": {"username": "u", "password": "p@ss:word"},
        "broken.example": {"auth": "%%%"}
    }}"#;
    let hub = from_docker_config(cfg, "docker.io").unwrap().unwrap();
    assert_eq!(
        (hub.username.as_str(), hub.password.as_str()),
        ("hub", "hub-pass")
    );
    let r = from_docker_config(cfg, "registry.example:5000")
        .unwrap()
        .unwrap();
    assert_eq!(r.password, "p@ss:word");
    assert_eq!(
        from_docker_config(cfg, "registry.example").unwrap(),
        None,
        "the port is part of the host"
    );
    let e = from_docker_config(cfg, "broken.example").unwrap_err();
    assert_eq!(e, "the auth of broken.example is not base64");
    let e = from_docker_config("{\"auths\": [", "x").unwrap_err();
    assert!(e.starts_with("not a Docker config.json"), "{e}");
}

#[test]
fn secrets_never_print() {
    let s = Secret {
        username: "u".into(),
        password: "hunter2".into(),
    };
    assert_eq!(format!("{s} {s:?}"), "*** Secret(***)");
    let a = Answer {
        secret: Some(s),
        cache_key_type: "Image".into(),
        cache_for: Duration::ZERO,
    };
    assert!(!format!("{a:?}").contains("hunter2"));
}

#[test]
fn images_match_as_the_kubelet_matches_them() {
    for (pattern, image, want) in [
        (
            "*.dkr.ecr.*.amazonaws.com",
            "123.dkr.ecr.us-east-1.amazonaws.com/shims/spin",
            true,
        ),
        (
            "*.dkr.ecr.*.amazonaws.com",
            "a.b.dkr.ecr.us-east-1.amazonaws.com/x",
            false,
        ),
        ("registry.example", "registry.example/x/y", true),
        ("registry.example", "registry.example:5000/x", false),
        ("registry.example:5000", "registry.example:5000/x", true),
        ("registry.example/team", "registry.example/team/shim", true),
        (
            "registry.example/team",
            "registry.example/other/shim",
            false,
        ),
        ("*.example", "example/x", false),
        ("reg*.example", "registry.example/x", true),
        ("https://registry.example", "registry.example/x", true),
    ] {
        assert_eq!(image_matches(pattern, image), want, "{pattern} ~ {image}");
    }
}

#[test]
fn a_provider_config_is_checked_as_the_kubelet_would() {
    let yaml = r#"apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
- name: ecr-credential-provider
  matchImages: ["*.dkr.ecr.*.amazonaws.com"]
  defaultCacheDuration: "12h"
  apiVersion: credentialprovider.kubelet.k8s.io/v1
  args: [get-credentials]
  env: [{name: AWS_PROFILE, value: nodes}]
- name: private
  matchImages: ["registry.example:5000"]
  apiVersion: credentialprovider.kubelet.k8s.io/v1
"#;
    let p = parse_provider_config(yaml).unwrap();
    assert_eq!(p.len(), 2);
    assert_eq!(
        provider_for(&p, "registry.example:5000/shims/x")
            .unwrap()
            .name,
        "private"
    );
    assert_eq!(provider_for(&p, "ghcr.io/x"), None);
    for (bad, why) in [
        (
            yaml.replace("name: private", "name: ../bin/sh"),
            "provider name \"../bin/sh\" is not a file name",
        ),
        (
            yaml.replace("credentialprovider.kubelet.k8s.io/v1\n\"", "x"),
            "",
        ),
        (
            yaml.replacen(
                "apiVersion: credentialprovider.kubelet.k8s.io/v1",
                "apiVersion: credentialprovider.kubelet.k8s.io/v1alpha1",
                1,
            ),
            "provider ecr-credential-provider: apiVersion",
        ),
        (
            yaml.replace("kind: CredentialProviderConfig", "kind: Pod"),
            "kind \"Pod\"",
        ),
        ("providers: 3".to_string(), "not a CredentialProviderConfig"),
    ] {
        if why.is_empty() {
            continue;
        }
        let e = parse_provider_config(&bad).unwrap_err();
        assert!(e.starts_with(why), "{e}");
    }
}

#[test]
fn a_plugins_answer_gives_the_best_matching_auth_and_its_cache_rule() {
    let out = br#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse",
        "cacheKeyType":"Registry","cacheDuration":"1h30m",
        "auth":{"registry.example:5000":{"username":"wide","password":"w"},
                "registry.example:5000/shims":{"username":"narrow","password":"n"}}}"#;
    let a = parse_provider_response(out, "registry.example:5000/shims/demo", None).unwrap();
    assert_eq!(a.secret.unwrap().username, "narrow");
    assert_eq!(a.cache_key_type, "Registry");
    assert_eq!(a.cache_for, Duration::from_secs(5400));
    let a = parse_provider_response(
        br#"{"kind":"CredentialProviderResponse","auth":{}}"#,
        "x/y",
        Some("12h"),
    )
    .unwrap();
    assert_eq!((a.secret, a.cache_for), (None, Duration::from_secs(43200)));
    let e = parse_provider_response(b"password=hunter2", "x/y", None).unwrap_err();
    assert!(
        !e.contains("hunter2") && e.starts_with("its answer is not"),
        "{e}"
    );
}

#[test]
fn go_durations_parse_and_junk_does_not() {
    for (t, secs) in [
        ("1h0m0s", 3600.0),
        ("90s", 90.0),
        ("500ms", 0.5),
        ("0", 0.0),
        ("1.5h", 5400.0),
    ] {
        assert_eq!(
            parse_go_duration(t).unwrap(),
            Duration::from_secs_f64(secs),
            "{t}"
        );
    }
    for t in ["", "h", "5", "5x", "-1s", "1e400h"] {
        assert!(parse_go_duration(t).is_err(), "{t}");
    }
}

#[test]
fn an_artifact_server_gets_its_hosts_credential_and_no_other() {
    let text = r#"
[hosts."artifacts.example:8443"]
username = "ci"
password = "art-s3cret"

[hosts."Files.Example"]
bearer-token = "tok-s3cret"
"#;
    match http_credential(text, "artifacts.example:8443").unwrap() {
        Some(HttpCredential::Basic(s)) => assert_eq!(
            (s.username.as_str(), s.password.as_str()),
            ("ci", "art-s3cret")
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        http_credential(text, "files.example").unwrap(),
        Some(HttpCredential::Bearer("tok-s3cret".into()))
    );
    assert_eq!(http_credential(text, "artifacts.example").unwrap(), None);
    let e = http_credential("[hosts.\"x\"]\nusername = \"u\"\n", "x").unwrap_err();
    assert_eq!(
        e,
        "hosts.\"x\": give username and password, or bearer-token"
    );
    let e = http_credential("[hosts.\"x\"]\npasword = \"s3cret-typo\"\n", "x").unwrap_err();
    assert!(
        e.starts_with("not a credentials file") && !e.contains("s3cret-typo"),
        "{e}"
    );
    assert!(!format!("{:?}", http_credential(text, "files.example").unwrap()).contains("tok"));
}
