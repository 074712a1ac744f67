//! The command line as clap parses it: flags, conflicts, values and their errors.

use super::values::size_arg;
use super::*;
use clap::CommandFactory;

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    use clap::FromArgMatches;
    let matches = Cli::command()
        .try_get_matches_from(std::iter::once("conch").chain(args.iter().copied()))?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    if let (Command::Sema(s), Some(("sema", sub))) = (&mut cli.command, matches.subcommand()) {
        s.resolve_members(sub)
            .map_err(|e| clap::Error::raw(clap::error::ErrorKind::ValueValidation, e))?;
    }
    Ok(cli)
}

fn sema(args: &[&str]) -> SemaArgs {
    match parse(args)
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
        .command
    {
        Command::Sema(s) => s,
        other => panic!("not sema: {other:?}"),
    }
}

#[test]
fn definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn sizes_take_binary_and_decimal_units_and_refuse_the_rest() {
    assert_eq!(size_arg("500000"), Ok(500_000));
    assert_eq!(size_arg("64MiB"), Ok(64 << 20));
    assert_eq!(size_arg("2GiB"), Ok(2 << 30));
    assert_eq!(size_arg("3KB"), Ok(3_000));
    assert_eq!(size_arg("7B"), Ok(7));
    for bad in [
        "",
        "MiB",
        "12 parsecs",
        "1.5GiB",
        "-3",
        "99999999999999999999GiB",
    ] {
        assert!(size_arg(bad).is_err(), "{bad:?}");
    }
    assert!(size_arg("3mb").unwrap_err().contains("unknown size unit"));
}

#[test]
fn the_seed_examples_parse() {
    let s = sema(&[
        "sema",
        "certs-renew",
        "--max",
        "1",
        "--nonblock",
        "--",
        "./renew.sh",
    ]);
    assert_eq!(
        (s.name.as_str(), s.first_max(), s.nonblock),
        ("certs-renew", 1, true)
    );
    assert_eq!(s.command, ["./renew.sh"]);
    assert_eq!(s.wait_bound(), Some(Duration::ZERO));
    assert_eq!(s.ttl, Duration::from_secs(10));
    assert_eq!(s.kill_after, Duration::from_secs(5));

    let s = sema(&[
        "sema",
        "heavy-jobs",
        "--max",
        "2",
        "--",
        "/usr/local/bin/run-job.sh",
    ]);
    assert_eq!(s.wait_bound(), None);
    assert_eq!(s.command, ["/usr/local/bin/run-job.sh"]);

    let s = sema(&["sema", "heavy-jobs", "--max", "2", "--who"]);
    assert!(s.who && !s.json && s.command.is_empty());
}

#[test]
fn and_starts_a_member_whose_max_and_weight_follow_it() {
    let s = sema(&[
        "sema", "a", "--max", "1", "--and", "b", "--max", "3", "--and", "c", "--weight", "2",
        "--max", "2", "--wait", "1m", "--", "cmd", "--and", "x",
    ]);
    let member = |name: &str, max, weight| Member {
        name: name.into(),
        max,
        weight,
    };
    assert_eq!(
        s.members,
        vec![member("a", 1, 1), member("b", 3, 1), member("c", 2, 2)]
    );
    assert_eq!(s.command, ["cmd", "--and", "x"]);
    assert_eq!(s.first_max(), 1);
    // The first member's own --weight comes before the first --and.
    let s = sema(&[
        "sema", "a", "--max", "4", "--weight", "3", "--and", "b", "--max", "1", "--", "true",
    ]);
    assert_eq!(s.members, vec![member("a", 4, 3), member("b", 1, 1)]);
    // One semaphore, as always.
    let s = sema(&["sema", "a", "--max", "2", "--", "true"]);
    assert_eq!(s.members, vec![member("a", 2, 1)]);
}

#[test]
fn bad_member_lists_are_refused_with_the_member_named() {
    let refused = |args: &[&str]| match parse(args) {
        Err(e) => e.to_string(),
        Ok(cli) => panic!("{args:?} should be refused, got {:?}", cli.command),
    };
    let e = refused(&["sema", "a", "--max", "1", "--and", "b", "--", "true"]);
    assert!(e.contains("--max N is missing for b"), "{e}");
    let e = refused(&["sema", "a", "--max", "1", "--max", "2", "--", "true"]);
    assert!(e.contains("--max is given twice for a"), "{e}");
    let e = refused(&[
        "sema", "a", "--max", "1", "--and", "b", "--max", "2", "--weight", "3", "--", "true",
    ]);
    assert!(e.contains("--weight 3 of b exceeds its --max 2"), "{e}");
    let e = refused(&[
        "sema", "a", "--max", "1", "--and", "a", "--max", "2", "--", "true",
    ]);
    assert!(e.contains("a is named twice"), "{e}");
    let e = refused(&[
        "sema", "a", "--max", "1", "--and", "b c", "--max", "2", "--", "true",
    ]);
    assert!(e.contains("\"b c\""), "{e}");
    // --weight on one semaphore: its permits taken, at most its --max.
    let one = parse(&["sema", "a", "--max", "5", "--weight", "3", "--", "true"]).expect("ok");
    let Command::Sema(one) = one.command else {
        panic!("sema")
    };
    assert_eq!(
        one.members,
        [Member {
            name: "a".into(),
            max: 5,
            weight: 3
        }]
    );
    let e = refused(&["sema", "a", "--max", "2", "--weight", "3", "--", "true"]);
    assert!(e.contains("--weight 3 of a exceeds its --max 2"), "{e}");
    // --and goes neither with --who nor --spread.
    refused(&[
        "sema", "a", "--max", "1", "--and", "b", "--max", "1", "--who",
    ]);
    refused(&[
        "sema", "a", "--max", "1", "--and", "b", "--max", "1", "--spread", "--", "true",
    ]);
    let mut many = vec!["sema", "s", "--max", "1"];
    let names: Vec<String> = (0..16).map(|i| format!("m{i}")).collect();
    for name in &names {
        many.extend(["--and", name.as_str(), "--max", "1"]);
    }
    many.extend(["--", "true"]);
    let e = refused(&many);
    assert!(e.contains("at most 16 semaphores"), "{e}");
}

#[test]
fn command_arguments_are_passed_through_untouched() {
    let s = sema(&[
        "sema", "x", "--max", "1", "--", "ls", "-l", "--max", "--", "y",
    ]);
    assert_eq!(s.command, ["ls", "-l", "--max", "--", "y"]);
}

#[test]
fn waits_ttls_and_flags() {
    let s = sema(&[
        "sema", "x", "--max", "3", "--wait", "1m30s", "--ttl", "30s", "--spread", "--", "true",
    ]);
    assert_eq!(s.wait_bound(), Some(Duration::from_secs(90)));
    assert_eq!(s.ttl, Duration::from_secs(30));
    assert!(s.spread);
    let s = sema(&["sema", "x", "--max", "1", "--wait", "forever", "--", "true"]);
    assert_eq!(s.wait_bound(), None);
    let s = sema(&["sema", "x", "--max", "1", "--wait", "0", "--", "true"]);
    assert_eq!(s.wait_bound(), Some(Duration::ZERO));
    let s = sema(&["sema", "x", "--max", "1", "--who", "--json"]);
    assert!(s.json);
}

#[test]
fn usage_errors_are_caught_by_the_parser() {
    let bad: &[&[&str]] = &[
        &["sema", "x", "--", "true"],               // --max missing
        &["sema", "x", "--max", "0", "--", "true"], // --max 0
        &["sema", "x", "--max", "1"],               // no command
        &[
            "sema",
            "x",
            "--max",
            "1",
            "--wait",
            "5s",
            "--nonblock",
            "--",
            "true",
        ],
        &["sema", "x", "--max", "1", "--who", "--", "true"],
        &["sema", "x", "--max", "1", "--who", "--spread"],
        &["sema", "x", "--max", "1", "--json", "--", "true"], // --json without --who
        &["sema", "x", "--max", "1", "--ttl", "0s", "--", "true"],
        &["sema", "x", "--max", "1", "--ttl", "1.5s", "--", "true"],
        &["sema", "x", "--max", "1", "--ttl", "301s", "--", "true"],
        &["sema", "x", "--max", "1", "--wait", "soon", "--", "true"],
        &["completions", "tcsh"],
        &["cluster"],
        &["sema", "x", "--max", "1", "--bogus", "--", "true"], // typo'd flag
        &["sema", "x", "--max", "1", "sh", "-c", "true"],      // command needs `--`
    ];
    for args in bad {
        let refused = match parse(args) {
            Err(_) => true,
            Ok(Cli {
                command: Command::Sema(s),
                ..
            }) => s.validate().is_err(),
            Ok(_) => false,
        };
        assert!(refused, "{args:?} should be refused");
    }
}

#[test]
fn the_namespace_defaults_to_conch_and_must_be_a_name() {
    assert_eq!(
        sema(&["sema", "x", "--max", "1", "--who"]).namespace,
        "conch"
    );
    let s = sema(&["sema", "x", "--namespace", "team-a", "--max", "1", "--who"]);
    assert_eq!(s.namespace, "team-a");
    let e = elect(&["elect", "billing", "--namespace", "team-a", "--who"]).unwrap();
    assert_eq!(e.namespace, "team-a");
    for bad in ["", "team a", "team/a", &"n".repeat(129)] {
        let err =
            parse(&["sema", "x", "--namespace", bad, "--max", "1", "--who"]).expect_err("refused");
        assert!(err.to_string().contains("namespace"), "{bad:?}: {err}");
        assert!(elect(&["elect", "b", "--namespace", bad, "--who"]).is_err());
    }
}

#[test]
fn token_options_parse_and_the_token_flag_is_hidden() {
    let cli = parse(&["--token", "t", "cluster", "status"]).unwrap();
    assert_eq!(cli.token.as_deref(), Some("t"));
    let help = Cli::command().render_long_help().to_string();
    assert!(!help.contains("--token <"), "{help}");
    assert!(help.contains("--token-file"), "{help}");
    let cli = parse(&[
        "auth", "token", "create", "ci", "--role", "ci", "--out", "ci.token",
    ])
    .unwrap();
    assert!(matches!(
        cli.command,
        Command::Auth {
            command: AuthCommand::Token {
                command: TokenCommand::Create {
                    out: Some(_),
                    force: false,
                    ..
                }
            }
        }
    ));
    assert!(parse(&["auth", "token", "create", "ci", "--role", "ci", "--force"]).is_err());
    assert!(parse(&["namespace", "create", "team a"]).is_err());
    assert!(parse(&["namespace", "create", "team-a"]).is_ok());
}

#[test]
fn endpoints_timeout_and_verbosity_are_global() {
    let cli = parse(&[
        "sema",
        "x",
        "--max",
        "1",
        "--who",
        "--endpoints",
        "a:1,b:2",
        "-vv",
    ])
    .unwrap();
    assert_eq!(cli.endpoints, "a:1,b:2");
    assert_eq!(cli.verbose, 2);
    let cli = parse(&["--timeout", "2s", "cluster", "status"]).unwrap();
    assert_eq!(cli.timeout, Duration::from_secs(2));
    assert!(matches!(
        cli.command,
        Command::Cluster {
            command: ClusterCommand::Status { json: false }
        }
    ));
}

fn elect(args: &[&str]) -> Result<ElectArgs, String> {
    match parse(args).map_err(|e| e.to_string())?.command {
        Command::Elect(e) => e.validate().map(|()| e),
        other => panic!("not elect: {other:?}"),
    }
}

#[test]
fn elect_parses_and_refuses_what_does_not_fit() {
    let e = elect(&["elect", "billing", "--value", "n1:80", "--", "./s", "-x"]).unwrap();
    assert_eq!(
        (e.name.as_str(), e.value.as_deref(), e.command.as_slice()),
        (
            "billing",
            Some("n1:80"),
            ["./s".to_string(), "-x".to_string()].as_slice()
        )
    );
    assert_eq!(e.ttl, Duration::from_secs(10));
    assert_eq!(e.wait, None);
    assert_eq!(e.priority, 0);
    let e = elect(&["elect", "billing", "--priority", "7", "--", "true"]).unwrap();
    assert_eq!(e.priority, 7);
    let e = elect(&["elect", "billing", "--who", "--json"]).unwrap();
    assert!(e.who && e.json && e.command.is_empty());
    let e = elect(&["elect", "billing", "--observe"]).unwrap();
    assert!(e.observe);
    let bad: &[&[&str]] = &[
        &["elect", "billing"],
        &["elect", "billing", "--who", "--observe"],
        &["elect", "billing", "--who", "--", "true"],
        &["elect", "billing", "--observe", "--value", "v"],
        &["elect", "billing", "--json", "--", "true"],
        &["elect", "billing", "--ttl", "0s", "--", "true"],
        &["elect", "billing", "--priority", "-1", "--", "true"],
        &["elect", "billing", "--priority", "1000001", "--", "true"],
        &["elect", "billing", "--priority", "high", "--", "true"],
        &["elect", "billing", "--who", "--priority", "2"],
    ];
    for bad in bad {
        assert!(elect(bad).is_err(), "{bad:?} should be refused");
    }
    let mut cmd = Cli::command();
    let help = cmd
        .find_subcommand_mut("elect")
        .expect("elect subcommand")
        .render_long_help()
        .to_string();
    for needle in [
        "CONCH_LEADER_VALUE",
        "--observe",
        "79",
        "billing.elect",
        "--priority",
        "SIGTERM",
    ] {
        assert!(help.contains(needle), "elect --help lacks {needle:?}");
    }
}

fn lock(args: &[&str]) -> Result<LockArgs, String> {
    match parse(args).map_err(|e| e.to_string())?.command {
        Command::Lock(l) => l.validate().map(|()| l),
        other => panic!("not lock: {other:?}"),
    }
}

#[test]
fn lock_parses_modes_waits_and_who() {
    let l = lock(&["lock", "db/orders", "--", "./m.sh", "-x"]).unwrap();
    assert_eq!(l.path, "db/orders");
    assert!(!l.shared);
    assert_eq!(l.wait_bound(), None);
    assert_eq!(l.command, ["./m.sh", "-x"]);
    assert_eq!(l.namespace, "conch");
    assert_eq!(l.ttl, Duration::from_secs(10));
    let l = lock(&["lock", "a/b", "--shared", "--wait", "30s", "--", "true"]).unwrap();
    assert!(l.shared);
    assert_eq!(l.wait_bound(), Some(Duration::from_secs(30)));
    let l = lock(&["lock", "a", "-n", "--ttl", "3s", "--", "true"]).unwrap();
    assert_eq!(l.wait_bound(), Some(Duration::ZERO));
    assert_eq!(l.ttl, Duration::from_secs(3));
    let l = lock(&["lock", "a", "--who", "--json", "--shared"]).unwrap();
    assert!(l.who && l.json && l.shared);
    let bad: &[&[&str]] = &[
        &["lock", "a"],
        &["lock", "a//b", "--", "true"],
        &["lock", "/a", "--", "true"],
        &["lock", "a b", "--", "true"],
        &["lock", "a", "--json", "--", "true"],
        &["lock", "a", "--who", "--", "true"],
        &["lock", "a", "--nonblock", "--wait", "1s", "--", "true"],
        &["lock", "a", "--ttl", "0s", "--", "true"],
        &["lock", "a", "--namespace", "x/y", "--who"],
        &["lock", "a", "sh", "-c", "true"],
    ];
    for args in bad {
        assert!(lock(args).is_err(), "{args:?} should be refused");
    }
}

#[test]
fn lock_help_documents_the_variables_examples_and_exit_codes() {
    let mut cmd = Cli::command();
    let help = cmd
        .find_subcommand_mut("lock")
        .expect("lock subcommand")
        .render_long_help()
        .to_string();
    for needle in [
        "conch lock db/orders -- ./migrate-orders.sh",
        "--shared",
        "--nonblock",
        "conch lock db --who --json",
        "CONCH_REV",
        "CONCH_LEASE",
        "CONCH_LOCK",
        "CONCH_LOCK_MODE",
        "DeleteLock",
        "75",
        "79",
    ] {
        assert!(
            help.contains(needle),
            "lock --help lacks {needle:?}:\n{help}"
        );
    }
    let top = Cli::command().render_long_help().to_string();
    assert!(top.contains("conch lock"), "{top}");
    assert!(top.contains("lock"), "{top}");
}

#[test]
fn help_shows_the_seed_examples_and_exit_codes() {
    let mut cmd = Cli::command();
    let sema = cmd.find_subcommand_mut("sema").expect("sema subcommand");
    let help = sema.render_long_help().to_string();
    for needle in [
        "conch sema certs-renew --max 1 --nonblock -- ./renew.sh || echo \"already running elsewhere\"",
        "conch sema heavy-jobs --max 2 -- /usr/local/bin/run-job.sh",
        "conch sema heavy-jobs --max 2 --who",
        "CONCH_REV",
        "79",
        "75",
    ] {
        assert!(
            help.contains(needle),
            "sema --help lacks {needle:?}:\n{help}"
        );
    }
}
