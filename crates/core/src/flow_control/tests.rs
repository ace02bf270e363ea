use super::*;
use crate::harness::test;
use crate::host::fake::FakeShared;
use crate::scheduling::flow_policy::{FlowPolicy, Ordering};
use crate::shared_keys::SharedKeys;

fn control(section: &str) -> FlowControl {
    let raw: crate::config::flow_control::RawFlowControl = serde_yaml::from_str(section).unwrap();
    let lookup = |name: &str| match name {
        "rr" => Some(FlowPolicy::Fairness(Fairness::RoundRobin)),
        "edf" => Some(FlowPolicy::Ordering(Ordering::Edf)),
        "slo" => Some(FlowPolicy::Ordering(Ordering::SloDeadline)),
        other => crate::config::flow_control::default_policy(other),
    };
    let mut flow = FlowControl::new(
        crate::config::flow_control::build(&raw, &[], &lookup).unwrap(),
        1,
    );
    flow.attach(SharedKeys::under("ns"), 1);
    flow
}

fn arrival(id: u32, priority: i32, tenant: &str) -> Arrival {
    Arrival {
        id,
        request_id: format!("r{id}"),
        priority,
        fairness_id: tenant.into(),
        bytes: 100,
        slo_ttft_ms: None,
    }
}

/// Dispatches until empty, returning the ids in order.
fn drain(flow: &mut FlowControl, now: u64, store: &FakeShared) -> Vec<u32> {
    let mut order = Vec::new();
    while let Some((_, Pick::Local(id))) = flow.pick(now) {
        flow.dispatch(id, now, store).unwrap();
        order.push(id);
    }
    order
}

#[test]
fn the_highest_band_goes_first_then_arrival_order() {
    let store = FakeShared::default();
    let mut flow = control("priorityBands: [{priority: 10}, {priority: -5}]");
    for (id, priority) in [(1, 0), (2, -5), (3, 10), (4, 0), (5, 10)] {
        flow.admit(arrival(id, priority, "t"), u64::from(id), &store)
            .unwrap();
    }
    assert_eq!(drain(&mut flow, 100, &store), vec![3, 5, 1, 4, 2]);
}

#[test]
fn an_unknown_priority_waits_in_band_zero() {
    let store = FakeShared::default();
    let mut flow = control("priorityBands: [{priority: 10}]");
    flow.admit(arrival(1, 0, "t"), 1, &store).unwrap();
    flow.admit(arrival(2, 3, "t"), 2, &store).unwrap();
    assert_eq!(flow.band_load(), vec![(10, 0, 0), (0, 2, 200)]);
}

#[test]
fn round_robin_gives_a_quiet_tenant_its_turn_and_strict_does_not() {
    let store = FakeShared::default();
    let arrivals = || {
        // "loud" sends ten before "quiet" sends its two.
        let mut all: Vec<Arrival> = (1..=10).map(|id| arrival(id, 0, "loud")).collect();
        all.extend([arrival(11, 0, "quiet"), arrival(12, 0, "quiet")]);
        all
    };
    let mut fair = control("defaultPriorityBand: {fairnessPolicyRef: rr}");
    let mut strict = control("{}");
    for (i, a) in arrivals().into_iter().enumerate() {
        fair.admit(a.clone(), i as u64, &store).unwrap();
        strict.admit(a, i as u64, &store).unwrap();
    }
    let first_four = |order: Vec<u32>| order.into_iter().take(4).collect::<Vec<_>>();
    assert_eq!(first_four(drain(&mut fair, 50, &store)), vec![1, 11, 2, 12]);
    assert_eq!(first_four(drain(&mut strict, 50, &store)), vec![1, 2, 3, 4]);
}

#[test]
fn edf_and_slo_deadline_orderings() {
    let store = FakeShared::default();
    let mut slo = control("defaultPriorityBand: {orderingPolicyRef: slo}");
    assert!(slo.reads_slo_header());
    let with_slo = |id, ms| Arrival {
        slo_ttft_ms: ms,
        ..arrival(id, 0, "t")
    };
    slo.admit(with_slo(1, None), 0, &store).unwrap();
    slo.admit(with_slo(2, Some(5_000)), 1, &store).unwrap();
    slo.admit(with_slo(3, Some(100)), 2, &store).unwrap();
    assert_eq!(drain(&mut slo, 10, &store), vec![3, 2, 1]);
    let mut edf = control("defaultPriorityBand: {orderingPolicyRef: edf}");
    assert!(!edf.reads_slo_header());
    edf.admit(arrival(1, 0, "t"), 5, &store).unwrap();
    edf.admit(arrival(2, 0, "t"), 9, &store).unwrap();
    assert_eq!(
        drain(&mut edf, 10, &store),
        vec![1, 2],
        "one TTL for all: arrival order"
    );
}

#[test]
fn global_and_band_limits_refuse_when_full() {
    let store = FakeShared::default();
    let mut flow =
        control("maxRequests: 3\npriorityBands: [{priority: 1, maxRequests: 1}]\nmaxBytes: 1k");
    flow.admit(arrival(1, 1, "t"), 0, &store).unwrap();
    assert_eq!(
        flow.admit(arrival(2, 1, "t"), 0, &store),
        Err(Dropped::QueueFull),
        "band full"
    );
    flow.admit(arrival(3, 0, "t"), 0, &store).unwrap();
    flow.admit(arrival(4, 0, "t"), 0, &store).unwrap();
    assert_eq!(
        flow.admit(arrival(5, 0, "t"), 0, &store),
        Err(Dropped::QueueFull),
        "global full"
    );
    let store = FakeShared::default();
    let mut bytes = control("maxBytes: 250");
    bytes.admit(arrival(1, 0, "t"), 0, &store).unwrap();
    bytes.admit(arrival(2, 0, "t"), 0, &store).unwrap();
    assert_eq!(
        bytes.admit(arrival(3, 0, "t"), 0, &store),
        Err(Dropped::QueueFull)
    );
    bytes.set_has_endpoints(false, 0);
    assert_eq!(
        bytes.admit(arrival(3, 0, "t"), 0, &store),
        Err(Dropped::QueueFullNoEndpoints)
    );
    bytes.remove(1, 5, &store).unwrap();
    bytes
        .admit(arrival(3, 0, "t"), 5, &store)
        .expect("a leaver frees its place Envoy-wide");
}

#[test]
fn ttls_expire_and_restart_when_the_pool_loses_its_endpoints() {
    let store = FakeShared::default();
    let mut flow = control("defaultRequestTTL: 1s\nnoEndpointRequestTTL: 3s");
    flow.admit(arrival(1, 0, "t"), 0, &store).unwrap();
    flow.admit(arrival(2, 0, "t"), 500, &store).unwrap();
    let expired = flow.expire(1_000, &store);
    assert_eq!(expired.len(), 1);
    assert_eq!(
        (expired[0].0.id, expired[0].1, expired[0].0.waited_ms),
        (1, Dropped::TtlExpired, 1_000)
    );
    flow.set_has_endpoints(false, 1_200);
    assert!(
        flow.expire(4_100, &store).is_empty(),
        "the no-endpoint TTL runs from the change"
    );
    let expired = flow.expire(4_200, &store);
    assert_eq!(
        (expired[0].0.id, expired[0].1),
        (2, Dropped::NoEndpointTtlExpired)
    );
    assert_eq!(flow.local_len(), 0);
    let mut forever = control("defaultRequestTTL: 0s");
    forever.admit(arrival(1, 0, "t"), 0, &store).unwrap();
    assert!(forever.expire(u64::MAX / 2, &store).is_empty());
}

#[test]
fn a_client_that_leaves_takes_its_request_out() {
    let store = FakeShared::default();
    let mut flow = control("{}");
    flow.admit(arrival(1, 0, "t"), 0, &store).unwrap();
    assert_eq!(
        flow.remove(1, 70, &store).map(|left| left.waited_ms),
        Some(70)
    );
    assert!(flow.remove(1, 80, &store).is_none());
    assert!(flow.idle(80));
    assert_eq!(flow.pick(80), None);
}

#[test]
fn other_vms_count_toward_limits_and_can_hold_the_next_request() {
    let store = FakeShared::default();
    let mut other = control("maxRequests: 2");
    other.attach(SharedKeys::under("ns"), 2);
    other.admit(arrival(7, 0, "t"), 10, &store).unwrap();
    other.publish(&store, 10).unwrap();
    let mut here = control("maxRequests: 2");
    here.set_peers(&[2]);
    here.refresh(&store).unwrap();
    assert!(!here.idle(20), "another VM holds one");
    here.admit(arrival(1, 0, "t"), 20, &store).unwrap();
    assert_eq!(
        here.admit(arrival(2, 0, "t"), 20, &store),
        Err(Dropped::QueueFull),
        "two Envoy-wide"
    );
    assert_eq!(
        here.pick(20).map(|p| p.1),
        Some(Pick::Remote(2)),
        "the other VM's is older"
    );
    // The other VM dispatched it and says so; now ours goes.
    other.dispatch(7, 30, &store).unwrap();
    other.publish(&store, 30).unwrap();
    here.refresh(&store).unwrap();
    assert_eq!(here.pick(30).map(|p| p.1), Some(Pick::Local(1)));
    let stale = PUBLISHED_FRESH_MS + 100;
    other.admit(arrival(8, 0, "t"), 40, &store).unwrap();
    other.publish(&store, 40).unwrap();
    here.refresh(&store).unwrap();
    assert_eq!(
        here.pick(40 + stale).map(|p| p.1),
        Some(Pick::Local(1)),
        "a VM gone quiet stops counting"
    );
}

#[test]
fn round_robin_turns_are_shared_across_vms() {
    let store = FakeShared::default();
    let section = "defaultPriorityBand: {fairnessPolicyRef: rr}";
    let mut other = control(section);
    other.attach(SharedKeys::under("ns"), 2);
    other.admit(arrival(7, 0, "a"), 0, &store).unwrap();
    other.dispatch(7, 5, &store).unwrap();
    other.publish(&store, 5).unwrap();
    let mut here = control(section);
    here.set_peers(&[2]);
    here.refresh(&store).unwrap();
    here.admit(arrival(1, 0, "a"), 1, &store).unwrap();
    here.admit(arrival(2, 0, "b"), 2, &store).unwrap();
    assert_eq!(
        here.pick(6).map(|p| p.1),
        Some(Pick::Local(2)),
        "the other VM just served a: b's turn"
    );
}

#[test]
fn publishing_an_empty_queue_happens_once() {
    let store = FakeShared::default();
    let mut flow = control("{}");
    assert!(flow.settled());
    flow.admit(arrival(1, 0, "t"), 0, &store).unwrap();
    flow.publish(&store, 0).unwrap();
    flow.dispatch(1, 1, &store).unwrap();
    assert!(!flow.settled(), "the others still think one waits");
    flow.publish(&store, 1).unwrap();
    assert!(flow.settled());
}
