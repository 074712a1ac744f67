//! Tests of the configuration: defaults, flags over the file, the checks on each setting, TLS
//! files and the bootstrap token.

use super::*;

#[test]
fn no_flags_gives_the_embedded_single_node_default() {
    let config = Config::from_settings(Settings::default()).expect("defaults are valid");
    assert_eq!(config.id, 1);
    assert_eq!(config.listen.to_string(), DEFAULT_LISTEN);
    assert_eq!(config.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
    assert_eq!(
        config.initial_cluster,
        BTreeMap::from([(1, DEFAULT_LISTEN.to_string())])
    );
    assert_eq!(
        config.metrics_listen.map(|a| a.to_string()).as_deref(),
        Some(DEFAULT_METRICS_LISTEN)
    );
    assert_eq!(config.log_format, LogFormat::Text);
}

#[test]
fn worker_threads_come_from_the_flag_or_the_file_and_are_bounded() -> anyhow::Result<()> {
    assert_eq!(
        Config::from_settings(Settings::default())?.worker_threads,
        None
    );
    let flag = |n: usize| {
        Config::from_settings(Settings {
            worker_threads: Some(n),
            ..Settings::default()
        })
    };
    assert_eq!(flag(1)?.worker_threads, Some(1));
    for bad in [0, MAX_WORKER_THREADS + 1] {
        let Err(err) = flag(bad) else {
            anyhow::bail!("--worker-threads {bad} accepted")
        };
        assert!(err.to_string().contains("--worker-threads"), "{err}");
    }
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("conchd.toml");
    std::fs::write(&file, "worker_threads = 3\n")?;
    let from_file = Config::from_settings(Settings {
        config: Some(file),
        ..Settings::default()
    })?;
    assert_eq!(from_file.worker_threads, Some(3));
    Ok(())
}

#[test]
fn the_status_page_is_off_unless_asked_for() -> anyhow::Result<()> {
    let with = |ui: Option<&str>| {
        Config::from_settings(Settings {
            ui_listen: ui.map(str::to_string),
            ..Settings::default()
        })
    };
    assert_eq!(with(None)?.ui_listen, None, "off by default");
    assert_eq!(with(Some("off"))?.ui_listen, None);
    assert_eq!(
        with(Some("127.0.0.1:7201"))?.ui_listen,
        Some("127.0.0.1:7201".parse()?)
    );
    let message = |r: Result<Config, ConfigError>| r.err().map(|e| e.to_string());
    assert!(
        message(with(Some("nowhere"))).is_some_and(|m| m.contains("--ui-listen")),
        "a bad address names the flag"
    );
    assert!(
        message(with(Some(DEFAULT_LISTEN))).is_some_and(|m| m.contains("the --listen address")),
        "the page cannot share the gRPC port"
    );
    assert!(
        message(with(Some(DEFAULT_METRICS_LISTEN)))
            .is_some_and(|m| m.contains("the --metrics-listen address")),
        "nor the metrics port"
    );
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("conchd.toml");
    std::fs::write(&file, "ui_listen = \"127.0.0.1:0\"\n")?;
    let from_file = Config::from_settings(Settings {
        config: Some(file),
        ..Settings::default()
    })?;
    assert_eq!(from_file.ui_listen, Some("127.0.0.1:0".parse()?));
    Ok(())
}

#[test]
fn metrics_and_log_format_are_checked() {
    let with = |metrics: Option<&str>, format: Option<&str>| {
        Config::from_settings(Settings {
            metrics_listen: metrics.map(str::to_string),
            log_format: format.map(str::to_string),
            ..Settings::default()
        })
    };
    let off = with(Some("off"), Some("json")).expect("off and json are valid");
    assert_eq!(off.metrics_listen, None);
    assert_eq!(off.log_format, LogFormat::Json);
    let message = |r: Result<Config, ConfigError>| r.err().map(|e| e.to_string());
    assert!(
        message(with(Some("nowhere"), None)).is_some_and(|m| m.contains("--metrics-listen")),
        "a bad address names the flag"
    );
    assert!(
        message(with(Some(DEFAULT_LISTEN), None))
            .is_some_and(|m| m.contains("is the --listen address")),
        "metrics cannot share the gRPC port"
    );
    assert!(
        message(with(None, Some("xml"))).is_some_and(|m| m.contains("text or json")),
        "an unknown format is refused"
    );
}

#[test]
fn listening_on_all_interfaces_needs_an_advertised_address() {
    let flags = Settings {
        listen: Some("0.0.0.0:7001".into()),
        ..Settings::default()
    };
    let err = Config::from_settings(flags).expect_err("0.0.0.0 cannot be advertised");
    assert!(err.to_string().contains("--advertise"), "{err}");
    let flags = Settings {
        listen: Some("0.0.0.0:7001".into()),
        advertise: Some("127.0.0.1:7001".into()),
        ..Settings::default()
    };
    assert!(Config::from_settings(flags).is_ok());
}

#[test]
fn initial_cluster_parses_and_rejects_bad_entries() {
    let members = parse_initial_cluster("1=127.0.0.1:7001, 2=127.0.0.1:7002").expect("valid");
    assert_eq!(members.len(), 2);
    for bad in [
        "",
        "1",
        "x=127.0.0.1:1",
        "0=127.0.0.1:1",
        "1=127.0.0.1:1,1=127.0.0.1:2",
        "1=nohost",
    ] {
        assert!(
            parse_initial_cluster(bad).is_err(),
            "{bad:?} must be refused"
        );
    }
}

#[test]
fn the_cluster_name_comes_from_the_flag_or_the_file_and_is_checked() -> anyhow::Result<()> {
    assert_eq!(
        Config::from_settings(Settings::default())?.cluster_name,
        None
    );
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("conchd.toml");
    std::fs::write(&file, "cluster_name = \"prod-a\"\n")?;
    let from_file = Config::from_settings(Settings {
        config: Some(file.clone()),
        ..Settings::default()
    })?;
    assert_eq!(from_file.cluster_name.as_deref(), Some("prod-a"));
    let flag_wins = Config::from_settings(Settings {
        config: Some(file),
        cluster_name: Some("prod-b".into()),
        ..Settings::default()
    })?;
    assert_eq!(flag_wins.cluster_name.as_deref(), Some("prod-b"));
    for bad in ["", "prod a", "x/y", &"n".repeat(65)] {
        let refused = Config::from_settings(Settings {
            cluster_name: Some(bad.to_string()),
            ..Settings::default()
        });
        let Err(ConfigError::Invalid(message)) = refused else {
            anyhow::bail!("{bad:?} was accepted");
        };
        assert!(message.starts_with("--cluster-name"), "{message}");
    }
    Ok(())
}

#[test]
fn early_replication_is_on_unless_the_flag_or_the_file_turns_it_off() -> anyhow::Result<()> {
    assert!(Config::from_settings(Settings::default())?.early_replication);
    let off_by_flag = Config::from_settings(Settings {
        no_early_replication: true,
        ..Settings::default()
    })?;
    assert!(!off_by_flag.early_replication);
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("conchd.toml");
    std::fs::write(&file, "no_early_replication = true\n")?;
    let off_by_file = Config::from_settings(Settings {
        config: Some(file),
        ..Settings::default()
    })?;
    assert!(!off_by_file.early_replication);
    Ok(())
}

#[test]
fn the_per_address_connection_cap_comes_from_the_flag_or_the_file_and_is_checked()
-> anyhow::Result<()> {
    let default = Config::from_settings(Settings::default())?;
    assert_eq!(
        default.max_connections_per_address,
        crate::net::connections::DEFAULT_PER_ADDRESS
    );
    assert!(!default.adopt_data_dir);
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("conchd.toml");
    std::fs::write(
        &file,
        "max_connections_per_address = 50\nadopt_data_dir = true\n",
    )?;
    let from_file = Config::from_settings(Settings {
        config: Some(file),
        ..Settings::default()
    })?;
    assert_eq!(from_file.max_connections_per_address, 50);
    assert!(from_file.adopt_data_dir);
    for bad in [0, crate::net::connections::MAX_CONNECTIONS + 1] {
        let refused = Config::from_settings(Settings {
            max_connections_per_address: Some(bad),
            ..Settings::default()
        });
        let Err(ConfigError::Invalid(message)) = refused else {
            anyhow::bail!("{bad} was accepted");
        };
        assert!(
            message.starts_with("--max-connections-per-address must be between 1 and"),
            "{message}"
        );
    }
    Ok(())
}

#[test]
fn join_comes_from_the_flag_or_the_config_file() {
    let plain = Config::from_settings(Settings::default()).expect("valid");
    assert!(!plain.join, "a node bootstraps unless told to join");
    let flag = Config::from_settings(Settings {
        join: true,
        ..Settings::default()
    })
    .expect("valid");
    assert!(flag.join);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("conchd.toml");
    std::fs::write(&file, "join = true\n").expect("write config");
    let from_file = Config::from_settings(Settings {
        config: Some(file),
        ..Settings::default()
    })
    .expect("valid");
    assert!(from_file.join);
}

#[test]
fn node_must_be_in_its_initial_cluster() {
    let flags = Settings {
        id: Some(4),
        initial_cluster: Some("1=127.0.0.1:7001".into()),
        ..Settings::default()
    };
    let err = Config::from_settings(flags).expect_err("node 4 is not a member");
    assert!(err.to_string().contains("does not include"), "{err}");
}

#[test]
fn file_settings_apply_and_flags_win() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("conchd.toml");
    std::fs::write(
        &path,
        "id = 2\nlisten = \"127.0.0.1:7002\"\nheartbeat_ms = 50\nelection_timeout_ms = 400\n",
    )
    .expect("write config");
    let flags = Settings {
        config: Some(path.clone()),
        heartbeat_ms: Some(80),
        initial_cluster: Some("2=127.0.0.1:7002".into()),
        ..Settings::default()
    };
    let config = Config::from_settings(flags).expect("valid");
    assert_eq!(config.id, 2);
    assert_eq!(config.heartbeat, Duration::from_millis(80));
    assert_eq!(config.election_timeout, Duration::from_millis(400));

    std::fs::write(&path, "bogus_key = 1\n").expect("write config");
    let err = Config::from_settings(Settings {
        config: Some(path.clone()),
        ..Settings::default()
    })
    .expect_err("unknown key");
    assert!(err.to_string().contains("bogus_key"), "{err}");
    assert!(err.to_string().contains("line 1, column 1"), "{err}");
    assert!(!err.to_string().contains('\n'), "one line: {err}");

    std::fs::write(&path, "id = 2\nheartbeat_ms = \"fast\"\n").expect("write config");
    let err = Config::from_settings(Settings {
        config: Some(path),
        ..Settings::default()
    })
    .expect_err("a string for a number");
    assert!(err.to_string().contains("line 2"), "{err}");
    assert!(!err.to_string().contains('\n'), "one line: {err}");
}

/// A self-signed certificate and its key, written to `dir` as `<stem>.crt`/`<stem>.key`.
fn self_signed(dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("sign");
    let (cert_path, key_path) = (
        dir.join(format!("{stem}.crt")),
        dir.join(format!("{stem}.key")),
    );
    std::fs::write(&cert_path, cert.pem()).expect("write cert");
    crate::base::private_file::write(&key_path, key.serialize_pem()).expect("write key");
    (cert_path, key_path)
}

fn tls_flags(cert: Option<&Path>, key: Option<&Path>) -> Settings {
    Settings {
        tls_cert: cert.map(Path::to_path_buf),
        tls_key: key.map(Path::to_path_buf),
        ..Settings::default()
    }
}

#[test]
fn tls_settings_are_checked_before_anything_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = self_signed(dir.path(), "node");
    let (_, other_key) = self_signed(dir.path(), "other");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "hello").expect("write");
    let missing = dir.path().join("missing.pem");

    let config = Config::from_settings(tls_flags(Some(&cert), Some(&key))).expect("valid");
    let tls = config.tls.expect("TLS on");
    assert!(!tls.peer_mtls() && !tls.client_certs_required());
    assert!(
        Config::from_settings(Settings::default())
            .expect("valid")
            .tls
            .is_none()
    );

    let refused = |flags: Settings, expected: &str| {
        let err = Config::from_settings(flags)
            .expect_err(expected)
            .to_string();
        assert!(err.contains(expected), "{expected}: {err}");
        assert!(!err.contains('\n'), "one line: {err}");
    };
    refused(tls_flags(Some(&cert), None), "--tls-cert needs --tls-key");
    refused(tls_flags(None, Some(&key)), "--tls-key needs --tls-cert");
    refused(
        Settings {
            client_ca: Some(cert.clone()),
            ..Settings::default()
        },
        "--client-ca needs --tls-cert",
    );
    refused(tls_flags(Some(&missing), Some(&key)), "read --tls-cert");
    refused(tls_flags(Some(&garbage), Some(&key)), "--tls-cert");
    let garbage_key = dir.path().join("garbage.key");
    crate::base::private_file::write(&garbage_key, "hello").expect("write");
    refused(tls_flags(Some(&cert), Some(&garbage_key)), "--tls-key");
    // A key that group or others may read is refused, with the fix.
    use std::os::unix::fs::PermissionsExt;
    let shared_key = dir.path().join("shared.key");
    std::fs::copy(&key, &shared_key).expect("copy");
    std::fs::set_permissions(&shared_key, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    refused(tls_flags(Some(&cert), Some(&shared_key)), "mode 0640");
    refused(tls_flags(Some(&cert), Some(&shared_key)), "chmod 600");
    refused(
        tls_flags(Some(&cert), Some(&other_key)),
        "does not fit --tls-cert",
    );
    refused(
        Settings {
            peer_ca: Some(garbage.clone()),
            ..tls_flags(Some(&cert), Some(&key))
        },
        "--peer-ca",
    );
    refused(
        Settings {
            peer_crl: Some(garbage.clone()),
            ..tls_flags(Some(&cert), Some(&key))
        },
        "--peer-crl needs --peer-ca",
    );
    refused(
        Settings {
            peer_ca: Some(cert.clone()),
            peer_crl: Some(garbage.clone()),
            ..tls_flags(Some(&cert), Some(&key))
        },
        "--peer-crl",
    );
    refused(
        Settings {
            initial_cluster: Some("1=127.0.0.1:7001,2=127.0.0.1:7002".into()),
            ..tls_flags(Some(&cert), Some(&key))
        },
        "needs --peer-ca",
    );

    // The same settings from the config file.
    let file = dir.path().join("conchd.toml");
    std::fs::write(
        &file,
        format!(
            "tls_cert = {:?}\ntls_key = {:?}\nclient_ca = {:?}\npeer_ca = {:?}\n",
            cert.display().to_string(),
            key.display().to_string(),
            cert.display().to_string(),
            cert.display().to_string()
        ),
    )
    .expect("write config");
    let config = Config::from_settings(Settings {
        config: Some(file),
        ..Settings::default()
    })
    .expect("valid");
    let tls = config.tls.expect("TLS on");
    assert!(tls.peer_mtls() && tls.client_certs_required());
}

#[test]
fn a_bad_new_certificate_keeps_the_old_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = self_signed(dir.path(), "node");
    let tls = Tls::load(TlsFiles {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: None,
        peer_ca: None,
        peer_crl: None,
    })
    .expect("valid");
    assert!(!tls.reload(false).expect("unchanged"), "nothing changed");
    std::fs::write(&cert, "broken").expect("write");
    assert!(tls.reload(true).is_err(), "a broken file is refused");
    let (new_cert, new_key) = self_signed(dir.path(), "next");
    std::fs::rename(new_key, &key).expect("rename");
    std::fs::rename(new_cert, &cert).expect("rename");
    assert!(tls.reload(true).expect("valid again"));
}

#[test]
fn nodes_on_one_host_get_metrics_ports_of_their_own() {
    let metrics = |listen: &str| {
        Config::from_settings(Settings {
            listen: Some(listen.into()),
            ..Settings::default()
        })
        .expect("valid")
        .metrics_listen
        .map(|a| a.to_string())
    };
    assert_eq!(
        metrics("127.0.0.1:7001").as_deref(),
        Some(DEFAULT_METRICS_LISTEN)
    );
    assert_eq!(metrics("127.0.0.1:7004").as_deref(), Some("127.0.0.1:7104"));
    // Metrics stay on loopback whatever the client address.
    assert_eq!(
        default_metrics_listen("10.0.0.1:7002".parse().expect("addr")),
        "127.0.0.1:7102"
    );
    assert_eq!(
        default_metrics_listen("127.0.0.1:0".parse().expect("addr")),
        "127.0.0.1:0"
    );
    assert_eq!(
        default_metrics_listen("127.0.0.1:65500".parse().expect("addr")),
        "127.0.0.1:0"
    );
}

#[test]
fn a_separate_peer_port_is_the_address_in_the_membership() {
    let flags = |peer_listen: Option<&str>, peer_advertise: Option<&str>| Settings {
        listen: Some("127.0.0.1:7001".into()),
        peer_listen: peer_listen.map(str::to_string),
        peer_advertise: peer_advertise.map(str::to_string),
        ..Settings::default()
    };
    let shared = Config::from_settings(flags(None, None)).expect("valid");
    assert_eq!(shared.peer_listen, None);
    assert_eq!(shared.peer_advertise, "127.0.0.1:7001");
    let split = Config::from_settings(flags(Some("127.0.0.1:7201"), None)).expect("valid");
    assert_eq!(split.peer_advertise, "127.0.0.1:7201");
    assert_eq!(split.advertise, "127.0.0.1:7001");
    assert_eq!(
        split.initial_cluster.get(&1).map(String::as_str),
        Some("127.0.0.1:7201")
    );
    for (listen, advertise, says) in [
        (Some("127.0.0.1:7001"), None, "is the --listen address"),
        (None, Some("127.0.0.1:7201"), "needs --peer-listen"),
        (Some("0.0.0.0:7201"), None, "--peer-advertise"),
    ] {
        let err = Config::from_settings(flags(listen, advertise)).expect_err("refused");
        assert!(err.to_string().contains(says), "{err}");
    }
    // --initial-cluster names the peer address.
    let err = Config::from_settings(Settings {
        initial_cluster: Some("1=127.0.0.1:7001,2=127.0.0.1:7002".into()),
        ..flags(Some("127.0.0.1:7201"), None)
    })
    .expect_err("client address in --initial-cluster");
    assert!(err.to_string().contains("its peer service"), "{err}");
}

#[test]
fn the_bootstrap_token_file_is_read_hashed_and_checked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("admin.token");
    crate::base::private_file::write(&token, "  0123456789abcdef0123456789abcdef\n")
        .expect("write token");
    let secret = dir.path().join("peer.secret");
    crate::base::private_file::write(&secret, "fedcba9876543210fedcba9876543210\n")
        .expect("write secret");
    let toml = dir.path().join("conchd.toml");
    let key = format!(
        "bootstrap_admin_token_file = {:?}\n",
        token.display().to_string()
    );
    std::fs::write(&toml, &key).expect("write config");
    // Access control without peer authentication cannot exist: refused in one line.
    let err = Config::from_settings(Settings {
        config: Some(toml.clone()),
        ..Settings::default()
    })
    .expect_err("no peer authentication");
    assert!(
        err.to_string().contains("needs peer authentication"),
        "{err}"
    );
    assert!(!err.to_string().contains('\n'), "{err}");
    let key = format!(
        "{key}peer_secret_file = {:?}\n",
        secret.display().to_string()
    );
    std::fs::write(&toml, key).expect("write config");
    let config = Config::from_settings(Settings {
        config: Some(toml),
        ..Settings::default()
    })
    .expect("valid");
    assert!(config.peers_authenticate());
    assert_eq!(
        config.peer_secret,
        Some(crate::support::secret::hash_token(
            "fedcba9876543210fedcba9876543210"
        ))
    );
    assert_eq!(
        config.bootstrap_admin_token,
        Some(crate::support::secret::hash_token(
            "0123456789abcdef0123456789abcdef"
        ))
    );
    // Readable by others: refused, whatever it holds, with the fix.
    use std::os::unix::fs::PermissionsExt;
    let shared = dir.path().join("shared.token");
    std::fs::write(&shared, "0123456789abcdef0123456789abcdef\n").expect("write token");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    for flags in [
        Settings {
            bootstrap_admin_token_file: Some(shared.clone()),
            peer_secret_file: Some(secret.clone()),
            ..Settings::default()
        },
        Settings {
            peer_secret_file: Some(shared.clone()),
            ..Settings::default()
        },
    ] {
        let err = Config::from_settings(flags).expect_err("refused");
        let text = err.to_string();
        assert!(
            text.contains("mode 0644") && text.contains("chmod 600") && !text.contains('\n'),
            "{text}"
        );
    }
    crate::base::private_file::write(&token, "short\n").expect("write token");
    let missing = dir.path().join("missing.token");
    for (path, says) in [(&token, "at least 32"), (&missing, "missing.token")] {
        let err = Config::from_settings(Settings {
            bootstrap_admin_token_file: Some(path.clone()),
            peer_secret_file: Some(secret.clone()),
            ..Settings::default()
        })
        .expect_err("refused");
        assert!(err.to_string().contains(says), "{err}");
        assert!(
            err.to_string().contains("--bootstrap-admin-token-file"),
            "{err}"
        );
        // One line, words one space apart (no indentation of a continued string).
        assert!(!err.to_string().contains("  "), "{err}");
    }
}
