//! The goals for part 5, per regime of pods, each judged from the rows of the run: a
//! comparison with a missing row is not measured, never met.

use super::{
    Fault, FleetRow, Gateway, Offered, Regime, Setup, CHAT, FLEET, HALF_SATURATED, SATURATED,
    SEEDS, TWO_SLOT,
};
use crate::load::all_of;
use crate::report::goal;

/// The fleet sizes the sweep goals compare with one Envoy.
const COMPARED: [usize; 3] = [2, 4, FLEET];
/// Every offered load of the full run.
const EVERY_LOAD: [Offered; 3] = [SATURATED, HALF_SATURATED, CHAT];

/// What one comparison found: met or not (`None`: a row is missing), and what was measured.
type Outcome = (Option<bool>, String);

pub(super) fn goals(rows: &[FleetRow], regime: &Regime) -> String {
    let mut out = [
        sweep_goal(
            rows,
            regime,
            &[SATURATED, HALF_SATURATED],
            "At 2, 4 and 8 replicas: pods' hit rate >= 97 % of one Envoy's; TTFT p50 and p90 \
             <= 1.1x one Envoy's, at both rates",
        ),
        sweep_goal(
            rows,
            regime,
            &[CHAT],
            "At 2, 4 and 8 replicas: pods' hit rate >= 97 % of one Envoy's; TTFT p50 and p90 \
             <= 1.1x one Envoy's",
        ),
        scrape_goal(rows, regime),
        cpu_goal(rows, regime),
        killed_goal(rows, regime),
        central_goal(rows, regime),
    ]
    .concat();
    if *regime == TWO_SLOT {
        out += &contended_goal(rows, regime);
    }
    out
}

/// The goal line: met only if every outcome is.
fn judged(text: &str, outcomes: Vec<Outcome>) -> String {
    let verdict = all_of(outcomes.iter().map(|(v, _)| *v));
    let measured: Vec<String> = outcomes.into_iter().map(|(_, m)| m).collect();
    goal(text, verdict, &measured.join("; "))
}

fn find<'a>(rows: &'a [FleetRow], setup: &Setup) -> Option<&'a FleetRow> {
    rows.iter().find(|row| row.setup == *setup)
}

/// `test(baseline, candidate)` on the two rows, described as the candidate's.
fn compare(
    rows: &[FleetRow],
    baseline: Setup,
    candidate: Setup,
    test: &dyn Fn(&FleetRow, &FleetRow) -> (bool, String),
) -> Outcome {
    let at = candidate.label();
    match (find(rows, &baseline), find(rows, &candidate)) {
        (Some(baseline), Some(candidate)) => {
            let (met, text) = test(baseline, candidate);
            (Some(met), format!("{at}: {text}"))
        }
        _ => (None, format!("{at}: not measured")),
    }
}

/// "{regime} pods, shared prefix at 60 and 30 req/s, seeds 11 and 12: ..."
fn context(regime: &Regime, loads: &[Offered]) -> String {
    let mut by_workload: Vec<(&str, Vec<String>)> = Vec::new();
    for load in loads {
        let rate = format!("{}", load.rate);
        match by_workload.iter_mut().find(|(w, _)| *w == load.workload) {
            Some((_, rates)) => rates.push(rate),
            None => by_workload.push((load.workload, vec![rate])),
        }
    }
    let loads: Vec<String> = by_workload
        .into_iter()
        .map(|(workload, rates)| format!("{workload} at {} req/s", rates.join(" and ")))
        .collect();
    let seeds: Vec<String> = SEEDS.iter().map(u64::to_string).collect();
    format!(
        "{} pods, {}, seeds {}",
        regime.name,
        loads.join(", "),
        seeds.join(" and ")
    )
}

/// Every (seed, load) of the goal, with the one-Envoy peers row.
fn each_load(regime: &Regime, loads: &[Offered]) -> Vec<Setup> {
    SEEDS
        .iter()
        .flat_map(|&seed| {
            loads
                .iter()
                .map(move |&load| Setup::sweep(*regime, load, seed, 1))
        })
        .collect()
}

fn sweep_goal(rows: &[FleetRow], regime: &Regime, loads: &[Offered], text: &str) -> String {
    let near_one = |one: &FleetRow, fleet: &FleetRow| {
        let met = fleet.hit_rate >= 0.97 * one.hit_rate
            && fleet.ttft.p50 <= 1.1 * one.ttft.p50
            && fleet.ttft.p90 <= 1.1 * one.ttft.p90;
        (met, hit_and_ttft(fleet, one, "one Envoy"))
    };
    let outcomes = each_load(regime, loads)
        .into_iter()
        .flat_map(|one| {
            COMPARED.iter().map(move |&replicas| {
                let fleet = Setup { replicas, ..one };
                compare(rows, one, fleet, &near_one)
            })
        })
        .collect();
    judged(&format!("{}: {text}", context(regime, loads)), outcomes)
}

/// "hit 85.1 % vs 86.0 %, p50 20 vs 19 ms, p90 180 vs 175 ms" against `other`.
fn hit_and_ttft(row: &FleetRow, other: &FleetRow, name: &str) -> String {
    format!(
        "hit {:.1} % vs {:.1} %, p50 {:.1} vs {:.1} ms, p90 {:.1} vs {:.1} ms ({name})",
        row.hit_rate * 100.0,
        other.hit_rate * 100.0,
        row.ttft.p50,
        other.ttft.p50,
        row.ttft.p90,
        other.ttft.p90
    )
}

fn scrape_goal(rows: &[FleetRow], regime: &Regime) -> String {
    let scrapes = |one: &FleetRow, fleet: &FleetRow| {
        (
            fleet.scrapes_per_pod_second <= 1.1 * one.scrapes_per_pod_second,
            format!(
                "{:.1} vs {:.1} scrapes per pod per s",
                fleet.scrapes_per_pod_second, one.scrapes_per_pod_second
            ),
        )
    };
    let outcomes = each_load(regime, &EVERY_LOAD)
        .into_iter()
        .map(|one| {
            compare(
                rows,
                one,
                Setup {
                    replicas: FLEET,
                    ..one
                },
                &scrapes,
            )
        })
        .collect();
    judged(
        &format!(
            "{}: Scrapes per pod per second at 8 replicas <= 1.1x one Envoy's, counted at the pods",
            context(regime, &EVERY_LOAD)
        ),
        outcomes,
    )
}

fn cpu_goal(rows: &[FleetRow], regime: &Regime) -> String {
    let outcomes = each_load(regime, &EVERY_LOAD)
        .into_iter()
        .map(|one| {
            let fleet = Setup {
                replicas: FLEET,
                ..one
            };
            let central = fleet.through(Gateway::CentralExtProc);
            let at = fleet.label();
            match (find(rows, &one), find(rows, &fleet), find(rows, &central)) {
                (Some(one), Some(fleet), Some(central)) => {
                    let cpu = fleet.cpu_ms_per_request;
                    (
                        Some(cpu <= 1.3 * one.cpu_ms_per_request && cpu <= central.cpu_ms_per_request),
                        format!(
                            "{at}: {cpu:.2} ms per request vs {:.2} (one Envoy) and {:.2} (central), \
                             sync {:.1} requests and {:.1} KB per replica per s",
                            one.cpu_ms_per_request,
                            central.cpu_ms_per_request,
                            fleet.sync_requests_per_replica_second,
                            fleet.sync_kb_per_replica_second
                        ),
                    )
                }
                _ => (None, format!("{at}: not measured")),
            }
        })
        .collect();
    judged(
        &format!(
            "{}: Fleet CPU per request at 8 replicas <= 1.3x one Envoy's, and at most the central \
             design's (8 Envoys + the ext_proc picker, the picker process's CPU counted too) in \
             the same run; sync traffic per replica stated",
            context(regime, &EVERY_LOAD)
        ),
        outcomes,
    )
}

fn killed_goal(rows: &[FleetRow], regime: &Regime) -> String {
    let outcomes = SEEDS
        .iter()
        .map(|&seed| {
            let killed = Setup::sweep(*regime, SATURATED, seed, FLEET).with_fault(Fault::PeerKilled);
            let at = killed.label();
            match find(rows, &killed).and_then(|row| Some((row, row.recovery?))) {
                Some((row, recovery)) => {
                    let back = recovery.back_after_s;
                    let met = row.errors == 0 && back.is_some_and(|s| s <= 2.0);
                    let back = back.map_or("never".into(), |s| format!("after {s:.2} s"));
                    (
                        Some(met),
                        format!(
                            "{at}: {} failed, hit rate {:.1} %, worst window {:.1} %, back within 2 points {back}",
                            row.errors,
                            row.hit_rate * 100.0,
                            recovery.worst_window * 100.0
                        ),
                    )
                }
                None => (None, format!("{at}: not measured")),
            }
        })
        .collect();
    judged(
        &format!(
            "{}, {FLEET} replicas: Peer killed mid-run: 0 failed requests; hit rate back within 2 \
             points of the run's mean within 2 s",
            context(regime, &[SATURATED])
        ),
        outcomes,
    )
}

fn central_goal(rows: &[FleetRow], regime: &Regime) -> String {
    let outcomes = each_load(regime, &EVERY_LOAD)
        .into_iter()
        .flat_map(|one| {
            let fleet = Setup {
                replicas: FLEET,
                ..one
            };
            [Gateway::CentralExtProc, Gateway::SglangCacheAware].map(|gateway| {
                let no_worse = move |central: &FleetRow, fleet: &FleetRow| {
                    // Within 2 points below; a higher hit rate is no worse.
                    let met = fleet.hit_rate >= central.hit_rate - 0.02
                        && fleet.ttft.p50 <= central.ttft.p50
                        && fleet.ttft.p90 <= central.ttft.p90;
                    (met, hit_and_ttft(fleet, central, gateway.name()))
                };
                compare(rows, fleet.through(gateway), fleet, &no_worse)
            })
        })
        .collect();
    judged(
        &format!(
            "{}: 8 replicas against one central picker on the same pods (the ext_proc row, and \
             SGLang `cache_aware` as one router): hit rate within 2 points, TTFT p50 and p90 no worse",
            context(regime, &EVERY_LOAD)
        ),
        outcomes,
    )
}

/// One Envoy with a CPU hog beside it against the same Envoy alone, per seed.
fn contended_goal(rows: &[FleetRow], regime: &Regime) -> String {
    let contended = |alone: &FleetRow, contended: &FleetRow| {
        let drop = (alone.hit_rate - contended.hit_rate) * 100.0;
        (
            drop <= 5.0,
            format!(
                "hit {:.1} % with the hog vs {:.1} % without",
                contended.hit_rate * 100.0,
                alone.hit_rate * 100.0
            ),
        )
    };
    let outcomes = SEEDS
        .iter()
        .map(|&seed| {
            let alone = Setup::sweep(*regime, SATURATED, seed, 1);
            compare(rows, alone, alone.with_fault(Fault::CpuHog), &contended)
        })
        .collect();
    judged(
        &format!(
            "{}, one Envoy, a CPU hog beside it: hit rate drops by no more than 5 points",
            context(regime, &[SATURATED])
        ),
        outcomes,
    )
}

#[cfg(test)]
mod tests {
    use super::super::{plan, Recovery, BATCHING, FULL};
    use super::*;
    use crate::load::Percentiles;

    /// The same figures on every row; a fleet change recovered within a second.
    fn alike(setup: &Setup) -> FleetRow {
        let changes = matches!(setup.fault, Fault::PeerKilled | Fault::ReplicaJoining);
        FleetRow {
            setup: *setup,
            ttft: Percentiles {
                p50: 20.0,
                p90: 100.0,
                p99: 200.0,
            },
            errors: 0,
            hit_rate: 0.85,
            recovery: changes.then_some(Recovery {
                worst_window: 0.84,
                back_after_s: Some(1.0),
            }),
            pods_per_group: 1.0,
            busiest_over_mean: 1.1,
            full_pod_share: 0.1,
            scrapes_per_pod_second: 20.0,
            sync_requests_per_replica_second: 70.0,
            sync_kb_per_replica_second: 3.0,
            cpu_ms_per_request: 2.0,
        }
    }

    fn verdicts(text: &str) -> [usize; 3] {
        ["**met**", "**not met**", "**not measured**"].map(|v| text.matches(v).count())
    }

    #[test]
    fn a_full_run_of_equal_rows_meets_every_goal_and_a_missing_row_is_not_measured() {
        let rows: Vec<FleetRow> = plan(&FULL).iter().map(alike).collect();
        let two_slot = goals(&rows, &TWO_SLOT);
        println!("{two_slot}");
        assert_eq!(verdicts(&two_slot), [7, 0, 0], "{two_slot}");
        assert_eq!(verdicts(&goals(&rows, &BATCHING)), [6, 0, 0]);
        let without_central: Vec<FleetRow> = rows
            .iter()
            .filter(|r| r.setup.gateway != Gateway::CentralExtProc)
            .cloned()
            .collect();
        // The CPU goal and the central goal need the ext_proc rows.
        assert_eq!(verdicts(&goals(&without_central, &TWO_SLOT)), [5, 0, 2]);
    }

    #[test]
    fn a_killed_peer_that_fails_requests_or_recovers_late_is_not_met() {
        let mut rows: Vec<FleetRow> = plan(&FULL).iter().map(alike).collect();
        let killed = rows
            .iter_mut()
            .find(|r| r.setup.fault == Fault::PeerKilled)
            .expect("a killed row");
        killed.recovery = Some(Recovery {
            worst_window: 0.5,
            back_after_s: Some(2.5),
        });
        let text = killed_goal(&rows, &TWO_SLOT);
        assert!(text.contains("**not met**"), "{text}");
    }
}
