use super::*;
use crate::harness::test;

fn pool(n: usize) -> Pool {
    Pool::new(
        (0..n)
            .map(|i| EndpointState::new(format!("10.0.0.{i}:8000"), BTreeMap::new()))
            .collect(),
    )
}

#[test]
fn canonical_addresses() {
    assert_eq!(
        canonical_address("10.0.0.7:8000").as_deref(),
        Ok("10.0.0.7:8000")
    );
    assert_eq!(canonical_address("[::1]:8000").as_deref(), Ok("[::1]:8000"));
    assert_eq!(canonical_address("[0:0::1]:80").as_deref(), Ok("[::1]:80"));
    assert!(canonical_address("::1:8000").is_err());
    assert!(canonical_address("pod-a:8000").is_err());
    assert!(canonical_address("10.0.0.7").is_err());
    assert_eq!(
        canonical_address("127.0.0.1:9").as_deref(),
        Ok("127.0.0.1:9")
    );
    assert_eq!(
        canonical_address("[fe80::1]:80").as_deref(),
        Ok("[fe80::1]:80")
    );
}

#[test]
fn unroutable_addresses_are_refused_with_the_reason() {
    for (text, reason) in [
        ("0.0.0.0:8000", "unspecified"),
        ("0.0.0.0:0", "port 0"),
        ("127.0.0.1:0", "port 0"),
        ("10.0.0.7:0", "port 0"),
        ("[::]:9", "unspecified"),
        ("[0:0::0]:8000", "unspecified"),
        ("[::ffff:0.0.0.0]:8000", "unspecified"),
        ("0.1.2.3:8000", "this network"),
        ("255.255.255.255:8000", "broadcast"),
        ("224.0.0.1:8000", "multicast"),
        ("[ff02::1]:8000", "multicast"),
        ("[::ffff:239.1.1.1]:8000", "multicast"),
    ] {
        let error = canonical_address(text).unwrap_err();
        assert!(
            error.contains("not a routable pod address") && error.contains(reason),
            "{text}: {error}"
        );
    }
}

#[test]
fn health_follows_scrapes_and_age() {
    let mut pool = pool(2);
    assert!(pool.refresh_health(0, 2000).is_empty());
    pool.record_scrape_ok(0, 1000, EndpointMetrics::default());
    pool.record_scrape_failure(1);
    assert_eq!(
        pool.endpoints[1].health,
        Health::Unreachable,
        "effective before the tick"
    );
    let transitions = pool.refresh_health(1500, 2000);
    assert_eq!(transitions.len(), 2);
    assert_eq!(pool.endpoints[0].health, Health::Fresh);
    assert_eq!(pool.endpoints[1].health, Health::Unreachable);
    pool.refresh_health(3001, 2000);
    assert_eq!(pool.endpoints[0].health, Health::Stale);
    pool.record_scrape_ok(1, 3001, EndpointMetrics::default());
    pool.refresh_health(3001, 2000);
    assert_eq!(pool.endpoints[1].health, Health::Fresh);
}

#[test]
fn late_metrics_keep_a_pod_routable_while_it_answers_what_it_is_sent() {
    let mut pool = pool(2);
    pool.record_scrape_ok(0, 1000, EndpointMetrics::default());
    pool.refresh_health(5000, 2000);
    let pod = |pool: &Pool| pool.endpoints[0].routable(pool.now_ms());
    assert_eq!(pool.endpoints[0].health, Health::Stale);
    assert!(pod(&pool), "late metrics, nothing owed: still a candidate");
    pool.add_in_flight(0, 10);
    assert!(
        !pod(&pool),
        "owes an answer and gave none lately: it may hang"
    );
    pool.add_in_flight(0, 10);
    pool.answered(0);
    pool.end_in_flight(0, 10);
    pool.refresh_health(6999, 2000);
    assert!(pod(&pool), "it answers: still a candidate");
    pool.refresh_health(7001, 2000);
    assert!(!pod(&pool), "the other answer is overdue: it looks hung");
    pool.end_in_flight(0, 10);
    assert!(
        !pod(&pool),
        "a request that ended unanswered (the client gave up) does not clear it"
    );
    pool.record_scrape_ok(0, 7001, EndpointMetrics::default());
    pool.refresh_health(9500, 2000);
    assert!(pod(&pool), "a good scrape does");
    pool.add_in_flight(1, 10);
    assert!(
        !pool.endpoints[1].routable(pool.now_ms()),
        "never scraped: not a candidate"
    );
    pool.record_scrape_failure(0);
    assert!(!pod(&pool), "a failed scrape takes it out");
}

#[test]
fn addresses_find_their_index_as_members_come_and_go() {
    let mut pool = pool(3);
    assert_eq!(pool.index_of("10.0.0.2:8000"), Some(2));
    assert_eq!(pool.index_of("10.0.0.9:8000"), None);
    let listed = |addresses: &[&str]| -> Vec<(String, BTreeMap<String, String>)> {
        addresses
            .iter()
            .map(|a| ((*a).to_owned(), BTreeMap::new()))
            .collect()
    };
    let (added, removed) = pool.set_members(&listed(&["10.0.0.9:8000", "10.0.0.1:8000"]), 1);
    assert_eq!(added, ["10.0.0.9:8000"]);
    assert_eq!(removed, ["10.0.0.2:8000"]);
    assert_eq!(pool.index_of("10.0.0.9:8000"), Some(3));
    assert_eq!(
        pool.index_of("10.0.0.2:8000"),
        Some(2),
        "removed, index kept"
    );
    assert!(pool.endpoints[2].removed && !pool.endpoints[1].removed);
}

#[test]
fn in_flight_never_underflows() {
    let mut pool = pool(1);
    pool.add_in_flight(0, 100);
    pool.add_in_flight(0, 30);
    assert_eq!(pool.endpoints[0].in_flight_tokens, 130);
    pool.end_in_flight(0, 100);
    pool.end_in_flight(0, 30);
    pool.end_in_flight(0, 30);
    pool.end_in_flight(7, 1);
    assert_eq!(pool.endpoints[0].in_flight, 0);
    assert_eq!(pool.endpoints[0].in_flight_tokens, 0);
    assert_eq!(
        pool.endpoints[0].placed_tokens_since_scrape, 130,
        "placed work stays until the next scrape shows it"
    );
    pool.record_scrape_ok(0, 1, EndpointMetrics::default());
    assert_eq!(pool.endpoints[0].placed_tokens_since_scrape, 0);
}

#[test]
fn with_replicas_each_placement_stands_for_the_fleets() {
    let mut pool = pool(1).with_replicas(3);
    let idle = EndpointMetrics {
        waiting_queue: Some(0.0),
        running_requests: Some(1.0),
        ..EndpointMetrics::default()
    };
    pool.record_scrape_ok(0, 1, idle);
    pool.add_in_flight(0, 100);
    assert_eq!(
        pool.running(0),
        Some(4.0),
        "one placed here since the scrape: about three across the fleet"
    );
    pool.end_in_flight(0, 100);
    assert_eq!(pool.running(0), Some(1.0));
}

#[test]
fn live_load_adds_what_was_placed_since_the_scrape_less_what_ended() {
    use crate::metrics::CacheConfig;
    let mut pool = pool(1);
    pool.add_in_flight(0, 100);
    let scrape = |running: f64, waiting: f64| EndpointMetrics {
        waiting_queue: Some(waiting),
        running_requests: Some(running),
        kv_cache_usage: Some(0.5),
        cache_config: Some(CacheConfig {
            block_size: 16,
            num_gpu_blocks: 100,
        }),
        ..EndpointMetrics::default()
    };
    pool.record_scrape_ok(0, 1, scrape(2.0, 0.0));
    assert_eq!(pool.waiting(0), Some(0.0), "already in the scrape");
    pool.add_in_flight(0, 400);
    pool.endpoints[0].remote_in_flight = 1;
    pool.endpoints[0].remote_in_flight_tokens = 400;
    assert_eq!(
        (pool.running(0), pool.waiting(0)),
        (Some(4.0), Some(0.0)),
        "never seen full: one placed here and one by another worker run"
    );
    assert_eq!(pool.kv_usage(0), Some(0.5 + 800.0 / 1600.0));

    pool.endpoints[0].remote_in_flight = 0;
    pool.endpoints[0].remote_in_flight_tokens = 0;
    pool.mark_scrape_sent(0);
    pool.add_in_flight(0, 400);
    pool.record_scrape_ok(0, 2, scrape(3.0, 1.0));
    assert_eq!(
        pool.endpoints[0].placed_since_scrape(),
        1.0,
        "placed while the scrape travelled: not in its metrics, still counted"
    );
    pool.end_in_flight(0, 400);
    assert_eq!(pool.endpoints[0].running_capacity, Some(3.0));
    pool.add_in_flight(0, 400);
    pool.add_in_flight(0, 400);
    assert_eq!(
        (pool.running(0), pool.waiting(0)),
        (Some(3.0), Some(3.0)),
        "seen full at 3: what is placed since waits"
    );
    for _ in 0..4 {
        pool.end_in_flight(0, 400);
    }
    assert_eq!(
        (pool.running(0), pool.waiting(0)),
        (Some(2.0), Some(0.0)),
        "two of the scraped ones ended too: the queue drains first"
    );
    let mut scraped_only = pool.clone().with_live_load(false);
    scraped_only.add_in_flight(0, 400);
    assert_eq!(scraped_only.waiting(0), Some(1.0));
    assert_eq!(scraped_only.kv_usage(0), Some(0.5));
}
