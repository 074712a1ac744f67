//! The client's routing, hedging and retries against the fake transport (`fake.rs`), in paused
//! time: the order, count and (virtual) time of every attempt.

use std::time::Duration;

use crate::client::{CallOptions, ClientConfig};
use crate::error::Error;

use crate::fake::{self, Behaviour, Event, Fake};

const MS: Duration = Duration::from_millis(1);

fn answer() -> Behaviour {
    Behaviour::Answer {
        delay: Duration::ZERO,
    }
}

fn options(timeout: Duration, retry_for: Duration) -> CallOptions {
    CallOptions { timeout, retry_for }
}

// The routing tests below run in paused (virtual) time against fake nodes: times are
// exact, whatever the machine's speed.

#[tokio::test(start_paused = true)]
async fn refused_connections_are_given_up_after_two_rounds_one_backoff_apart() {
    let fake = Fake::new(&[("a:1", Behaviour::Refuse)]);
    let c = fake.client(ClientConfig::default());
    let err = fake::check(&c, c.default_options()).await.unwrap_err();
    match &err {
        Error::Unavailable { endpoints, op, .. } => {
            assert_eq!(endpoints, &["a:1"]);
            assert_eq!(*op, "check");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(err.to_string().contains("a:1"), "{err}");
    // Two rounds, not the 15 s retry budget: the first backoff (25..=50 ms) between them.
    let dials: Vec<Duration> = fake.events().into_iter().map(|(t, _)| t).collect();
    assert_eq!(dials.len(), 2, "{:?}", fake.events());
    assert_eq!(dials[0], Duration::ZERO);
    assert!((25 * MS..=50 * MS).contains(&dials[1]), "{dials:?}");
    assert_eq!(
        fake.elapsed(),
        dials[1],
        "gave up right after the second round"
    );
}

#[tokio::test(start_paused = true)]
async fn silent_endpoints_are_tried_250_ms_apart_and_reported_after_one_timeout() {
    // Like nodes stopped with SIGSTOP: nothing ever answers.
    let fake = Fake::new(&[
        ("a:1", Behaviour::Silent),
        ("b:2", Behaviour::Silent),
        ("c:3", Behaviour::Silent),
    ]);
    let c = fake.client(ClientConfig::default());
    let opts = options(Duration::from_secs(1), Duration::from_secs(15));
    let err = fake::check(&c, opts).await.unwrap_err();
    match &err {
        Error::Unavailable { endpoints, .. } => assert_eq!(endpoints.len(), 3, "{err}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let dial = |node: &str| Event::Dial(node.into());
    assert_eq!(
        fake.events(),
        [
            (Duration::ZERO, dial("a:1")),
            (250 * MS, dial("b:2")),
            (500 * MS, dial("c:3")),
        ]
    );
    // The last one started at 500 ms times out 1 s later; no second round (one after the
    // other would take 3 s, the retry budget 15 s).
    assert_eq!(fake.elapsed(), 1500 * MS);
}

#[tokio::test(start_paused = true)]
async fn a_slow_endpoint_is_overtaken_after_250_ms_and_the_first_answer_wins() {
    let fake = Fake::new(&[
        (
            "a:1",
            Behaviour::Answer {
                delay: Duration::from_secs(3),
            },
        ),
        ("b:2", answer()),
    ]);
    let c = fake.client(ClientConfig::default());
    let opts = options(Duration::from_secs(5), Duration::from_secs(15));
    assert_eq!(fake::check(&c, opts).await.unwrap(), "b:2");
    assert_eq!(
        fake.calls(),
        [(Duration::ZERO, "a:1".into()), (250 * MS, "b:2".into())]
    );
    assert_eq!(
        fake.elapsed(),
        250 * MS,
        "a's late answer was not waited for"
    );

    // The endpoint that answered goes first next time: one call, no hedge.
    assert_eq!(fake::check(&c, opts).await.unwrap(), "b:2");
    assert_eq!(fake.calls().len(), 3);
    assert_eq!(fake.calls()[2], (250 * MS, "b:2".into()));
}

#[tokio::test(start_paused = true)]
async fn a_leader_hint_sends_the_call_and_the_next_ones_to_the_leader() {
    // a has no leader but names c (not a configured endpoint); b is down.
    let fake = Fake::new(&[
        (
            "a:1",
            Behaviour::NoLeader {
                leader: Some("c:3".into()),
            },
        ),
        ("b:2", Behaviour::Refuse),
    ]);
    fake.add("c:3", answer());
    let c = fake.client(ClientConfig::default());
    assert_eq!(fake::check(&c, c.default_options()).await.unwrap(), "c:3");
    let nodes: Vec<String> = fake.calls().into_iter().map(|(_, n)| n).collect();
    assert_eq!(nodes, ["a:1", "c:3"]);
    assert_eq!(
        fake.elapsed(),
        Duration::ZERO,
        "no backoff: the hint was followed at once"
    );
    assert_eq!(c.leader_hint().as_deref(), Some("c:3"));
    assert_eq!(fake::check(&c, c.default_options()).await.unwrap(), "c:3");
    assert_eq!(fake.calls().len(), 3, "straight to the leader");
}

#[tokio::test(start_paused = true)]
async fn without_a_leader_rounds_repeat_with_growing_backoff_until_retry_for() {
    let no_leader = Behaviour::NoLeader { leader: None };
    let fake = Fake::new(&[("a:1", no_leader.clone()), ("b:2", no_leader)]);
    let c = fake.client(ClientConfig::default());
    let retry_for = Duration::from_secs(2);
    let err = fake::check(&c, options(Duration::from_secs(1), retry_for))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    assert_eq!(
        fake.elapsed(),
        retry_for,
        "the last pause ends with the budget"
    );
    // Each round asks both nodes at the same instant (a answers at once, so b follows).
    let calls = fake.calls();
    assert_eq!(calls.len() % 2, 0, "{calls:?}");
    let rounds: Vec<Duration> = calls
        .chunks(2)
        .map(|pair| {
            assert_eq!(pair[0].0, pair[1].0, "{calls:?}");
            assert_eq!((pair[0].1.as_str(), pair[1].1.as_str()), ("a:1", "b:2"));
            pair[0].0
        })
        .collect();
    // Pause k lies in [c/2, c], c = min(1 s, 50 ms * 2^k); the last one is cut short by
    // the budget, and its round is the last.
    let backoff = crate::Backoff::new(50 * MS, Duration::from_secs(1));
    let gaps: Vec<Duration> = rounds.windows(2).map(|w| w[1] - w[0]).collect();
    for (k, gap) in gaps.iter().enumerate() {
        let ceiling = backoff.ceiling(k as u32);
        let last = k + 1 == gaps.len();
        assert!(
            *gap <= ceiling && (last || *gap >= ceiling / 2),
            "pause {k}: {gap:?} (ceiling {ceiling:?}) in {rounds:?}"
        );
    }
    assert_eq!(rounds.last(), Some(&retry_for), "{rounds:?}");
    assert!(rounds.len() >= 5, "{rounds:?}");
}
