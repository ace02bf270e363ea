use super::*;
use crate::config::load;
use crate::datalayer::{Scraped, MAX_PROBE_BACKOFF_MS};
use crate::endpoint::Health;
use crate::harness::test;
use crate::host::fake::{capture_warnings, FakeClock, FakeShared, FakeVm};
use crate::shared_keys::SharedKeys;
use crate::vm::configure::{configure, PoolTicks};
use std::rc::Rc;

const INTERVAL_MS: u64 = 50;
const POOL: &str = "pool:
  refreshMetricsInterval: 50ms
  endpoints: [{address: '10.0.0.1:8000'}, {address: '10.0.0.2:8000'}, {address: '10.0.0.3:8000'}]
";

struct Vm {
    host: FakeVm,
    flow: TickDriver,
    slot: PoolSlot,
}

impl Vm {
    fn new(config: &str, id: u64, shared: &Rc<FakeShared>, clock: &Rc<FakeClock>) -> Self {
        let config = load(config, id).unwrap();
        let peers = config.pool.peers.clone().map(crate::peers::Peers::new);
        let coordinator = Coordinator::new(SharedKeys::under("test"), id, INTERVAL_MS);
        Vm {
            host: FakeVm::in_process(Rc::clone(shared), Rc::clone(clock)),
            flow: TickDriver::new(Some(coordinator), peers),
            slot: PoolSlot::new("test".into(), config),
        }
    }

    fn tick(&mut self) -> TickOutcome {
        self.flow.on_tick(&self.host, &mut self.slot)
    }

    /// Delivers an answer to the scrape of `address` (`None`: timeout or reset).
    fn answer(&mut self, address: &str, status: Option<&str>, body: &str) -> CalloutOutcome {
        let token = self
            .host
            .callouts
            .token_for(address)
            .expect("a scrape of it");
        self.deliver(token, status, body)
    }

    /// Reads the answer to `token` with the data layer's cap, as an edge does, and hands it
    /// over.
    fn deliver(&mut self, token: u32, status: Option<&str>, body: &str) -> CalloutOutcome {
        let cap = self.slot.data.body_cap(token).unwrap_or(0);
        let answer = self.host.callouts.answer(token, status, body, cap);
        self.flow
            .on_callout_response(&self.host, &mut self.slot, token, &answer)
    }

    fn health(&self, index: usize) -> Health {
        self.slot.data.pool().get(index).unwrap().health
    }

    fn queue(&self, index: usize) -> Option<f64> {
        self.slot.data.pool().get(index).unwrap().metrics.waiting()
    }

    fn scraped_addresses(&self) -> Vec<String> {
        self.host
            .callouts
            .sent
            .borrow()
            .iter()
            .filter_map(|call| call.authority().map(str::to_owned))
            .collect()
    }
}

fn snapshot_cas(shared: &FakeShared) -> Option<u32> {
    shared.get("test/snapshot").unwrap().map(|(_, cas)| cas)
}

#[test]
fn one_scraper_and_a_handover_when_it_stops_ticking() {
    let (shared, clock) = (Rc::<FakeShared>::default(), Rc::<FakeClock>::default());
    let mut a = Vm::new(POOL, 1, &shared, &clock);
    let mut b = Vm::new(POOL, 2, &shared, &clock);
    assert_eq!(a.tick().role, Role::Scraper);
    assert_eq!(b.tick().role, Role::Follower);
    assert_eq!(a.scraped_addresses().len(), 3);
    assert!(
        b.scraped_addresses().is_empty(),
        "a follower sends no scrape"
    );
    // `a` stops ticking (its VM is busy or gone): once its lease ends `b` takes over. A late
    // tick of `a` within the lease keeps it (hysteresis under CPU pressure).
    let lease = crate::shared_state::MIN_LEASE_MS;
    clock.advance(lease - 1);
    assert_eq!(b.tick().role, Role::Follower, "the lease still holds");
    clock.advance(1);
    assert_eq!(b.tick().role, Role::Scraper);
    assert_eq!(b.scraped_addresses().len(), 3);
    // `a` comes back and finds the lease taken.
    clock.advance(1);
    assert_eq!(a.tick().role, Role::Follower);
}

#[test]
fn a_round_with_a_failing_and_a_hanging_pod_is_published_once_when_it_completes() {
    let (shared, clock) = (Rc::<FakeShared>::default(), Rc::<FakeClock>::default());
    let mut scraper = Vm::new(POOL, 1, &shared, &clock);
    let mut follower = Vm::new(POOL, 2, &shared, &clock);
    scraper.tick();
    follower.tick();
    clock.advance(5);
    let ok = scraper.answer(
        "10.0.0.1:8000",
        Some("200"),
        "vllm:num_requests_waiting 3\n",
    );
    assert_eq!(
        ok,
        CalloutOutcome::Scraped {
            index: 0,
            scraped: Scraped::Ok
        }
    );
    let failed = scraper.answer("10.0.0.2:8000", Some("503"), "busy");
    assert_eq!(
        failed,
        CalloutOutcome::Scraped {
            index: 1,
            scraped: Scraped::Failed
        }
    );
    assert_eq!(
        snapshot_cas(&shared),
        None,
        "the round is not complete: nothing published"
    );
    assert_eq!(scraper.slot.data.scrapes_in_flight(), 1);

    // The third pod hangs past the next tick: the new round skips it and completes alone.
    clock.advance(INTERVAL_MS);
    scraper.tick();
    let resent = scraper.scraped_addresses();
    assert_eq!(
        resent.len(),
        5,
        "pods 1 and 2 again, not the hanging pod 3: {resent:?}"
    );
    let round_two: Vec<u32> = scraper.host.callouts.sent.borrow()[3..]
        .iter()
        .map(|c| c.token)
        .collect();
    scraper.deliver(round_two[0], Some("200"), "vllm:num_requests_waiting 4\n");
    assert_eq!(snapshot_cas(&shared), None);
    scraper.deliver(round_two[1], Some("200"), "vllm:num_requests_waiting 0\n");
    let first = snapshot_cas(&shared).expect("published when round two completed");

    // The hanging scrape times out: a failed scrape, published with the next completed round;
    // one timeout only ages the pod's metrics, it does not take it out.
    let hung = scraper.host.callouts.sent.borrow()[2].token;
    assert_eq!(
        scraper.deliver(hung, None, ""),
        CalloutOutcome::Scraped {
            index: 2,
            scraped: Scraped::TimedOut
        }
    );
    assert_ne!(scraper.health(2), Health::Unreachable);
    assert_eq!(scraper.queue(0), Some(4.0));
    assert_eq!(
        snapshot_cas(&shared),
        Some(first + 1),
        "no round left open: published"
    );

    follower.tick();
    assert_eq!(follower.queue(0), Some(4.0));
    assert_eq!(follower.queue(1), Some(0.0));
}

#[test]
fn a_slow_pod_only_ages_a_refusing_one_leaves_and_is_probed_with_back_off() {
    let (shared, clock) = (Rc::<FakeShared>::default(), Rc::<FakeClock>::default());
    let mut vm = Vm::new(POOL, 1, &shared, &clock);
    let round = |vm: &mut Vm, answers: &[(&str, Option<&str>)]| {
        vm.host.callouts.take_sent();
        clock.advance(INTERVAL_MS);
        vm.tick();
        let mut probed = Vec::new();
        for &(address, status) in answers {
            if let Some(token) = vm.host.callouts.token_for(address) {
                vm.deliver(token, status, "vllm:num_requests_waiting 1\n");
                probed.push(address.to_owned());
            }
        }
        probed
    };
    let all_ok = [
        ("10.0.0.1:8000", Some("200")),
        ("10.0.0.2:8000", Some("200")),
        ("10.0.0.3:8000", Some("200")),
    ];
    round(&mut vm, &all_ok);
    // Pod 1 times out (Envoy's 504, then no answer at all), pod 2 refuses (Envoy's 503).
    let trouble = [
        ("10.0.0.1:8000", Some("504")),
        ("10.0.0.2:8000", Some("503")),
        ("10.0.0.3:8000", Some("200")),
    ];
    round(&mut vm, &trouble);
    assert_eq!(
        vm.health(0),
        Health::Fresh,
        "one timeout: metrics still fresh"
    );
    assert_eq!(
        vm.health(1),
        Health::Unreachable,
        "a refused scrape leaves at once"
    );
    let hanging = [
        ("10.0.0.1:8000", None),
        ("10.0.0.2:8000", Some("503")),
        ("10.0.0.3:8000", Some("200")),
    ];

    // The refusing pod is probed after 1, 2, 4, 8... intervals, not every tick.
    let mut probes_of_pod_2 = 0;
    for _ in 0..40 {
        let probed = round(&mut vm, &hanging);
        probes_of_pod_2 += probed.iter().filter(|a| *a == "10.0.0.2:8000").count();
    }
    assert!(
        (4..=8).contains(&probes_of_pod_2),
        "{probes_of_pod_2} probes in 40 intervals"
    );
    // Past the staleness threshold (2 s by default) since pod 1's last good scrape.
    assert_eq!(
        vm.health(0),
        Health::Stale,
        "late scrapes, however many: its metrics age, it is not taken out"
    );
    // Once it answers it is scraped every interval again.
    clock.advance(MAX_PROBE_BACKOFF_MS);
    round(&mut vm, &all_ok);
    assert_eq!(vm.health(1), Health::Fresh);
    let probed = round(&mut vm, &all_ok);
    assert!(probed.contains(&"10.0.0.2:8000".to_owned()));
}

#[test]
fn a_follower_decodes_the_snapshot_only_when_it_changed() {
    let (shared, clock) = (Rc::<FakeShared>::default(), Rc::<FakeClock>::default());
    let mut scraper = Vm::new(POOL, 1, &shared, &clock);
    let mut follower = Vm::new(POOL, 2, &shared, &clock);
    scraper.tick();
    for address in ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"] {
        scraper.answer(address, Some("200"), "vllm:num_requests_waiting 1\n");
    }
    let decodes = |vm: &Vm| vm.flow.coordinator().unwrap().snapshot_decodes();
    follower.tick();
    assert_eq!(decodes(&follower), 1);
    for _ in 0..3 {
        clock.advance(1);
        follower.tick();
    }
    assert_eq!(decodes(&follower), 1, "same CAS token: nothing decoded");
    // Ticks of the scraper without answers publish nothing new either.
    clock.advance(1);
    scraper.tick();
    follower.tick();
    assert_eq!(decodes(&follower), 1);
}

#[test]
fn a_host_that_refuses_every_call_fails_every_scrape() {
    let (shared, clock) = (Rc::<FakeShared>::default(), Rc::<FakeClock>::default());
    let mut vm = Vm::new(POOL, 1, &shared, &clock);
    // With none of ours in flight, a refusal means the call cannot be made at all (e.g. the
    // metrics cluster does not exist): the scrape failed.
    vm.host.callouts.capacity.set(0);
    let (_, warnings) = capture_warnings(|| {
        vm.tick();
        clock.advance(INTERVAL_MS);
        vm.tick();
    });
    for index in 0..3 {
        assert_eq!(vm.health(index), Health::Unreachable);
    }
    assert_eq!(
        vm.slot.data.take_unsent().collect::<Vec<_>>(),
        [0, 1, 2, 0, 1, 2]
    );
    assert_eq!(
        warnings.iter().filter(|w| w.contains("not sent")).count(),
        1,
        "one line for the first interval's refusals: {warnings:?}"
    );
}

#[test]
fn a_full_host_delays_scrapes_instead_of_failing_them() {
    let (shared, clock) = (Rc::<FakeShared>::default(), Rc::<FakeClock>::default());
    let mut vm = Vm::new(POOL, 1, &shared, &clock);
    vm.host.callouts.capacity.set(1);
    vm.tick();
    assert_eq!(vm.scraped_addresses(), ["10.0.0.1:8000"]);
    assert_eq!(
        vm.slot.data.take_unsent().collect::<Vec<_>>(),
        [1],
        "counted as a failed scrape"
    );
    assert_eq!(vm.health(1), Health::Unknown, "not the pod's fault");
    // Each answer sends the next; the host is not asked beyond what it accepted.
    vm.answer(
        "10.0.0.1:8000",
        Some("200"),
        "vllm:num_requests_waiting 1\n",
    );
    vm.answer(
        "10.0.0.2:8000",
        Some("200"),
        "vllm:num_requests_waiting 1\n",
    );
    vm.answer(
        "10.0.0.3:8000",
        Some("200"),
        "vllm:num_requests_waiting 1\n",
    );
    assert_eq!(vm.host.callouts.refused.get(), 1);
    assert!((0..3).all(|index| vm.health(index) == Health::Fresh));
    assert!(snapshot_cas(&shared).is_some(), "the round completed");
}

const FIVE: &str = "pool:
  refreshMetricsInterval: 50ms
  maxScrapesInFlight: 2
  endpoints: [{address: '10.0.0.1:8000'}, {address: '10.0.0.2:8000'}, {address: '10.0.0.3:8000'},
    {address: '10.0.0.4:8000'}, {address: '10.0.0.5:8000'}]
";

#[test]
fn a_round_is_paced_and_one_longer_than_the_interval_is_shared_once_per_interval() {
    let (shared, clock) = (Rc::<FakeShared>::default(), Rc::<FakeClock>::default());
    let mut vm = Vm::new(FIVE, 1, &shared, &clock);
    vm.tick();
    assert_eq!(vm.scraped_addresses(), ["10.0.0.1:8000", "10.0.0.2:8000"]);
    vm.answer(
        "10.0.0.1:8000",
        Some("200"),
        "vllm:num_requests_waiting 1\n",
    );
    assert_eq!(vm.scraped_addresses().len(), 3, "an answer sends the next");
    assert_eq!(vm.slot.data.scrapes_in_flight(), 2);
    // The interval ends mid-round: no new round (endpoint 1 is not scraped again), but what
    // the round learned so far is published.
    clock.advance(INTERVAL_MS);
    vm.tick();
    assert_eq!(vm.scraped_addresses().len(), 3);
    let interim = snapshot_cas(&shared).expect("published at the tick");
    for address in ["10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"] {
        vm.answer(address, Some("200"), "vllm:num_requests_waiting 1\n");
    }
    assert_eq!(
        snapshot_cas(&shared),
        Some(interim),
        "the round is still open"
    );
    clock.advance(10);
    vm.answer(
        "10.0.0.5:8000",
        Some("200"),
        "vllm:num_requests_waiting 1\n",
    );
    assert_eq!(
        snapshot_cas(&shared),
        Some(interim + 1),
        "published when complete"
    );
    assert_eq!(vm.slot.data.last_round_ms(), Some(INTERVAL_MS + 10));
    assert_eq!(vm.host.callouts.refused.get(), 0);
    // The next tick starts the next round, from the first endpoint.
    clock.advance(INTERVAL_MS);
    vm.tick();
    assert_eq!(
        vm.scraped_addresses()[5..],
        ["10.0.0.1:8000", "10.0.0.2:8000"]
    );
}

/// `count` endpoints `10.x.y.z:8000` scraped every 50ms.
fn large_pool(count: usize) -> String {
    let mut config = String::from("pool:\n  refreshMetricsInterval: 50ms\n  endpoints:\n");
    for i in 0..count {
        config.push_str(&format!("  - address: 10.{}.{}.1:8000\n", i / 256, i % 256));
    }
    config
}

#[test]
fn four_thousand_endpoints_behind_a_host_that_refuses_beyond_its_limit_are_all_scraped_in_turn() {
    const ENDPOINTS: usize = 4096;
    const HOST_LIMIT: usize = 100;
    // What the host answers per interval: a round takes ceil(4096 / 300) = 14 intervals.
    const ANSWERS_PER_INTERVAL: usize = 300;
    const TICKS: usize = 60;
    let (shared, clock) = (Rc::<FakeShared>::default(), Rc::<FakeClock>::default());
    let mut vm = Vm::new(&large_pool(ENDPOINTS), 1, &shared, &clock);
    vm.host.callouts.capacity.set(HOST_LIMIT);
    let mut scrapes = vec![0usize; ENDPOINTS];
    let mut all_scraped_at = None;
    let mut unsent = 0;
    let mut answered = 0;
    let (_, warnings) = capture_warnings(|| {
        for tick in 0..TICKS {
            vm.tick();
            unsent += vm.slot.data.take_unsent().count();
            for _ in 0..ANSWERS_PER_INTERVAL {
                let Some(token) = vm
                    .host
                    .callouts
                    .sent
                    .borrow()
                    .get(answered)
                    .map(|c| c.token)
                else {
                    break;
                };
                answered += 1;
                let CalloutOutcome::Scraped {
                    index,
                    scraped: Scraped::Ok,
                } = vm.deliver(token, Some("200"), "vllm:num_requests_waiting 1\n")
                else {
                    panic!("a good scrape");
                };
                scrapes[index] += 1;
                unsent += vm.slot.data.take_unsent().count();
                assert!(vm.slot.data.scrapes_in_flight() <= HOST_LIMIT);
            }
            if all_scraped_at.is_none() && scrapes.iter().all(|&n| n > 0) {
                all_scraped_at = Some(tick);
            }
            clock.advance(INTERVAL_MS);
        }
    });
    let first_round = all_scraped_at.expect("every endpoint scraped");
    assert!(
        first_round <= 14,
        "all scraped within {first_round} intervals"
    );
    let (fewest, most) = (
        *scrapes.iter().min().unwrap(),
        *scrapes.iter().max().unwrap(),
    );
    assert!(fewest >= 4, "none starved: {fewest}..{most} scrapes");
    assert!(most - fewest <= 1, "in turn: {fewest}..{most} scrapes");
    // One refusal per round at most (the window then shrinks to what the host took), each
    // counted as a failed scrape.
    let rounds = most;
    assert!(
        (1..=rounds).contains(&vm.host.callouts.refused.get()),
        "{} refusals",
        vm.host.callouts.refused.get()
    );
    assert_eq!(unsent, vm.host.callouts.refused.get());
    assert!(vm
        .slot
        .data
        .last_round_ms()
        .is_some_and(|ms| ms >= 13 * INTERVAL_MS));
    // Thousands of health changes and refusals: a few lines per interval, not one per endpoint.
    assert!(
        warnings.len() <= 2 * TICKS,
        "{} warning lines: {:?}",
        warnings.len(),
        &warnings[..warnings.len().min(5)]
    );
}

const DISCOVERED: &str = "pool:
  refreshMetricsInterval: 50ms
  discovery: {cluster: k8s, targetPorts: [8000], selector: {matchLabels: {app: vllm}}, interval: 1s}
";

fn pod_list(ips: &[&str]) -> String {
    let items: Vec<String> = ips
        .iter()
        .map(|ip| {
            format!(
                r#"{{"metadata":{{"name":"{ip}","labels":{{"app":"vllm"}}}},"status":{{"phase":"Running","podIP":"{ip}","conditions":[{{"type":"Ready","status":"True"}}]}}}}"#
            )
        })
        .collect();
    format!(r#"{{"kind":"PodList","items":[{}]}}"#, items.join(","))
}

#[test]
fn discovery_applies_the_pod_list_and_a_failure_keeps_the_last_pool() {
    let (shared, clock) = (Rc::<FakeShared>::default(), Rc::<FakeClock>::default());
    let mut vm = Vm::new(DISCOVERED, 1, &shared, &clock);
    vm.tick();
    let call = vm
        .host
        .callouts
        .take_sent()
        .pop()
        .expect("a discovery call");
    assert_eq!(call.cluster, "k8s");
    let body = pod_list(&["10.1.0.1", "10.1.0.2"]);
    assert_eq!(
        vm.deliver(call.token, Some("200"), &body),
        CalloutOutcome::Discovered { changed: true }
    );
    assert_eq!(vm.slot.data.pool().len(), 2);

    // A follower learns the members through shared data.
    let mut follower = Vm::new(DISCOVERED, 2, &shared, &clock);
    assert!(follower.tick().members_changed);
    assert_eq!(follower.slot.data.address(1), Some("10.1.0.2:8000"));

    // Not due before the interval; then a 500 and a garbage body keep the pool.
    clock.advance(INTERVAL_MS);
    vm.host.callouts.take_sent();
    vm.tick();
    assert_eq!(vm.scraped_addresses(), ["10.1.0.1:8000", "10.1.0.2:8000"]);
    for (status, body) in [(Some("500"), "oops"), (Some("200"), "<html>"), (None, "")] {
        clock.advance(1000);
        vm.host.callouts.take_sent();
        vm.tick();
        let call = vm.host.callouts.sent.borrow().last().unwrap().clone();
        assert_eq!(call.cluster, "k8s");
        assert_eq!(
            vm.deliver(call.token, status, body),
            CalloutOutcome::Discovered { changed: false }
        );
        assert_eq!(vm.slot.data.pool().len(), 2, "{status:?} {body}");
    }
}

const CAPPED: &str = "pool:
  refreshMetricsInterval: 50ms
  maxMetricsBytes: 4096
  endpoints: [{address: '10.0.0.1:8000'}, {address: '10.0.0.2:8000'}, {address: '10.0.0.3:8000'}]
";

/// A real-looking page of `bytes` bytes: the engine's series first, then filler series.
fn page_of(bytes: usize) -> String {
    let mut page = String::from("vllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.5\n");
    while page.len() < bytes {
        page.push_str("vllm:filler_total{le=\"0.5\"} 1\n");
    }
    page.truncate(bytes.saturating_sub(1));
    page.push('\n');
    page
}

#[test]
fn a_page_over_max_metrics_bytes_is_a_failed_scrape_and_never_read() {
    let (shared, clock) = (Rc::<FakeShared>::default(), Rc::<FakeClock>::default());
    let mut vm = Vm::new(CAPPED, 1, &shared, &clock);
    vm.tick();
    let at_cap = page_of(4096);
    assert_eq!(at_cap.len(), 4096);
    assert_eq!(
        vm.answer("10.0.0.1:8000", Some("200"), &at_cap),
        CalloutOutcome::Scraped {
            index: 0,
            scraped: Scraped::Ok
        },
        "exactly the cap is fine"
    );
    let read_so_far = vm.host.callouts.body_bytes_read.get();
    assert_eq!(read_so_far, 4096);
    let over = page_of(4097);
    assert_eq!(
        vm.answer("10.0.0.2:8000", Some("200"), &over),
        CalloutOutcome::Scraped {
            index: 1,
            scraped: Scraped::Oversized
        }
    );
    assert_eq!(
        vm.host.callouts.body_bytes_read.get(),
        read_so_far,
        "the body over the cap was never copied into the VM"
    );
    assert_eq!(vm.health(1), Health::Unreachable);
    assert_eq!(vm.health(0), Health::Fresh, "the other pods keep routing");
    vm.answer(
        "10.0.0.3:8000",
        Some("200"),
        "vllm:num_requests_waiting 0\n",
    );
    let request = crate::request::InferenceRequest::empty();
    let slot = &mut vm.slot;
    let routed = slot
        .director
        .route_parsed(&mut slot.data, &request)
        .unwrap();
    assert_ne!(routed.destination, "10.0.0.2:8000");
}

#[test]
fn an_oversized_pod_is_warned_about_once_until_it_recovers() {
    let (shared, clock) = (Rc::<FakeShared>::default(), Rc::<FakeClock>::default());
    let mut vm = Vm::new(CAPPED, 1, &shared, &clock);
    let huge = page_of(1 << 20);
    let scrape_round = |vm: &mut Vm, page_for_pod_2: &str| {
        vm.host.callouts.take_sent();
        clock.advance(INTERVAL_MS);
        vm.tick();
        for (address, page) in [
            ("10.0.0.1:8000", huge.as_str()),
            ("10.0.0.2:8000", page_for_pod_2),
            ("10.0.0.3:8000", "vllm:num_requests_waiting 0\n"),
        ] {
            // A failing pod is probed with back-off: not every round sends to it.
            if let Some(token) = vm.host.callouts.token_for(address) {
                vm.deliver(token, Some("200"), page);
            }
        }
    };
    for _ in 0..5 {
        scrape_round(&mut vm, &huge);
    }
    assert_eq!(
        vm.slot.data.oversize_warnings(),
        2,
        "one per oversized pod, not one per pod per tick"
    );
    clock.advance(MAX_PROBE_BACKOFF_MS);
    scrape_round(&mut vm, "vllm:num_requests_waiting 0\n");
    assert_eq!(vm.health(1), Health::Fresh, "back within the cap: routable");
    assert_eq!(vm.slot.data.oversize_warnings(), 2);
    scrape_round(&mut vm, &huge);
    assert_eq!(
        vm.slot.data.oversize_warnings(),
        3,
        "oversized again after recovering: said again"
    );
    assert_eq!(vm.health(0), Health::Unreachable);
}

#[test]
fn answers_to_unknown_calls_are_ignored() {
    let (shared, clock) = (Rc::<FakeShared>::default(), Rc::<FakeClock>::default());
    let mut vm = Vm::new(POOL, 1, &shared, &clock);
    assert_eq!(vm.deliver(999, Some("200"), "x"), CalloutOutcome::Unknown);
}

#[test]
fn configure_loads_or_says_why_not() {
    let configured = configure(POOL.as_bytes(), 7).unwrap();
    assert_eq!(configured.tick_ms, 50);
    assert_eq!(configured.router.slot(0).unwrap().data.pool().len(), 3);
    assert_eq!(configured.ticks[0].stats_prefix, "inference_picker");
    assert!(configure(b"\xff\xfe", 7).err().unwrap().contains("UTF-8"));
    assert!(configure(b"pool: {endpoints: nope}", 7).is_err());
}

#[test]
fn many_pools_tick_at_the_shortest_interval_each_with_its_own_lease() {
    let text = "
pools:
- name: llama
  models: [llama-3]
  endpoints: [{address: 10.0.0.1:8000}]
- name: qwen
  models: [qwen-*]
  refreshMetricsInterval: 20ms
  endpoints: [{address: 10.0.1.1:8000}, {address: 10.0.1.2:8000}]
";
    let configured = configure(text.as_bytes(), 7).unwrap();
    assert_eq!(configured.tick_ms, 20);
    assert_eq!(configured.router.len(), 2);
    assert_eq!(configured.router.slot(1).unwrap().data.pool().len(), 2);
    let [llama, qwen] = &configured.ticks[..] else {
        panic!("two pools");
    };
    assert_eq!((llama.interval_ms, qwen.interval_ms), (50, 20));
    assert_eq!(qwen.stats_prefix, "inference_picker.pool.qwen");
    let namespace = |t: &PoolTicks| {
        t.driver
            .coordinator()
            .unwrap()
            .keys()
            .namespace()
            .to_owned()
    };
    assert_ne!(
        namespace(llama),
        namespace(qwen),
        "each pool elects its own scraper"
    );
    assert!(namespace(qwen).ends_with("/qwen"));
}

mod models;

/// Ticks `vm` every interval for `ms`, answering each scrape at once with an empty queue;
/// returns how many scrapes it sent.
fn run_idle(vm: &mut Vm, clock: &FakeClock, ms: u64) -> usize {
    let mut sent = 0;
    for _ in 0..ms / INTERVAL_MS {
        clock.advance(INTERVAL_MS);
        vm.tick();
        for call in vm.host.callouts.take_sent() {
            sent += 1;
            vm.deliver(call.token, Some("200"), "vllm:num_requests_waiting 0\n");
        }
    }
    sent
}

#[test]
fn an_idle_pool_is_scraped_every_idle_interval_and_its_next_request_brings_every_pod_back() {
    let (shared, clock) = (Rc::<FakeShared>::default(), Rc::<FakeClock>::default());
    let mut vm = Vm::new(POOL, 1, &shared, &clock);
    vm.tick();
    // The first seconds count as in use: every pod every interval.
    assert_eq!(run_idle(&mut vm, &clock, 1000), 3 * 20);
    run_idle(&mut vm, &clock, crate::datalayer::IDLE_AFTER_MS);
    // Idle: each pod once a second (`idleRefreshMetricsInterval`), and still fresh.
    assert_eq!(run_idle(&mut vm, &clock, 2000), 3 * 2);
    assert!((0..3).all(|i| vm.health(i) == Health::Fresh));

    // A request placed on pod 2: the next tick scrapes every pod, and every interval after.
    vm.slot.data.add_in_flight(1, 100);
    clock.advance(INTERVAL_MS);
    vm.tick();
    let woken = vm.host.callouts.take_sent();
    assert_eq!(woken.len(), 3);
    for call in woken {
        vm.deliver(call.token, Some("200"), "vllm:num_requests_waiting 0\n");
    }
    vm.slot.data.end_in_flight(1, 100);
    assert_eq!(run_idle(&mut vm, &clock, 1000), 3 * 20);
}

/// A scraper and a worker VM; each second for twice [`crate::datalayer::IDLE_AFTER_MS`] the
/// worker uses the pool as `use_pool` says (never with a request in flight at a tick). Returns
/// the scrapes the scraper sends in the second after.
fn scrapes_while_another_vm_uses_the_pool(use_pool: impl Fn(&mut Vm)) -> usize {
    let (shared, clock) = (Rc::<FakeShared>::default(), Rc::<FakeClock>::default());
    let mut scraper = Vm::new(POOL, 1, &shared, &clock);
    let mut worker = Vm::new(POOL, 2, &shared, &clock);
    scraper.tick();
    worker.tick();
    for _ in 0..(crate::datalayer::IDLE_AFTER_MS * 2 / 1000) {
        use_pool(&mut worker);
        run_idle(&mut scraper, &clock, 1000);
    }
    run_idle(&mut scraper, &clock, 1000)
}

#[test]
fn a_pool_whose_requests_another_vm_places_is_not_idle() {
    // Its placements reach the scraper through the shared batches.
    let scrapes = scrapes_while_another_vm_uses_the_pool(|worker| {
        let placed = crate::scheduling::LearnedPrefix {
            endpoint: 0,
            hashes: vec![1, 2, 3],
        };
        let coordinator = worker.flow.coordinator.as_mut().unwrap();
        coordinator
            .exchange_prefixes(&worker.host, &[placed])
            .unwrap();
    });
    assert_eq!(scrapes, 3 * 20);
}

#[test]
fn a_pool_that_says_so_is_scraped_at_one_pace_always() {
    let config = POOL.replace(
        "refreshMetricsInterval: 50ms",
        "refreshMetricsInterval: 50ms\n  idleRefreshMetricsInterval: 50ms",
    );
    let (shared, clock) = (Rc::<FakeShared>::default(), Rc::<FakeClock>::default());
    let mut vm = Vm::new(&config, 1, &shared, &clock);
    vm.tick();
    run_idle(&mut vm, &clock, crate::datalayer::IDLE_AFTER_MS + 1000);
    assert_eq!(run_idle(&mut vm, &clock, 1000), 3 * 20);
}

#[test]
fn a_pool_whose_short_requests_another_vm_routes_without_prefixes_is_not_idle() {
    // Each request starts and ends between two ticks, and no scorer shares a placement: only
    // the worker's count of placed requests, in its published load, says the pool is used.
    let scrapes = scrapes_while_another_vm_uses_the_pool(|worker| {
        worker.slot.data.add_in_flight(0, 10);
        worker.slot.data.end_in_flight(0, 10);
        worker.tick();
    });
    assert_eq!(scrapes, 3 * 20);
}
