//! `models-data-source` across two VMs: the scraper asks each pod, the others read the lists.

use super::*;
use crate::harness::test;

const LEARNING_POOL: &str = "featureGates: [dataLayer]
plugins:
- type: queue-scorer
- type: max-score-picker
- type: models-data-source
  parameters: {refreshInterval: 1s}
pool:
  refreshMetricsInterval: 50ms
  endpoints: [{address: '10.0.0.1:8000'}, {address: '10.0.0.2:8000'}]
";

/// Tokens of the `/v1/models` calls a VM sent, by address.
fn model_calls(vm: &Vm) -> Vec<(u32, String)> {
    vm.host
        .callouts
        .sent
        .borrow()
        .iter()
        .filter(|call| {
            call.headers
                .iter()
                .any(|(n, v)| n == ":path" && v == "/v1/models")
        })
        .map(|call| {
            let authority = call.authority().unwrap_or_default().to_owned();
            (call.token, authority)
        })
        .collect()
}

/// A scraper and a follower over one shared store, each ticked once.
fn two_vms_ticked() -> (Vm, Vm, Rc<FakeClock>) {
    let (shared, clock) = (Rc::<FakeShared>::default(), Rc::<FakeClock>::default());
    let mut a = Vm::new(LEARNING_POOL, 1, &shared, &clock);
    let mut b = Vm::new(LEARNING_POOL, 2, &shared, &clock);
    a.tick();
    b.tick();
    (a, b, clock)
}

#[test]
fn the_scraper_learns_each_pods_models_and_the_others_read_them() {
    let (mut a, mut b, clock) = two_vms_ticked();
    let calls = model_calls(&a);
    assert_eq!(calls.len(), 2, "one /v1/models call per pod");
    assert!(model_calls(&b).is_empty(), "the follower asks no pod");
    let lists = [
        r#"{"object":"list","data":[{"id":"llama"},{"id":"sql-lora","parent":"llama"}]}"#,
        r#"{"object":"list","data":[{"id":"llama"}]}"#,
    ];
    for ((token, _), body) in calls.iter().zip(lists) {
        a.deliver(*token, Some("200"), body);
    }
    assert_eq!(a.slot.data.models().served(), ["llama", "sql-lora"]);
    let outcome = b.tick();
    assert!(outcome.models_changed);
    assert_eq!(b.slot.data.models().served(), ["llama", "sql-lora"]);
    assert!(!b.tick().models_changed, "read once per change");
    // No new round before refreshInterval; then the adapter is unloaded on the first pod.
    clock.advance(500);
    a.tick();
    assert_eq!(model_calls(&a).len(), 2);
    clock.advance(600);
    a.tick();
    let calls = model_calls(&a);
    assert_eq!(calls.len(), 4);
    let (token, _) = calls[2].clone();
    let changed = a.deliver(token, Some("200"), lists[1]);
    assert_eq!(changed, CalloutOutcome::Models { changed: true });
    assert_eq!(a.slot.data.models().served(), ["llama"]);
    // A pod that cannot answer keeps what it reported; a page that is not a list is ignored.
    let (token, _) = calls[3].clone();
    assert_eq!(
        a.deliver(token, Some("503"), ""),
        CalloutOutcome::Models { changed: false }
    );
    assert!(b.tick().models_changed);
    assert_eq!(b.slot.data.models().served(), ["llama"]);
}

#[test]
fn each_answer_is_read_only_as_far_as_the_core_uses_it() {
    let (shared, clock) = (Rc::<FakeShared>::default(), Rc::<FakeClock>::default());
    let mut vm = Vm::new(LEARNING_POOL, 1, &shared, &clock);
    vm.tick();
    let (models_call, _) = model_calls(&vm)[0].clone();
    let scrape = vm.host.callouts.token_for("10.0.0.1:8000").unwrap();
    assert_ne!(scrape, models_call);
    let body_cap = |vm: &Vm, token| vm.slot.data.body_cap(token);
    assert_eq!(body_cap(&vm, scrape), Some(4 << 20), "pool.maxMetricsBytes");
    assert_eq!(
        body_cap(&vm, models_call),
        Some(crate::datalayer::MAX_MODELS_BYTES)
    );
    vm.deliver(scrape, Some("200"), "vllm:num_requests_waiting 0\n");
    assert_eq!(
        body_cap(&vm, scrape),
        None,
        "answered: no longer this pool's"
    );
    let mut discovering = Vm::new(DISCOVERED, 2, &Rc::default(), &clock);
    discovering.tick();
    let call = discovering.host.callouts.take_sent().pop().unwrap();
    assert_eq!(body_cap(&discovering, call.token), Some(usize::MAX));
}

#[test]
fn every_pods_list_reaches_the_other_vms_even_when_the_pool_serves_the_same_models() {
    let (mut a, mut b, _clock) = two_vms_ticked();
    let calls = model_calls(&a);
    // The pod listing more answers first; the second adds nothing to the pool's models.
    a.deliver(
        calls[0].0,
        Some("200"),
        r#"{"data":[{"id":"llama"},{"id":"sql-lora"}]}"#,
    );
    let second = a.deliver(calls[1].0, Some("200"), r#"{"data":[{"id":"llama"}]}"#);
    assert_eq!(second, CalloutOutcome::Models { changed: false });
    assert!(b.tick().models_changed);
    // The other VM knows both pods serve llama, so both are candidates for it there.
    let reported: Vec<(String, Vec<String>)> = b
        .slot
        .data
        .models()
        .reported(b.slot.data.pool())
        .into_iter()
        .map(|(address, models)| (address.to_owned(), models.to_vec()))
        .collect();
    assert_eq!(
        reported,
        [
            (
                "10.0.0.1:8000".to_owned(),
                vec!["llama".to_owned(), "sql-lora".to_owned()]
            ),
            ("10.0.0.2:8000".to_owned(), vec!["llama".to_owned()]),
        ]
    );
}

#[test]
fn a_pod_that_never_answers_its_models_cannot_hold_the_pools_list() {
    let (shared, clock) = (Rc::<FakeShared>::default(), Rc::<FakeClock>::default());
    let mut a = Vm::new(LEARNING_POOL, 1, &shared, &clock);
    a.tick();
    let calls = model_calls(&a);
    a.deliver(calls[0].0, Some("200"), r#"{"data":[{"id":"old"}]}"#);
    a.deliver(calls[1].0, Some("503"), "");
    assert_eq!(a.slot.data.models().served(), ["old"]);
    clock.advance(1100);
    a.tick();
    let calls = model_calls(&a);
    a.deliver(calls[2].0, Some("200"), r#"{"data":[{"id":"new"}]}"#);
    a.deliver(calls[3].0, None, "");
    assert_eq!(
        a.slot.data.models().served(),
        ["new"],
        "the removed model is gone"
    );
}
